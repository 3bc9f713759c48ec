package queue_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// ReadLease reads what a live lease holds after an offset and before
// another, in order, without the acknowledged ones and without writing the
// lease's row while it has at least half its lease time left; a lease that
// is not the partition's live one reads nothing.
func TestReadLease_ReadsWhatALiveLeaseHoldsBetweenOffsets(t *testing.T) {
	s := newStore(t)
	push(t, s, "q", "p", nums(1, 5)...)
	res := pop(t, s, queue.PopRequest{Queue: "q", Batch: 5})
	require.Len(t, res.Messages, 5)
	pid, lease := res.Messages[0].PartitionID, res.LeaseID
	acks := ackAll(t, s, &queue.PopResult{Messages: res.Messages[2:3]}, queue.StatusCompleted) // offset 3
	require.True(t, acks[0].Success)

	version := rowVersion(t, s, lease)
	got, through, held, err := s.ReadLease(ctxT(t), pid, "", lease, 1, 0, 100)
	require.NoError(t, err)
	require.True(t, held)
	assert.Equal(t, version, rowVersion(t, s, lease), "a lease with time left is read, not written")
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

// rowVersion is the version (xmin, ctid) of the consumer row holding lease:
// it changes with every write.
func rowVersion(t *testing.T, s *queue.Store, lease string) string {
	t.Helper()
	var v string
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT xmin::text || ctid::text FROM consumers WHERE lease_id = $1::uuid`,
		lease).Scan(&v))
	return v
}

// What ReadLease reads under a lease with less than half its lease time
// left is delivered again to the lease's holder, a hand-off like a push's:
// the read renews the lease (its time starts again), so that each message
// it gives gets at least half the lease time from then. Lease time 2 s:
// the test waits, on the database's clock, until less than 0.9 s is left.
func TestReadLease_LeavesWhatItReadsAtLeastHalfItsLeaseTime(t *testing.T) {
	s := newStore(t)
	_, err := s.Configure(ctxT(t), queue.ConfigureRequest{Queue: "q", Options: json.RawMessage(`{"leaseTime":2}`)})
	require.NoError(t, err)
	push(t, s, "q", "p", nums(1, 2)...)
	res := pop(t, s, queue.PopRequest{Queue: "q", Batch: 2})
	require.Len(t, res.Messages, 2)
	pid, lease := res.Messages[0].PartitionID, res.LeaseID
	require.Eventually(t, func() bool {
		var short bool
		require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT lease_expires_at < clock_timestamp() + interval '900 ms'
			FROM consumers WHERE lease_id = $1::uuid`, lease).Scan(&short))
		return short
	}, 10*time.Second, 5*time.Millisecond, "less than half of the lease's time is left")

	var readAt time.Time
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT clock_timestamp()`).Scan(&readAt))
	got, _, held, err := s.ReadLease(ctxT(t), pid, "", lease, 1, 0, 100)
	require.NoError(t, err)
	require.True(t, held)
	assert.Equal(t, []int{2}, payloads(t, got.Messages))
	assert.GreaterOrEqual(t, leaseExpiry(t, s, lease).Sub(readAt), time.Second,
		"what was read has at least half the lease time (1 s of 2 s) from the read")
}
