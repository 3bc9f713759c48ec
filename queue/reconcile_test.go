package queue_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// A database that lost what it committed (a failover to an asynchronous
// standby) has the lease of an ack it answered back, owned by this
// instance's streams though none holds it any more: the reconciliation
// gives it back, uncharged, and the messages are popped again with
// retryCount 0 at once. It keeps a lease a stream holds (and says it is
// live), one made after its bound (a pop under way), and one a client
// popped over HTTP (the client's own); a held lease the database does not
// have is not reported live.
func TestReconcileInstanceLeases_GivesBackLeasesNoStreamHoldsUncharged(t *testing.T) {
	s := newStore(t)
	for _, part := range []string{"a", "b", "c", "d"} {
		push(t, s, "q", part, nums(1, 2)...)
	}
	streamPop := func(part string, stream bool) *queue.PopResult {
		res := pop(t, s, queue.PopRequest{Queue: "q", Partition: part, Batch: 2, LeaseID: queue.NewID(), Stream: stream})
		require.Len(t, res.Messages, 2, part)
		return res
	}
	held := streamPop("a", true)
	acked := streamPop("b", true)
	pid := acked.Messages[0].PartitionID
	// The old primary streamed the pop, then committed the ack and died
	// before streaming it: the consumer row is as it was before the ack.
	var before string
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT to_jsonb(c)::text FROM consumers c WHERE partition_id = $1`,
		pid).Scan(&before))
	for _, r := range ackAll(t, s, acked, queue.StatusCompleted) {
		require.True(t, r.Success, r.Error)
	}
	exec(t, s, `UPDATE consumers c SET (cursor, done, lease_id, lease_owner, lease_expires_at, lease_from, lease_to,
		leased_at, attempts, attempt_seq, delivered_to) = (r.cursor, r.done, r.lease_id, r.lease_owner, r.lease_expires_at,
		r.lease_from, r.lease_to, r.leased_at, r.attempts, r.attempt_seq, r.delivered_to)
		FROM jsonb_populate_record(NULL::consumers, $1::jsonb) r WHERE c.partition_id = r.partition_id`, before)
	popped := streamPop("d", false) // an HTTP pop: the client's
	bound := queue.NewID()
	underWay := streamPop("c", true) // leased after the bound
	lost := queue.NewID()            // a stream holds it; the database never had it

	r, err := s.ReconcileInstanceLeases(ctxT(t), []string{held.Messages[0].LeaseID, lost}, bound)
	require.NoError(t, err)
	require.Len(t, r.Freed, 1)
	assert.Equal(t, queue.FreedLease{Queue: "q", Partition: "b", PartitionID: pid, Group: queue.DefaultGroup}, r.Freed[0])
	assert.Equal(t, map[string]bool{held.Messages[0].LeaseID: true}, r.Live)

	leases := map[string]string{}
	rows, err := s.Pool().Query(ctxT(t), `SELECT p.name, coalesce(c.lease_id::text, '') FROM consumers c
		JOIN partitions p ON p.id = c.partition_id`)
	require.NoError(t, err)
	for rows.Next() {
		var part, lease string
		require.NoError(t, rows.Scan(&part, &lease))
		leases[part] = lease
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, map[string]string{"a": held.Messages[0].LeaseID, "b": "", "c": underWay.Messages[0].LeaseID,
		"d": popped.Messages[0].LeaseID}, leases)

	again := pop(t, s, queue.PopRequest{Queue: "q", Partition: "b", Batch: 2})
	require.Len(t, again.Messages, 2, "the messages of the given-back lease are popped again at once")
	assert.Equal(t, []int{1, 2}, payloads(t, again.Messages))
	for _, m := range again.Messages {
		assert.Zero(t, m.RetryCount, "no attempt charged")
	}
}
