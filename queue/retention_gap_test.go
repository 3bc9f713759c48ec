package queue_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// Completed retention deletes a message every group
// finished out of order; a seek back over it (or a group reset) must count
// its offset as finished, or the group waits for it forever (retention
// records the offset in message_holes, which seeks and resets read).
func TestSeek_OverACompletedRetentionGap(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	completedRetentionGap(t, s)
	var err error
	var res *queue.PopResult

	for _, how := range []string{"seek", "reset"} {
		if how == "seek" {
			_, err = s.Seek(ctx, "g", "cr", "", new(time.Time))
		} else {
			_, err = s.DeleteGroup(ctx, "g", "cr", false)
		}
		require.NoError(t, err, how)
		res = pop(t, s, queue.PopRequest{Queue: "cr", Group: "g", Batch: 10})
		assert.Equal(t, []int{1, 3}, payloads(t, res.Messages), how)
		for _, r := range ackAll(t, s, res, queue.StatusCompleted) {
			require.True(t, r.Success, r.Error)
		}
		var cursor int64
		require.NoError(t, s.Pool().QueryRow(ctx, `SELECT cursor FROM consumers WHERE consumer_group = 'g'`).Scan(&cursor))
		assert.EqualValues(t, 3, cursor, "%s: the cursor passes the deleted offset", how)
	}
	push(t, s, "cr", "", nums(4, 4)...)
	res = pop(t, s, queue.PopRequest{Queue: "cr", Group: "g", Batch: 10, AutoAck: true})
	assert.Equal(t, []int{4}, payloads(t, res.Messages), "not waiting for offset 2")
}

// completedRetentionGap leaves queue "cr" with offsets 1 and 3 stored and
// offset 2 deleted by completed retention (group g finished it out of
// order).
func completedRetentionGap(t *testing.T, s *queue.Store) {
	t.Helper()
	ctx := ctxT(t)
	completedRetentionReady(t, s)
	_, ran, err := s.RunRetention(ctx, 0)
	require.NoError(t, err)
	require.True(t, ran)
	var left int
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT count(*) FROM messages`).Scan(&left))
	require.Equal(t, 2, left, "offset 2, finished out of order, is gone")
}

// A group registered after completed
// retention took a message from the middle of a partition took only the
// recorded holes (message_holes) as finished, and retention records none:
// it waited on the missing offset forever. Retention now records the
// offsets it takes above a partition's first remaining message there, in
// the transaction that deletes them.
func TestRegister_AfterACompletedRetentionGap(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	completedRetentionGap(t, s)
	res := pop(t, s, queue.PopRequest{Queue: "cr", Group: "late", Batch: 10})
	assert.Equal(t, []int{1, 3}, payloads(t, res.Messages))
	for _, r := range ackAll(t, s, res, queue.StatusCompleted) {
		require.True(t, r.Success, r.Error)
	}
	var cursor int64
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT cursor FROM consumers WHERE consumer_group = 'late'`).Scan(&cursor))
	assert.EqualValues(t, 3, cursor, "the cursor passes the deleted offset")
	lags, _, err := s.GroupPartitions(ctx, "late", "cr")
	require.NoError(t, err)
	require.Len(t, lags, 1)
	assert.Zero(t, lags[0].OffsetLag, "nothing left for the late group")
	push(t, s, "cr", "", nums(4, 4)...)
	res = pop(t, s, queue.PopRequest{Queue: "cr", Group: "late", Batch: 10, AutoAck: true})
	assert.Equal(t, []int{4}, payloads(t, res.Messages), "not waiting for offset 2")
}
