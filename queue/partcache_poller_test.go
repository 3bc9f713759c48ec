package queue_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// The poller reads the store's partition-id cache and notes the ids its
// pre-flights read (the queue's id with the partition's, so that the entry
// never pairs ids of two incarnations of a queue): a noted entry is as good
// as one a push resolved (a later push needs no lookup); a miss costs the
// lookup.
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
	// Both directions are one cache: the push filled the reverse index too.
	stats := s.QueryStats()
	names, err := s.PartitionNames(t.Context(), []string{pid})
	require.NoError(t, err)
	assert.Equal(t, queue.PartitionName{Queue: "pc", Partition: "p1"}, names[pid])
	assert.Zero(t, stats.Snapshot()["partition_names"], "names of a partition the push resolved: no query")

	info, ok := s.CachedConfig("pc")
	require.True(t, ok)
	s.ForgetQueue("pc")
	_, ok = s.CachedPartitionID("pc", "p1")
	require.False(t, ok)
	av, err := s.Preflight(t.Context(), []queue.Target{{Queue: "pc", Want: 1}})
	require.NoError(t, err)
	require.NotEmpty(t, av)
	assert.Equal(t, info.ID, av[0].QueueID, "the pre-flight reads the queue's id")
	s.NotePartitionID("pc", "p1", av[0].QueueID, pid)
	got, ok = s.CachedPartitionID("pc", "p1")
	assert.True(t, ok, "noted")
	assert.Equal(t, pid, got)
	before := stats.Snapshot()
	res = push(t, s, "pc", "p1", map[string]int{"n": 2})
	assert.Equal(t, pid, res[0].PartitionID)
	assert.Equal(t, before["resolve_partitions"], stats.Snapshot()["resolve_partitions"], "the noted id served the push")

	s.ForgetPartition("pc", "p1")
	before = stats.Snapshot()
	push(t, s, "pc", "p1", map[string]int{"n": 3})
	assert.Greater(t, stats.Snapshot()["resolve_partitions"], before["resolve_partitions"], "a miss costs the lookup")
}

// A cached partition id is trusted for PartitionCacheTTL, then looked up
// again; the cache expires entries as they are read, with no goroutine or
// timer of its own (an idle instance wakes for nothing): in a synctest
// bubble the Store leaves nothing running, and fake time ends the entry.
func TestStore_PartitionIDExpiresWithoutATimerOfItsOwn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := queue.New(queue.Config{Pool: &pgxpool.Pool{}, InstanceID: "ttl"})
		require.NoError(t, err)
		s.NotePartitionID("q", "p", "qid", "pid")
		time.Sleep(queue.PartitionCacheTTL - time.Second)
		got, ok := s.CachedPartitionID("q", "p")
		require.True(t, ok, "within its time")
		assert.Equal(t, "pid", got)
		time.Sleep(2 * time.Second)
		_, ok = s.CachedPartitionID("q", "p")
		assert.False(t, ok, "past PartitionCacheTTL it is looked up again")
		assert.Zero(t, s.PartitionCacheStats().Entries, "the expired entry was dropped as it was read")
		s.NotePartitionID("q", "p", "qid", "pid2")
		got, ok = s.CachedPartitionID("q", "p")
		assert.True(t, ok && got == "pid2", "noted again: %q %v", got, ok)
	})
}
