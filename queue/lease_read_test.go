package queue_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// ReadLease reads what a live lease holds after an offset and before
// another, in order, without the acknowledged ones and without changing
// the lease; a lease that is not the partition's live one reads nothing.
func TestReadLease_ReadsWhatALiveLeaseHoldsBetweenOffsets(t *testing.T) {
	s := newStore(t)
	push(t, s, "q", "p", nums(1, 5)...)
	res := pop(t, s, queue.PopRequest{Queue: "q", Batch: 5})
	require.Len(t, res.Messages, 5)
	pid, lease := res.Messages[0].PartitionID, res.LeaseID
	acks := ackAll(t, s, &queue.PopResult{Messages: res.Messages[2:3]}, queue.StatusCompleted) // offset 3
	require.True(t, acks[0].Success)

	got, through, held, err := s.ReadLease(ctxT(t), pid, "", lease, 1, 0, 100)
	require.NoError(t, err)
	require.True(t, held)
	assert.Equal(t, []int{2, 4, 5}, payloads(t, got.Messages), "after offset 1, the acked one left out")
	assert.Equal(t, int64(5), through, "up to the lease's end")
	for _, m := range got.Messages {
		assert.Equal(t, lease, m.LeaseID)
		assert.Equal(t, "q", m.Queue)
		assert.Equal(t, "p", m.Partition)
	}

	got, through, held, err = s.ReadLease(ctxT(t), pid, "", lease, 1, 5, 1)
	require.NoError(t, err)
	require.True(t, held)
	assert.Equal(t, []int{2}, payloads(t, got.Messages), "before offset 5, at most 1")
	assert.True(t, got.More)
	assert.Equal(t, int64(2), through, "through the last one read when the limit cut it")

	got, through, held, err = s.ReadLease(ctxT(t), pid, "", lease, 5, 0, 100)
	require.NoError(t, err)
	assert.True(t, held)
	assert.Nil(t, got, "nothing after the lease's end")
	assert.Equal(t, int64(5), through)

	out := ackAll(t, s, res, queue.StatusCompleted) // ends the lease
	require.True(t, out[0].Success)
	got, _, held, err = s.ReadLease(ctxT(t), pid, "", lease, 0, 0, 100)
	require.NoError(t, err)
	assert.False(t, held, "an ended lease")
	assert.Nil(t, got)

	push(t, s, "q", "p", nums(6, 6)...)
	res = pop(t, s, queue.PopRequest{Queue: "q"})
	require.Len(t, res.Messages, 1)
	expireLeases(t, s)
	_, _, held, err = s.ReadLease(ctxT(t), pid, "", res.LeaseID, 0, 0, 100)
	require.NoError(t, err)
	assert.False(t, held, "an expired lease")
}
