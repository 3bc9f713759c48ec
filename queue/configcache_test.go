package queue_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// The config cache is filled by configure, by partition lookups and on a
// miss; a peer's news replaces an older entry or drops it; the refresh reads
// every cached queue again in one query and forgets deleted ones.
func TestConfigCache(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	stats := s.QueryStats()

	res, err := s.Configure(ctx, queue.ConfigureRequest{Queue: "cc", Options: json.RawMessage(`{"leaseTime":42}`)})
	require.NoError(t, err)
	info, ok := s.CachedConfig("cc")
	require.True(t, ok, "configure caches")
	assert.Equal(t, res.Info(), info)
	assert.EqualValues(t, 1, info.Version)

	before := stats.Snapshot()
	got, ok, err := s.QueueConfig(ctx, "cc")
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, 42, got.Options.LeaseTime)
	assert.Empty(t, opsSince(stats, before), "a hit asks nothing")

	// A push to a queue nobody configured here fills the cache from the
	// partition lookup, at no extra statement.
	_, err = s.Push(ctx, []queue.PushItem{{Queue: "pushed.here", Payload: json.RawMessage(`1`)}})
	require.NoError(t, err)
	info, ok = s.CachedConfig("pushed.here")
	require.True(t, ok)
	assert.Equal(t, "pushed", info.Namespace)
	assert.Equal(t, queue.DefaultOptions(), info.Options)

	_, ok, err = s.QueueConfig(ctx, "nope")
	require.NoError(t, err)
	assert.False(t, ok)

	// A peer's news: an older version is ignored, a newer one taken; one
	// without an id (the reference server's) only drops the entry.
	news := res.Info()
	news.Version, news.Options.LeaseTime = 5, 7
	s.PeerConfigured(news)
	info, _ = s.CachedConfig("cc")
	assert.Equal(t, 7, info.Options.LeaseTime, "version 5 replaces version 1")
	news.Version, news.Options.LeaseTime = 3, 1
	s.PeerConfigured(news)
	info, _ = s.CachedConfig("cc")
	assert.Equal(t, 7, info.Options.LeaseTime, "version 3 is older than 5")
	s.PeerConfigured(queue.QueueInfo{Name: "cc"})
	_, ok = s.CachedConfig("cc")
	assert.False(t, ok, "no id: dropped, read again on next use")

	// The refresh: one query for every cached queue.
	_, err = s.Configure(ctx, queue.ConfigureRequest{Queue: "cc", Options: json.RawMessage(`{"leaseTime":43}`)})
	require.NoError(t, err)
	_, err = s.Pool().Exec(ctx, `UPDATE queues SET lease_time = 44, version = version + 1 WHERE name = 'cc'`)
	require.NoError(t, err)
	_, err = s.Pool().Exec(ctx, `DELETE FROM queues WHERE name = 'pushed.here'`)
	require.NoError(t, err)
	before = stats.Snapshot()
	require.NoError(t, s.RefreshConfigs(ctx))
	assert.Equal(t, map[string]uint64{"queue_config_refresh": 1}, opsSince(stats, before))
	info, _ = s.CachedConfig("cc")
	assert.Equal(t, 44, info.Options.LeaseTime)
	_, ok = s.CachedConfig("pushed.here")
	assert.False(t, ok, "deleted: forgotten")

	// Its partition ids went too: a push recreates the queue.
	r, err := s.Push(ctx, []queue.PushItem{{Queue: "pushed.here", Payload: json.RawMessage(`2`)}})
	require.NoError(t, err)
	assert.Equal(t, queue.StatusQueued, r[0].Status)
}

// A cached queue deleted behind the cache's back: a push to a new partition
// (which trusts the cache and skips creating the queue) retries and lands.
func TestConfigCache_StaleQueue(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	_, err := s.Configure(ctx, queue.ConfigureRequest{Queue: "gone"})
	require.NoError(t, err)
	_, err = s.Pool().Exec(ctx, `DELETE FROM queues WHERE name = 'gone'`)
	require.NoError(t, err)
	r, err := s.Push(ctx, []queue.PushItem{{Queue: "gone", Partition: "new", Payload: json.RawMessage(`1`)}})
	require.NoError(t, err)
	assert.Equal(t, queue.StatusQueued, r[0].Status)
	res, err := s.Pop(ctx, queue.PopRequest{Queue: "gone", Partition: "new", Batch: 10, AutoAck: true})
	require.NoError(t, err)
	require.Len(t, res.Messages, 1)
	assert.JSONEq(t, `1`, string(res.Messages[0].Data))
}

// QueueStatus: depth and lag per group, from partition and consumer rows.
func TestQueueStatus(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	st, err := s.QueueStatus(ctx, "nothing")
	require.NoError(t, err)
	assert.False(t, st.Exists)
	var items []queue.PushItem
	for i := range 6 {
		items = append(items, queue.PushItem{Queue: "st", Partition: []string{"a", "b"}[i%2], Payload: json.RawMessage(`1`)})
	}
	_, err = s.Push(ctx, items)
	require.NoError(t, err)
	res, err := s.Pop(ctx, queue.PopRequest{Queue: "st", Partition: "a", Group: "g1", Batch: 2})
	require.NoError(t, err)
	require.Len(t, res.Messages, 2)
	_, err = s.Pop(ctx, queue.PopRequest{Queue: "st", Partition: "b", Group: "g2", Batch: 3, AutoAck: true})
	require.NoError(t, err)
	st, err = s.QueueStatus(ctx, "st")
	require.NoError(t, err)
	assert.Equal(t, &queue.QueueStatus{Queue: "st", Exists: true, Partitions: 2, Pushed: 6, Groups: []queue.GroupStatus{
		// Once a group is on a queue, every partition counts.
		{Group: "g1", Lag: 6, Leased: 1}, // none finished, 2 of a leased
		{Group: "g2", Lag: 3},            // all 3 of b acked, a untouched
	}}, st)
}
