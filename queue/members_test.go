package queue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// An instance's members row, written every beat and read by every other
// instance, holds the follow streams of at most MemberFollowersMax queues,
// the most followed, however many queues its clients follow (names of up
// to 255 bytes each).
func TestMembers_FollowersRowKeepsTheMostFollowedQueues(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	many := map[string]int{"top": 7}
	for i := range queue.MemberFollowersMax + 50 {
		many[fmt.Sprintf("q%05d", i)] = 1
	}
	_, _, err := s.BeatMember(ctx, queue.Member{ID: "a", Session: "sa", StartedAt: time.Now(), Followers: many})
	require.NoError(t, err)
	others, _, err := s.BeatMember(ctx, queue.Member{ID: "b", Session: "sb", StartedAt: time.Now()})
	require.NoError(t, err)
	require.Len(t, others, 1)
	assert.Equal(t, queue.MemberFollowersMax, len(others[0].Followers), "at most MemberFollowersMax queues")
	assert.Equal(t, 7, others[0].Followers["top"], "the most followed kept")
	assert.Equal(t, queue.MemberFollowersMax+51, len(many), "the caller's map left alone")
}
