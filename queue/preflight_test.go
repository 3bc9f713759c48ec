package queue_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// A pre-flight for subscriptions naming one partition each reads each
// partition's consumer row by key: its cost per target does not grow with
// the queue's partitions. It used to filter the queue's whole ready range
// per target (200 targets over 9,000 partitions: 65,932 buffers, 350 ms),
// and 9,000 partition subscriptions were served at ~270 a second.
func TestPreflight_PartitionTargetCostIndependentOfPartitionCount(t *testing.T) {
	s := newStore(t)
	const targets = 100
	cost := map[int]int64{}
	for _, n := range []int{500, 4000} {
		q := fmt.Sprintf("named%d", n)
		fillPartitions(t, s, q, n)
		require.NoError(t, s.EnsureConsumers(ctxT(t), []queue.Target{{Queue: q}}))
		exec(t, s, "ANALYZE")
		var ts []queue.Target
		qn, empty, pn, gr := make([]string, targets), make([]string, targets), make([]string, targets), make([]string, targets)
		want := make([]int32, targets)
		for i := range targets {
			part := fmt.Sprintf("p%d", 1+i*(n/targets))
			ts = append(ts, queue.Target{Queue: q, Partition: part, Want: 1})
			qn[i], pn[i], gr[i], want[i] = q, part, queue.DefaultGroup, 1
		}
		avail, err := s.Preflight(ctxT(t), ts)
		require.NoError(t, err)
		require.Len(t, avail, targets, "every named partition has its message")
		for _, a := range avail {
			assert.Equal(t, ts[a.Target].Partition, a.Partition, "a target is answered with the partition it names")
			assert.True(t, a.Eligible)
		}
		cost[n] = explainBuffers(t, s, queue.PreflightSQL, qn, empty, empty, pn, gr, want, empty)
		t.Logf("%d partition targets over %d partitions: %d buffers", targets, n, cost[n])
	}
	// A key lookup is a few buffers (partition by name, consumer row by key,
	// the partition again): 20 a target is ample, and the big queue costs
	// about what the small one does.
	assert.Less(t, cost[4000], int64(20*targets))
	assert.Less(t, cost[4000], 2*cost[500], "the cost follows the targets, not the partitions")
}
