package queue_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The poller reads the store's partition-id cache and notes the ids its
// pre-flights read: a noted entry is as good as one a push resolved (a
// later push needs no lookup), and nothing is noted for a queue whose
// settings (and so its id) are not cached.
func TestStore_PartitionIDCacheForThePoller(t *testing.T) {
	s := newStore(t)
	res := push(t, s, "pc", "p1", map[string]int{"n": 1})
	pid := res[0].PartitionID
	require.NotEmpty(t, pid)
	got, ok := s.CachedPartitionID("pc", "p1")
	assert.True(t, ok, "a push caches its partition")
	assert.Equal(t, pid, got)
	_, ok = s.CachedPartitionID("pc", "p2")
	assert.False(t, ok)

	s.ForgetPartition("pc", "p1")
	_, ok = s.CachedPartitionID("pc", "p1")
	require.False(t, ok)
	s.NotePartitionID("pc", "p1", pid)
	got, ok = s.CachedPartitionID("pc", "p1")
	assert.True(t, ok, "noted")
	assert.Equal(t, pid, got)
	stats := s.QueryStats()
	before := stats.Snapshot()
	res = push(t, s, "pc", "p1", map[string]int{"n": 2})
	assert.Equal(t, pid, res[0].PartitionID)
	assert.Equal(t, before["resolve_partitions"], stats.Snapshot()["resolve_partitions"], "the noted id served the push")

	s.ForgetQueue("pc")
	s.NotePartitionID("pc", "p1", pid)
	_, ok = s.CachedPartitionID("pc", "p1")
	assert.False(t, ok, "no queue id known: nothing noted")
	before = stats.Snapshot()
	push(t, s, "pc", "p1", map[string]int{"n": 3})
	assert.Greater(t, stats.Snapshot()["resolve_partitions"], before["resolve_partitions"], "a miss costs the lookup")
}
