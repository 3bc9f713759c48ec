package queue_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// The lease and ack contract against a careless or hostile client: the
// holes an outside attacker found in it, and their siblings.

func expireLeases(t *testing.T, s *queue.Store) {
	t.Helper()
	exec(t, s, `UPDATE consumers SET lease_expires_at = now() - interval '1 second' WHERE lease_id IS NOT NULL`)
}

func leaseExpiry(t *testing.T, s *queue.Store, leaseID string) time.Time {
	t.Helper()
	var at time.Time
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT lease_expires_at FROM consumers WHERE lease_id = $1::uuid`, leaseID).Scan(&at))
	return at
}

// Seconds ≥ 2^31 was narrowed to int32 and wrapped negative, which
// ended the lease and answered success; 2^31−1 pinned a partition for 68 years.
func TestExtendLease_SecondsAreBounded(t *testing.T) {
	s := newStore(t)
	push(t, s, "q", "", nums(1, 1)...)
	res := pop(t, s, queue.PopRequest{Queue: "q"})
	before := leaseExpiry(t, s, res.LeaseID)

	for _, secs := range []int{1 << 31, 1<<31 - 1, 1 << 53, queue.MaxLeaseSeconds + 1, -1} {
		ext, err := s.ExtendLease(ctxT(t), res.LeaseID, secs, "")
		require.Error(t, err, "seconds=%d", secs)
		assert.True(t, queue.IsInputError(err), "seconds=%d is the client's fault (400): %v", secs, err)
		assert.Nil(t, ext)
		assert.Equal(t, before, leaseExpiry(t, s, res.LeaseID), "seconds=%d changed nothing", secs)
	}
	// The holder still holds it: no other consumer gets the message.
	assert.Empty(t, pop(t, s, queue.PopRequest{Queue: "q"}).Messages)

	ext, err := s.ExtendLease(ctxT(t), res.LeaseID, queue.MaxLeaseSeconds, "")
	require.NoError(t, err)
	assert.True(t, ext.Success)
	assert.WithinDuration(t, time.Now().Add(queue.MaxLeaseSeconds*time.Second), ext.ExpiresAt, time.Minute)
	out := ackAll(t, s, res, queue.StatusCompleted)
	assert.True(t, out[0].Success, "the holder's ack still counts")
}

// A's lease expired and B leased the message; A's retry without a
// leaseId released B's live lease, C got the message while B worked, and
// B's ack was refused.
func TestAck_StaleWithoutLeaseKeepsTheLiveHolder(t *testing.T) {
	for _, status := range []queue.AckStatus{queue.StatusRetry, queue.StatusFailed, queue.StatusCompleted, queue.StatusDLQ} {
		t.Run(string(status), func(t *testing.T) {
			s := newStore(t)
			push(t, s, "q", "", nums(1, 2)...)
			a := pop(t, s, queue.PopRequest{Queue: "q"})
			require.Equal(t, []int{1}, payloads(t, a.Messages))
			expireLeases(t, s)
			b := pop(t, s, queue.PopRequest{Queue: "q"})
			require.Equal(t, []int{1}, payloads(t, b.Messages))

			m := a.Messages[0]
			out, err := s.Ack(ctxT(t), []queue.Ack{{TransactionID: m.TransactionID, PartitionID: m.PartitionID, Status: status}})
			require.NoError(t, err)
			assert.False(t, out[0].Success, "a stale ack naming no lease must not touch B's live lease")
			assert.Equal(t, queue.ErrTextLeaseRequired, out[0].Error)
			assert.False(t, out[0].LeaseReleased)

			assert.Empty(t, pop(t, s, queue.PopRequest{Queue: "q"}).Messages, "C gets nothing while B holds the lease")
			done := ackAll(t, s, b, queue.StatusCompleted)
			assert.True(t, done[0].Success, "B's ack with its lease is taken: %+v", done[0])
			assert.Equal(t, []int{2}, payloads(t, pop(t, s, queue.PopRequest{Queue: "q"}).Messages))
			page, err := s.DLQ(ctxT(t), queue.DLQQuery{Queue: "q"})
			require.NoError(t, err)
			assert.Zero(t, page.Total)
		})
	}
}

// With no live lease, an ack naming no lease may finish a
// message that was delivered (the consumer's verdict), but failed and retry
// have no lease to give back (the expiry already counted the attempt).
func TestAck_WithoutLeaseAfterExpiryMayOnlyComplete(t *testing.T) {
	s := newStore(t)
	push(t, s, "q", "", nums(1, 2)...)
	a := pop(t, s, queue.PopRequest{Queue: "q"})
	m := a.Messages[0]
	expireLeases(t, s)

	out, err := s.Ack(ctxT(t), []queue.Ack{{TransactionID: m.TransactionID, PartitionID: m.PartitionID, Status: queue.StatusFailed}})
	require.NoError(t, err)
	assert.False(t, out[0].Success)
	assert.Equal(t, queue.ErrTextNoLiveLease, out[0].Error)

	out, err = s.Ack(ctxT(t), []queue.Ack{{TransactionID: m.TransactionID, PartitionID: m.PartitionID}})
	require.NoError(t, err)
	assert.True(t, out[0].Success, "a late completion of a delivered message is taken: %+v", out[0])
	next := pop(t, s, queue.PopRequest{Queue: "q"})
	assert.Equal(t, []int{2}, payloads(t, next.Messages))
	assert.Zero(t, next.Messages[0].RetryCount)
}

// The ack checked the lease was live, not that the offset lay in
// its range: acking x3 under x1's lease lost x3.
func TestAck_OutsideLeasedRangeIsRefused(t *testing.T) {
	s := newStore(t)
	res := push(t, s, "q", "", nums(1, 3)...)
	leased := pop(t, s, queue.PopRequest{Queue: "q", Batch: 1})
	require.Equal(t, []int{1}, payloads(t, leased.Messages))
	pid := leased.Messages[0].PartitionID
	x3 := res[2].TransactionID

	for _, status := range []queue.AckStatus{queue.StatusCompleted, queue.StatusDLQ, queue.StatusFailed, queue.StatusRetry} {
		out, err := s.Ack(ctxT(t), []queue.Ack{{TransactionID: x3, PartitionID: pid, LeaseID: leased.LeaseID, Status: status}})
		require.NoError(t, err)
		assert.False(t, out[0].Success, "%s of x3 under x1's lease", status)
		assert.Equal(t, queue.ErrTextOutsideLease, out[0].Error)
		assert.False(t, out[0].LeaseReleased)
	}
	// Sibling: the same ack naming no lease.
	out, err := s.Ack(ctxT(t), []queue.Ack{{TransactionID: x3, PartitionID: pid}})
	require.NoError(t, err)
	assert.False(t, out[0].Success)
	assert.Equal(t, queue.ErrTextLeaseRequired, out[0].Error)

	ackAll(t, s, leased, queue.StatusCompleted)
	// Sibling: no lease is live now and x3 was never delivered.
	out, err = s.Ack(ctxT(t), []queue.Ack{{TransactionID: x3, PartitionID: pid}})
	require.NoError(t, err)
	assert.False(t, out[0].Success, "an ack of a message never delivered is refused")
	assert.Equal(t, queue.ErrTextNotLeased, out[0].Error)

	rest := pop(t, s, queue.PopRequest{Queue: "q", Batch: 10})
	assert.Equal(t, []int{2, 3}, payloads(t, rest.Messages), "x3 is still delivered")
	assert.Zero(t, rest.Messages[1].RetryCount)
}

// Each item of a batch was checked against the state at the start
// of the request, so naming one message four times as failed dead-lettered
// it after a single delivery.
func TestAck_BatchItemsAppliedInOrder(t *testing.T) {
	s := newStore(t)
	_, err := s.Configure(ctxT(t), queue.ConfigureRequest{Queue: "q", Options: optsJSON(func(o *queue.Options) { o.RetryLimit = 3 })})
	require.NoError(t, err)
	push(t, s, "q", "", nums(1, 2)...)
	res := pop(t, s, queue.PopRequest{Queue: "q", Batch: 2})
	m := res.Messages[0]
	fail := queue.Ack{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: res.LeaseID, Status: queue.StatusFailed}
	out, err := s.Ack(ctxT(t), []queue.Ack{fail, fail, fail, fail})
	require.NoError(t, err)
	assert.True(t, out[0].Success)
	assert.False(t, out[0].DLQ)
	for _, r := range out[1:] {
		assert.False(t, r.Success, "item %d repeats a failure already applied", r.Index)
		assert.Equal(t, queue.ErrTextReleased, r.Error)
		assert.False(t, r.DLQ)
	}
	page, err := s.DLQ(ctxT(t), queue.DLQQuery{Queue: "q"})
	require.NoError(t, err)
	assert.Zero(t, page.Total, "one delivery, one failure: nothing dead-lettered")

	again := pop(t, s, queue.PopRequest{Queue: "q", Batch: 2})
	require.Equal(t, []int{1, 2}, payloads(t, again.Messages))
	assert.Equal(t, 1, again.Messages[0].RetryCount, "one attempt counted, not four")

	// Siblings in one request: completed after failed of the same message is
	// refused (it was given back); failed after completed is a no-op success;
	// the other message of the lease is still acked under it.
	m1, m2 := again.Messages[0], again.Messages[1]
	ack := func(m queue.Message, st queue.AckStatus) queue.Ack {
		return queue.Ack{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: again.LeaseID, Status: st}
	}
	out, err = s.Ack(ctxT(t), []queue.Ack{ack(m2, queue.StatusCompleted), ack(m2, queue.StatusFailed),
		ack(m1, queue.StatusRetry), ack(m1, queue.StatusCompleted)})
	require.NoError(t, err)
	assert.True(t, out[0].Success)
	assert.True(t, out[1].Success, "failing a message completed by an earlier item changes nothing")
	assert.True(t, out[2].Success)
	assert.True(t, out[2].LeaseReleased)
	assert.False(t, out[3].Success)
	assert.Equal(t, queue.ErrTextReleased, out[3].Error)

	last := pop(t, s, queue.PopRequest{Queue: "q", Batch: 2})
	assert.Equal(t, []int{1}, payloads(t, last.Messages), "2 is done, 1 came back")
	assert.Equal(t, 1, last.Messages[0].RetryCount, "a retry counts no attempt")
}

// On the transaction path acks go through the same
// rules, each operation against the state the operations before it left,
// and a refusal rolls the whole transaction back.
func TestTransaction_AcksFollowTheLeaseContract(t *testing.T) {
	s := newStore(t)
	res := push(t, s, "src", "", nums(1, 3)...)
	leased := pop(t, s, queue.PopRequest{Queue: "src", Batch: 1})
	m := leased.Messages[0]
	dst := []queue.PushItem{{Queue: "dst", Payload: json.RawMessage(`{"n":9}`)}}

	outside, err := s.Transaction(ctxT(t), []queue.TxOp{
		{Type: "push", Items: dst},
		{Type: "ack", Ack: queue.Ack{TransactionID: res[2].TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID}},
	}, nil, "")
	require.NoError(t, err)
	assert.False(t, outside.Success)
	assert.Equal(t, "ACK operation failed: "+queue.ErrTextOutsideLease, outside.Error)

	twice, err := s.Transaction(ctxT(t), []queue.TxOp{
		{Type: "ack", Ack: queue.Ack{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID, Status: queue.StatusFailed}},
		{Type: "ack", Ack: queue.Ack{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID, Status: queue.StatusFailed}},
		{Type: "push", Items: dst},
	}, nil, "")
	require.NoError(t, err)
	assert.False(t, twice.Success, "the second failure names a lease the first ended")
	assert.Equal(t, "ACK operation failed: "+queue.ErrTextInvalidLease, twice.Error)

	assert.Empty(t, pop(t, s, queue.PopRequest{Queue: "dst"}).Messages, "both rolled back")
	ackAll(t, s, leased, queue.StatusCompleted)
	rest := pop(t, s, queue.PopRequest{Queue: "src", Batch: 10})
	assert.Equal(t, []int{2, 3}, payloads(t, rest.Messages))
	assert.Zero(t, rest.Messages[0].RetryCount)
}

// On the transaction path Queen's transaction builder sends its
// acks without a leaseId and lists the lease in requiredLeases. That proves
// the request holds it, so the ack acts under it; without the proof the ack
// is refused like any other that names no lease under a live one.
func TestTransaction_RequiredLeasesProveTheHolder(t *testing.T) {
	s := newStore(t)
	push(t, s, "src", "", nums(1, 1)...)
	leased := pop(t, s, queue.PopRequest{Queue: "src"})
	m := leased.Messages[0]
	ack := queue.TxOp{Type: "ack", Ack: queue.Ack{TransactionID: m.TransactionID, PartitionID: m.PartitionID}}

	unproven, err := s.Transaction(ctxT(t), []queue.TxOp{ack}, nil, "")
	require.NoError(t, err)
	assert.False(t, unproven.Success)
	assert.Equal(t, "ACK operation failed: "+queue.ErrTextLeaseRequired, unproven.Error)

	other := "00000000-0000-4000-8000-000000000001"
	wrong, err := s.Transaction(ctxT(t), []queue.TxOp{ack}, []string{other}, "")
	require.NoError(t, err)
	assert.False(t, wrong.Success, "a lease that is not live proves nothing")

	proven, err := s.Transaction(ctxT(t), []queue.TxOp{ack}, []string{leased.LeaseID}, "")
	require.NoError(t, err)
	assert.True(t, proven.Success, proven.Error)
	assert.Empty(t, pop(t, s, queue.PopRequest{Queue: "src"}).Messages, "acked")
}

// A batch whose every message fails, acked failed in one request round
// after round: each message reaches its retry limit and is dead-lettered
// (a consumer that fails everything must not keep them coming for ever).
func TestAck_BatchFailingEveryMessageEachRoundReachesTheDeadLetterQueue(t *testing.T) {
	s := newStore(t)
	_, err := s.Configure(ctxT(t), queue.ConfigureRequest{Queue: "q", Options: optsJSON(func(o *queue.Options) { o.RetryLimit = 1 })})
	require.NoError(t, err)
	push(t, s, "q", "", nums(1, 2)...)
	for round := 0; round < 6; round++ {
		res := pop(t, s, queue.PopRequest{Queue: "q", Batch: 2})
		if len(res.Messages) == 0 {
			break
		}
		var acks []queue.Ack
		for _, m := range res.Messages {
			acks = append(acks, queue.Ack{TransactionID: m.TransactionID, PartitionID: m.PartitionID,
				LeaseID: res.LeaseID, Status: queue.StatusFailed})
		}
		out, err := s.Ack(ctxT(t), acks)
		require.NoError(t, err)
		for _, r := range out {
			require.True(t, r.Success, "round %d: %+v", round, r)
		}
	}
	page, err := s.DLQ(ctxT(t), queue.DLQQuery{Queue: "q"})
	require.NoError(t, err)
	assert.EqualValues(t, 2, page.Total, "both failed past their retry limit of 1")
	assert.Empty(t, pop(t, s, queue.PopRequest{Queue: "q"}).Messages)
}
