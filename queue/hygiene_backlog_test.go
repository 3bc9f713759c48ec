package queue_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// The hygiene sample reports what each consumer group has not
// finished, the age of the oldest of it and the dead-letter counts, for
// the lag, age and DLQ alerts.
func TestHygiene_Backlog(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	push(t, s, "lag", "a", nums(1, 5)...)
	push(t, s, "lag", "b", nums(1, 3)...)
	push(t, s, "calm", "", nums(1, 1)...)
	// calm's message is finished; lag's group "bus" finishes 2 of a's 5
	// (one acked, one dead-lettered) and queue mode none.
	ackAll(t, s, pop(t, s, queue.PopRequest{Queue: "calm"}), queue.StatusCompleted)
	// Rows exist once a group has read the queue (for queue mode too).
	require.NoError(t, s.EnsureConsumers(ctx, []queue.Target{{Queue: "lag"}, {Queue: "lag", Group: "bus"}}))
	res := pop(t, s, queue.PopRequest{Queue: "lag", Group: "bus", Partition: "a", Batch: 2})
	require.Len(t, res.Messages, 2)
	out, err := s.Ack(ctx, []queue.Ack{
		{TransactionID: res.Messages[0].TransactionID, PartitionID: res.Messages[0].PartitionID, LeaseID: res.LeaseID, Group: "bus"},
		{TransactionID: res.Messages[1].TransactionID, PartitionID: res.Messages[1].PartitionID, LeaseID: res.LeaseID, Group: "bus",
			Status: queue.StatusDLQ, Error: "bad"},
	})
	require.NoError(t, err)
	require.True(t, out[1].DLQ)
	// Partition b's first message was pushed ten minutes ago.
	exec(t, s, `UPDATE messages SET created_at = now() - interval '10 minutes'
		WHERE partition_id = (SELECT id FROM partitions WHERE name = 'b') AND seq = 1`)

	h, err := s.SampleHygiene(ctx)
	require.NoError(t, err)
	byPair := map[[2]string]queue.GroupBacklog{}
	for _, b := range h.Backlog {
		byPair[[2]string{b.Queue, b.Group}] = b
	}
	mode := byPair[[2]string{"lag", queue.DefaultGroup}]
	assert.EqualValues(t, 8, mode.Waiting, "%+v", h.Backlog)
	assert.EqualValues(t, 2, mode.Partitions)
	assert.InDelta(t, 10*time.Minute, mode.OldestAge, float64(time.Minute), "b's first message")
	bus := byPair[[2]string{"lag", "bus"}]
	assert.EqualValues(t, 6, bus.Waiting, "3 of a, 3 of b")
	assert.InDelta(t, 10*time.Minute, bus.OldestAge, float64(time.Minute))
	assert.NotContains(t, byPair, [2]string{"calm", queue.DefaultGroup}, "nothing waits")
	assert.Equal(t, queue.DefaultGroup, h.Backlog[0].Group, "the most waiting first")
	assert.Equal(t, []queue.DeadLetterCount{{Queue: "lag", Group: "bus", N: 1}}, h.DeadLetters)
	assert.GreaterOrEqual(t, h.SlotRetainedBytes, int64(0))
}

// The backlog sample over many partitions with something waiting never
// scans messages: it probes at most BacklogAgeSample partitions' first
// messages per pair. 20,000 partitions (20 times the sample) prove the
// bound; 100,000 took minutes on a busy machine and proved nothing more.
func TestPlan_BacklogSampleIsBounded(t *testing.T) {
	s := newStore(t)
	const big = 20000
	fillPartitions(t, s, "big", big)
	require.NoError(t, s.EnsureConsumers(ctxBig(t), []queue.Target{{Queue: "big"}}))
	exec(t, s, "VACUUM ANALYZE")
	plan := explainCustom(t, s, queue.BacklogSQL, queue.BacklogTop, queue.BacklogAgeSample)
	t.Logf("backlog over %d partitions: %d blocks, %v ms; scans %v", big, blocks(plan), plan["Actual Total Time"], scans(plan))
	assert.NotContains(t, scans(plan), "messages")
	assert.LessOrEqual(t, probes(plan, "messages"), float64(queue.BacklogAgeSample), "one probe per sampled partition")
	dl := explainCustom(t, s, queue.DeadLettersSQL, queue.BacklogTop)
	assert.Empty(t, scans(dl))

	h, err := s.SampleHygiene(ctxT(t))
	require.NoError(t, err)
	require.Len(t, h.Backlog, 1)
	assert.EqualValues(t, big, h.Backlog[0].Waiting)
	assert.EqualValues(t, big, h.Backlog[0].Partitions)
	assert.Positive(t, h.Backlog[0].OldestAge)
}

// probes sums the loops of the plan nodes that read rel.
func probes(plan map[string]any, rel string) float64 {
	var n float64
	if plan["Relation Name"] == rel {
		loops, _ := plan["Actual Loops"].(float64)
		n += loops
	}
	subs, _ := plan["Plans"].([]any)
	for _, sub := range subs {
		n += probes(sub.(map[string]any), rel)
	}
	return n
}
