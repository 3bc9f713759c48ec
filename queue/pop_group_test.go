package queue_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// Many groups new to a queue (browser tabs each in a group of its own,
// arriving together) are registered in one transaction of a fixed number
// of statements, whatever their number and the queue's partitions: the
// queues' lock, the partitions' share lock, one insert, and no check of
// the tables' statistics per group.
func TestRegister_NewGroupsShareOneTransaction(t *testing.T) {
	s := newStore(t)
	const q, parts, groups = "reg-many", 8, 30
	for p := range parts {
		push(t, s, q, fmt.Sprintf("p%d", p), nums(1, 2)...)
	}
	var ts []queue.Target
	for g := range groups {
		ts = append(ts, queue.Target{Queue: q, Group: fmt.Sprintf("tab%02d", g), SubscriptionMode: "new"})
	}
	ts = append(ts, queue.Target{Queue: q, Group: "tab00"}) // the same group twice: registered once
	stats := s.QueryStats()
	require.NotNil(t, stats)
	before := stats.Snapshot()
	require.NoError(t, s.EnsureConsumers(ctxT(t), ts))
	after := stats.Snapshot()
	var statements uint64
	for k, v := range after {
		statements += v - before[k]
	}
	assert.LessOrEqual(t, statements, uint64(6), "statements to register %d groups: %v", groups, opsDiff(before, after))

	var rows, ready int
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT count(*), count(*) FILTER (WHERE cursor < 2)
		FROM consumers WHERE consumer_group LIKE 'tab%'`).Scan(&rows, &ready))
	assert.Equal(t, groups*parts, rows, "a row per partition for every group")
	assert.Zero(t, ready, "subscriptionMode=new starts after the messages already there")
	// And they are served: the next push reaches every one of them.
	push(t, s, q, "p3", nums(3, 3)...)
	for g := range groups {
		res := pop(t, s, queue.PopRequest{Queue: q, Group: fmt.Sprintf("tab%02d", g), Batch: 10})
		assert.Equal(t, []int{3}, payloads(t, res.Messages), "group tab%02d", g)
	}
}

func opsDiff(before, after map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}
