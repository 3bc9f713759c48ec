package queue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/queue"
)

// A push to one partition whose queue was deleted behind the instance's
// back (its id still cached) writes nothing on its first try, with no
// all-or-nothing guard in its statement (the one partition is bumped by
// neither form), and the retry with a fresh id stores it once.
func TestPush_OnePartitionGoneWritesNothingOnTheFirstTry(t *testing.T) {
	s := newStore(t)
	push(t, s, "gone", "", nums(1, 1)...)
	_, err := s.Pool().Exec(ctxT(t), `DELETE FROM queues WHERE name = 'gone'`)
	require.NoError(t, err)
	before := s.QueryStats().Snapshot()
	res := push(t, s, "gone", "", nums(2, 2)...)
	assert.Equal(t, queue.StatusQueued, res[0].Status)
	after := s.QueryStats().Snapshot()
	assert.Equal(t, before["push_lock"]+2, after["push_lock"], "a first try, refused, and the retry")
	assert.Equal(t, before["push_insert_lean"]+2, after["push_insert_lean"])
	got := pop(t, s, queue.PopRequest{Queue: "gone", Batch: 10})
	assert.Equal(t, []int{2}, payloads(t, got.Messages))
	assert.Equal(t, int64(1), got.Messages[0].Offset, "the new partition's first")
	var n int
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT count(*) FROM messages WHERE partition_id = $1`,
		res[0].PartitionID).Scan(&n))
	assert.Equal(t, 1, n, "stored once")
}

func TestMigrate_Idempotent(t *testing.T) {
	s := newStore(t)
	applied, err := queue.Migrate(ctxT(t), s.Pool())
	require.NoError(t, err)
	assert.Empty(t, applied, "second run applies nothing")
}

func TestPush_Dedup(t *testing.T) {
	s := newStore(t)
	items := []queue.PushItem{
		{Queue: "q", TransactionID: "tx-1", Payload: json.RawMessage(`{"first":true}`)},
		{Queue: "q", TransactionID: "tx-2"},
		{Queue: "q", TransactionID: "tx-1", Payload: json.RawMessage(`{"first":false}`)}, // same request
	}
	res, err := s.Push(ctxT(t), items)
	require.NoError(t, err)
	require.Len(t, res, 3)
	assert.Equal(t, queue.StatusQueued, res[0].Status)
	assert.Equal(t, queue.StatusQueued, res[1].Status)
	assert.Equal(t, queue.StatusDuplicate, res[2].Status)
	assert.Equal(t, res[0].MessageID, res[2].MessageID)
	for i, r := range res {
		assert.Equal(t, i, r.Index)
	}

	before := s.QueryStats().Snapshot()
	again, err := s.Push(ctxT(t), []queue.PushItem{{Queue: "q", TransactionID: "tx-2"}, {Queue: "q", TransactionID: "tx-3"}})
	require.NoError(t, err)
	assert.Equal(t, before["push_insert_lean"]+1, s.QueryStats().Snapshot()["push_insert_lean"],
		"found by the statement without the hand-off's steps")
	assert.Equal(t, queue.StatusDuplicate, again[0].Status)
	assert.Equal(t, res[1].MessageID, again[0].MessageID)
	assert.Equal(t, queue.StatusQueued, again[1].Status)

	// Duplicates take no offset: offsets stay dense.
	var last int64
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT last_offset FROM partitions`).Scan(&last))
	assert.Equal(t, int64(3), last)

	got := pop(t, s, queue.PopRequest{Queue: "q", Batch: 10})
	require.Len(t, got.Messages, 3)
	assert.JSONEq(t, `{"first":true}`, string(got.Messages[0].Data))
	assert.JSONEq(t, `{}`, string(got.Messages[1].Data), "absent payload is {}")
	for i, m := range got.Messages {
		assert.Equal(t, int64(i+1), m.Offset)
	}
}

func TestPush_NullPayloadAndTrace(t *testing.T) {
	s := newStore(t)
	trace := "8f3c1e2a-0000-4000-8000-000000000001"
	_, err := s.Push(ctxT(t), []queue.PushItem{{Queue: "q", Payload: json.RawMessage(`null`), TraceID: trace}})
	require.NoError(t, err)
	got := pop(t, s, queue.PopRequest{Queue: "q"})
	require.Len(t, got.Messages, 1)
	assert.Equal(t, "null", string(got.Messages[0].Data))
	assert.Equal(t, trace, got.Messages[0].TraceID)

	_, err = s.Push(ctxT(t), []queue.PushItem{{Queue: "q", TraceID: "not-a-uuid"}})
	assert.True(t, queue.IsInputError(err), "bad trace id is the client's fault: %v", err)
	_, err = s.Push(ctxT(t), []queue.PushItem{{Queue: ""}})
	assert.True(t, queue.IsInputError(err))
}

func TestPop_ExactBatch(t *testing.T) {
	s := newStore(t)
	push(t, s, "q", "", nums(1, 10)...)
	for _, want := range [][]int{ints(1, 3), ints(4, 6), ints(7, 9), {10}} {
		res := pop(t, s, queue.PopRequest{Queue: "q", Batch: 3})
		assert.Equal(t, want, payloads(t, res.Messages))
		ackAll(t, s, res, queue.StatusCompleted)
	}
	assert.Empty(t, pop(t, s, queue.PopRequest{Queue: "q", Batch: 3}).Messages)
	assert.Empty(t, pop(t, s, queue.PopRequest{Queue: "never-created"}).Messages)
}

func TestPop_OneLeasePerPartitionAndGroup(t *testing.T) {
	s := newStore(t)
	push(t, s, "q", "", nums(1, 4)...)
	first := pop(t, s, queue.PopRequest{Queue: "q", Batch: 2})
	require.Len(t, first.Messages, 2)
	// The partition is leased: another consumer of the group gets nothing,
	// so order holds.
	assert.Empty(t, pop(t, s, queue.PopRequest{Queue: "q", Batch: 2}).Messages)
	assert.NotEmpty(t, first.LeaseID)
	assert.Equal(t, first.LeaseID, first.Messages[0].LeaseID)
}

func TestAck_FullAckReleasesLeaseAtOnce(t *testing.T) {
	s := newStore(t)
	push(t, s, "q", "", nums(1, 4)...)
	res := pop(t, s, queue.PopRequest{Queue: "q", Batch: 2})
	acks := ackAll(t, s, res, queue.StatusCompleted)
	require.Len(t, acks, 2)
	assert.True(t, acks[0].Success)
	assert.False(t, acks[0].LeaseReleased)
	assert.True(t, acks[1].LeaseReleased, "the last ack of the batch releases the lease")
	assert.Equal(t, "q", acks[1].Queue)
	assert.Equal(t, "Default", acks[1].Partition)

	next := pop(t, s, queue.PopRequest{Queue: "q", Batch: 2})
	assert.Equal(t, []int{3, 4}, payloads(t, next.Messages))
}

// rowCopy is a consumer row's copy of its partition's last_offset and its
// cursor.
func rowCopy(t *testing.T, s *queue.Store, partitionID, group string) (copied, cursor int64) {
	t.Helper()
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT last_offset, cursor FROM consumers
		WHERE partition_id = $1::uuid AND consumer_group = $2`, partitionID, group).Scan(&copied, &cursor))
	return copied, cursor
}

// A push leaves alone the row of a group that is behind (its copy of
// last_offset is a lower bound), so the ack that ends its lease cannot
// tell from the copy whether messages were pushed meanwhile: it reports
// them pending all the same (a waiting consumer is woken for them), and
// reports a drained partition as drained. The row is ready again for the
// next pop.
func TestAck_ReleaseReportsMessagesPushedWhileTheGroupWasBehind(t *testing.T) {
	s := newStore(t)
	const q, g = "behind", "g"
	push(t, s, q, "", nums(1, 1)...)
	res := pop(t, s, queue.PopRequest{Queue: q, Group: g, Batch: 1})
	require.Len(t, res.Messages, 1)
	push(t, s, q, "", nums(2, 3)...)
	copied, cursor := rowCopy(t, s, res.PartitionID, g)
	require.Equal(t, [2]int64{1, 0}, [2]int64{copied, cursor}, "the pushes left the row of a group that was behind alone")

	acks := ackAll(t, s, res, queue.StatusCompleted)
	require.True(t, acks[0].Success)
	assert.True(t, acks[0].LeaseReleased)
	assert.True(t, acks[0].Pending, "messages 2 and 3 wait for the group")
	copied, cursor = rowCopy(t, s, res.PartitionID, g)
	assert.Equal(t, [2]int64{3, 1}, [2]int64{copied, cursor}, "the row is marked ready again")

	res = pop(t, s, queue.PopRequest{Queue: q, Group: g, Batch: 10})
	assert.Equal(t, []int{2, 3}, payloads(t, res.Messages))
	acks = ackAll(t, s, res, queue.StatusCompleted)
	assert.True(t, acks[1].LeaseReleased)
	assert.False(t, acks[1].Pending, "drained")

	// The same through a transaction's ack.
	push(t, s, q, "", nums(4, 4)...)
	res = pop(t, s, queue.PopRequest{Queue: q, Group: g, Batch: 1})
	require.Len(t, res.Messages, 1)
	push(t, s, q, "", nums(5, 5)...)
	m := res.Messages[0]
	tr, err := s.Transaction(ctxT(t), []queue.TxOp{{Type: "ack", Ack: queue.Ack{TransactionID: m.TransactionID,
		PartitionID: m.PartitionID, LeaseID: m.LeaseID, Group: g}}}, nil, "")
	require.NoError(t, err)
	require.True(t, tr.Success, tr.Error)
	require.NotNil(t, tr.Results[0].Ack)
	assert.True(t, tr.Results[0].Ack.LeaseReleased)
	assert.True(t, tr.Results[0].Ack.Pending, "message 5 waits for the group")
}

func TestAck_OutOfOrderAndIdempotent(t *testing.T) {
	s := newStore(t)
	push(t, s, "q", "", nums(1, 3)...)
	res := pop(t, s, queue.PopRequest{Queue: "q", Batch: 3})
	m := res.Messages
	// Ack the middle one first; then release the rest with retry.
	out, err := s.Ack(ctxT(t), []queue.Ack{{TransactionID: m[1].TransactionID, PartitionID: m[1].PartitionID, LeaseID: m[1].LeaseID}})
	require.NoError(t, err)
	assert.True(t, out[0].Success)
	out, err = s.Ack(ctxT(t), []queue.Ack{{TransactionID: m[1].TransactionID, PartitionID: m[1].PartitionID}})
	require.NoError(t, err)
	assert.True(t, out[0].Success, "acking twice is harmless")
	out, err = s.Ack(ctxT(t), []queue.Ack{{TransactionID: m[0].TransactionID, PartitionID: m[0].PartitionID, LeaseID: m[0].LeaseID, Status: queue.StatusRetry}})
	require.NoError(t, err)
	assert.True(t, out[0].LeaseReleased)
	// 2 is done; 1 and 3 come back, in order, without a retry counted.
	again := pop(t, s, queue.PopRequest{Queue: "q", Batch: 5})
	assert.Equal(t, []int{1, 3}, payloads(t, again.Messages))
	assert.Equal(t, 0, again.Messages[0].RetryCount)
}

// A client whose ack's answer was lost (the connection broke after the
// commit) sends it again: by then the ack has ended the lease it names.
// The repeat answers success and changes nothing; an ack of an offset not
// done under that ended lease is still refused.
func TestAck_RepeatAfterItsLeaseEndedSucceedsAndChangesNothing(t *testing.T) {
	s := newStore(t)
	push(t, s, "q", "", nums(1, 3)...)
	first := pop(t, s, queue.PopRequest{Queue: "q", Batch: 2})
	acks := ackAll(t, s, first, queue.StatusCompleted)
	require.True(t, acks[1].LeaseReleased)

	again := ackAll(t, s, first, queue.StatusCompleted)
	for i, r := range again {
		assert.True(t, r.Success, "item %d: %s", i, r.Error)
		assert.Empty(t, r.Error)
		assert.False(t, r.LeaseReleased, "item %d: no lease of its own to end", i)
	}
	// A failed verdict repeated on a done message charges nothing either.
	m := first.Messages[0]
	out, err := s.Ack(ctxT(t), []queue.Ack{{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID,
		Status: queue.StatusFailed}})
	require.NoError(t, err)
	assert.True(t, out[0].Success, out[0].Error)

	// The partition goes on: 3 under a new lease, first delivery.
	next := pop(t, s, queue.PopRequest{Queue: "q", Batch: 2})
	require.Equal(t, []int{3}, payloads(t, next.Messages))
	assert.Equal(t, 0, next.Messages[0].RetryCount)
	// The repeat under the old lease leaves the new one alone.
	again = ackAll(t, s, first, queue.StatusCompleted)
	assert.True(t, again[0].Success && again[1].Success)
	// 3 is not done: the old lease may not ack it.
	n := next.Messages[0]
	out, err = s.Ack(ctxT(t), []queue.Ack{{TransactionID: n.TransactionID, PartitionID: n.PartitionID, LeaseID: m.LeaseID}})
	require.NoError(t, err)
	assert.False(t, out[0].Success)
	assert.Equal(t, queue.ErrTextInvalidLease, out[0].Error)
	// The new lease still holds 3, and takes its ack.
	assert.Empty(t, pop(t, s, queue.PopRequest{Queue: "q"}).Messages, "3 is still leased")
	done := ackAll(t, s, next, queue.StatusCompleted)
	assert.True(t, done[0].Success && done[0].LeaseReleased)
}

// A seek ends the leases of the rows it moves: an ack under such a lease of
// an offset the seek passed over is refused, not taken for a harmless
// repeat (the offset is done only because the position moved), and so is
// one naming no lease. An offset acked before the seek still repeats
// harmlessly; after a seek back, what is delivered and acked again does too.
func TestAck_UnderALeaseASeekEndedIsRefused(t *testing.T) {
	s := newStore(t)
	push(t, s, "q", "", nums(1, 4)...)
	held := pop(t, s, queue.PopRequest{Queue: "q", Group: "g", Batch: 3})
	require.Equal(t, []int{1, 2, 3}, payloads(t, held.Messages))
	ack := func(m queue.Message, lease string) queue.AckResult {
		t.Helper()
		out, err := s.Ack(ctxT(t), []queue.Ack{{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: lease,
			Group: "g", Status: queue.StatusCompleted}})
		require.NoError(t, err)
		return out[0]
	}
	require.True(t, ack(held.Messages[0], held.LeaseID).Success)
	_, err := s.Seek(ctxT(t), "g", "q", "", nil) // to the end: past 2, 3 and 4
	require.NoError(t, err)

	assert.True(t, ack(held.Messages[0], held.LeaseID).Success, "1 was acked before the seek: a repeat")
	r := ack(held.Messages[1], held.LeaseID)
	assert.False(t, r.Success, "the seek ended the lease")
	assert.Equal(t, queue.ErrTextInvalidLease, r.Error)
	r = ack(held.Messages[2], "")
	assert.False(t, r.Success, "3 was not delivered since the seek")
	assert.Equal(t, queue.ErrTextNotLeased, r.Error)

	_, err = s.Seek(ctxT(t), "g", "q", "", new(time.Time)) // back to the beginning
	require.NoError(t, err)
	again := pop(t, s, queue.PopRequest{Queue: "q", Group: "g", Batch: 4})
	require.Equal(t, []int{1, 2, 3, 4}, payloads(t, again.Messages))
	for i, r := range ackAll(t, s, again, queue.StatusCompleted) {
		require.True(t, r.Success, "item %d: %s", i, r.Error)
	}
	for i, r := range ackAll(t, s, again, queue.StatusCompleted) {
		assert.True(t, r.Success, "item %d, acked since the seek back, repeats harmlessly: %s", i, r.Error)
	}
}

func TestAck_LeaseValidation(t *testing.T) {
	s := newStore(t)
	push(t, s, "q", "", nums(1, 1)...)
	res := pop(t, s, queue.PopRequest{Queue: "q"})
	m := res.Messages[0]
	out, err := s.Ack(ctxT(t), []queue.Ack{
		{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: "00000000-0000-0000-0000-000000000000"},
		{TransactionID: "does-not-exist", PartitionID: m.PartitionID},
		{TransactionID: m.TransactionID, PartitionID: "not-a-uuid"},
		{TransactionID: m.TransactionID, PartitionID: m.PartitionID, Group: "other"},
	})
	require.NoError(t, err)
	assert.Equal(t, queue.ErrTextInvalidLease, out[0].Error)
	assert.False(t, out[0].Success)
	assert.Equal(t, queue.ErrTextNotFound, out[1].Error)
	assert.Equal(t, "q", out[1].Queue)
	assert.Equal(t, queue.ErrTextNotFound, out[2].Error)
	assert.Equal(t, queue.ErrTextNotLeased, out[3].Error)
	// The message is still leased and unacked.
	assert.Empty(t, pop(t, s, queue.PopRequest{Queue: "q"}).Messages)
}

func TestAck_FailedRedeliversThenDLQ(t *testing.T) {
	s := newStore(t)
	_, err := s.Configure(ctxT(t), queue.ConfigureRequest{Queue: "q", Options: optsJSON(func(o *queue.Options) { o.RetryLimit = 2 })})
	require.NoError(t, err)
	push(t, s, "q", "", nums(1, 2)...)
	for attempt := 0; attempt <= 2; attempt++ {
		res := pop(t, s, queue.PopRequest{Queue: "q"})
		require.Equal(t, []int{1}, payloads(t, res.Messages), "attempt %d", attempt)
		assert.Equal(t, attempt, res.Messages[0].RetryCount)
		m := res.Messages[0]
		out, err := s.Ack(ctxT(t), []queue.Ack{{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID,
			Status: queue.StatusFailed, Error: "boom"}})
		require.NoError(t, err)
		require.True(t, out[0].Success)
		assert.Equal(t, attempt == 2, out[0].DLQ, "dead-lettered only after retryLimit retries (attempt %d)", attempt)
		assert.True(t, out[0].LeaseReleased)
	}
	// The neighbour is not charged with the poison message's attempts.
	res := pop(t, s, queue.PopRequest{Queue: "q"})
	assert.Equal(t, []int{2}, payloads(t, res.Messages))
	assert.Equal(t, 0, res.Messages[0].RetryCount)

	page, err := s.DLQ(ctxT(t), queue.DLQQuery{Queue: "q"})
	require.NoError(t, err)
	require.Equal(t, int64(1), page.Total)
	d := page.Messages[0]
	assert.Equal(t, "boom", d.ErrorMessage)
	assert.Equal(t, 2, d.RetryCount)
	assert.JSONEq(t, `{"n":1}`, string(d.Data))
	assert.Equal(t, queue.DefaultGroup, d.Group)
}

func TestAck_DLQStatusAndBatchWithFailure(t *testing.T) {
	s := newStore(t)
	push(t, s, "q", "", nums(1, 3)...)
	res := pop(t, s, queue.PopRequest{Queue: "q", Batch: 3})
	m := res.Messages
	// One request: 1 completed, 2 failed, 3 sent to the DLQ. The failure
	// releases the lease, but 3's ack still counts: leases are checked as
	// they were when the request started.
	out, err := s.Ack(ctxT(t), []queue.Ack{
		{TransactionID: m[0].TransactionID, PartitionID: m[0].PartitionID, LeaseID: res.LeaseID},
		{TransactionID: m[1].TransactionID, PartitionID: m[1].PartitionID, LeaseID: res.LeaseID, Status: queue.StatusFailed},
		{TransactionID: m[2].TransactionID, PartitionID: m[2].PartitionID, LeaseID: res.LeaseID, Status: queue.StatusDLQ, Error: "bad"},
	})
	require.NoError(t, err)
	for _, r := range out {
		assert.True(t, r.Success, "%+v", r)
	}
	assert.True(t, out[1].LeaseReleased)
	assert.True(t, out[2].DLQ)
	again := pop(t, s, queue.PopRequest{Queue: "q", Batch: 3})
	assert.Equal(t, []int{2}, payloads(t, again.Messages))
	assert.Equal(t, 1, again.Messages[0].RetryCount)
}

func TestLease_ExpiryRedeliversAndCountsAsAttempt(t *testing.T) {
	s := newStore(t)
	_, err := s.Configure(ctxT(t), queue.ConfigureRequest{Queue: "q", Options: optsJSON(func(o *queue.Options) { o.RetryLimit = 1 })})
	require.NoError(t, err)
	push(t, s, "q", "", nums(1, 2)...)
	expire := func() {
		exec(t, s, `UPDATE consumers SET lease_expires_at = now() - interval '1 second' WHERE lease_id IS NOT NULL`)
	}

	first := pop(t, s, queue.PopRequest{Queue: "q"})
	require.Equal(t, []int{1}, payloads(t, first.Messages))
	assert.Empty(t, pop(t, s, queue.PopRequest{Queue: "q"}).Messages, "leased")
	expire()
	second := pop(t, s, queue.PopRequest{Queue: "q"})
	require.Equal(t, []int{1}, payloads(t, second.Messages), "redelivered after expiry")
	assert.Equal(t, 1, second.Messages[0].RetryCount, "the expiry counted as a failed attempt")
	assert.NotEqual(t, first.LeaseID, second.LeaseID)

	// The consumer that lost its lease can no longer ack with it.
	m := first.Messages[0]
	out, err := s.Ack(ctxT(t), []queue.Ack{{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: first.LeaseID}})
	require.NoError(t, err)
	assert.Equal(t, queue.ErrTextInvalidLease, out[0].Error)

	// A consumer that always crashes: the second expiry exhausts retryLimit=1.
	expire()
	third := pop(t, s, queue.PopRequest{Queue: "q"})
	assert.Equal(t, []int{2}, payloads(t, third.Messages), "poison message went to the DLQ")
	page, err := s.DLQ(ctxT(t), queue.DLQQuery{Queue: "q"})
	require.NoError(t, err)
	require.Equal(t, int64(1), page.Total)
	assert.Equal(t, "lease expired", page.Messages[0].ErrorMessage)
	assert.Equal(t, map[string]int{"q": 1}, third.DeadLettered)
}

func TestLease_Extend(t *testing.T) {
	s := newStore(t)
	push(t, s, "q", "", nums(1, 1)...)
	res := pop(t, s, queue.PopRequest{Queue: "q"})
	ext, err := s.ExtendLease(ctxT(t), res.LeaseID, 120, "")
	require.NoError(t, err)
	assert.True(t, ext.Success)
	assert.WithinDuration(t, time.Now().Add(120*time.Second), ext.ExpiresAt, 10*time.Second)

	ext, err = s.ExtendLease(ctxT(t), "00000000-0000-0000-0000-000000000000", 0, "")
	require.NoError(t, err)
	assert.Equal(t, queue.ErrTextLeaseNotFound, ext.Error)

	exec(t, s, `UPDATE consumers SET lease_expires_at = now() - interval '1 second'`)
	ext, err = s.ExtendLease(ctxT(t), res.LeaseID, 0, "")
	require.NoError(t, err)
	assert.False(t, ext.Success)
	assert.Equal(t, queue.ErrTextLeaseExpired, ext.Error)
}

func TestGroups_FanOutWithIndependentCursors(t *testing.T) {
	s := newStore(t)
	push(t, s, "q", "", nums(1, 4)...)
	a := pop(t, s, queue.PopRequest{Queue: "q", Group: "a", Batch: 4})
	b := pop(t, s, queue.PopRequest{Queue: "q", Group: "b", Batch: 2})
	assert.Equal(t, ints(1, 4), payloads(t, a.Messages))
	assert.Equal(t, ints(1, 2), payloads(t, b.Messages))
	ackAll(t, s, a, queue.StatusCompleted)
	ackAll(t, s, b, queue.StatusCompleted)
	assert.Empty(t, pop(t, s, queue.PopRequest{Queue: "q", Group: "a"}).Messages)
	assert.Equal(t, ints(3, 4), payloads(t, pop(t, s, queue.PopRequest{Queue: "q", Group: "b", Batch: 9}).Messages))
	assert.Equal(t, ints(1, 4), payloads(t, pop(t, s, queue.PopRequest{Queue: "q", Batch: 9}).Messages), "queue mode has its own cursor")
}

func TestSubscriptionModes(t *testing.T) {
	s := newStore(t)
	push(t, s, "q", "", nums(1, 2)...)
	var mid time.Time
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT clock_timestamp()`).Scan(&mid))
	push(t, s, "q", "", nums(3, 3)...)

	t.Run("All", func(t *testing.T) {
		res := pop(t, s, queue.PopRequest{Queue: "q", Group: "all", SubscriptionMode: "all", Batch: 9})
		assert.Equal(t, ints(1, 3), payloads(t, res.Messages))
	})
	t.Run("New", func(t *testing.T) {
		assert.Empty(t, pop(t, s, queue.PopRequest{Queue: "q", Group: "new", SubscriptionMode: "new", Batch: 9}).Messages)
		push(t, s, "q", "", nums(4, 4)...)
		res := pop(t, s, queue.PopRequest{Queue: "q", Group: "new", SubscriptionMode: "new", Batch: 9})
		assert.Equal(t, []int{4}, payloads(t, res.Messages))
	})
	t.Run("FromNow", func(t *testing.T) {
		assert.Empty(t, pop(t, s, queue.PopRequest{Queue: "q", Group: "now", SubscriptionFrom: "now", Batch: 9}).Messages)
		// A partition created after the group subscribed counts as new too.
		push(t, s, "q", "later", nums(5, 5)...)
		res := pop(t, s, queue.PopRequest{Queue: "q", Group: "now", Batch: 9})
		assert.Equal(t, []int{5}, payloads(t, res.Messages))
	})
	t.Run("FromTimestamp", func(t *testing.T) {
		res := pop(t, s, queue.PopRequest{Queue: "q", Group: "ts", SubscriptionFrom: mid.Format(time.RFC3339Nano), Batch: 9})
		assert.Equal(t, []int{3, 4}, payloads(t, res.Messages))
	})
	t.Run("BadInput", func(t *testing.T) {
		// Any mode but new reads from the beginning; a time
		// that does not parse is refused.
		_, err := s.Pop(ctxT(t), queue.PopRequest{Queue: "q", Group: "g", SubscriptionMode: "sometimes"})
		assert.NoError(t, err)
		_, err = s.Pop(ctxT(t), queue.PopRequest{Queue: "q", Group: "g2", SubscriptionFrom: "yesterday"})
		assert.True(t, queue.IsInputError(err))
	})
}

func TestDelayedProcessing(t *testing.T) {
	s := newStore(t)
	_, err := s.Configure(ctxT(t), queue.ConfigureRequest{Queue: "q", Options: optsJSON(func(o *queue.Options) { o.DelayedProcessing = 60 })})
	require.NoError(t, err)
	push(t, s, "q", "", nums(1, 2)...)
	assert.Empty(t, pop(t, s, queue.PopRequest{Queue: "q", Batch: 9}).Messages, "not visible for 60 s")
	// Age only the first message: delivery stops at the first invisible one.
	exec(t, s, `UPDATE messages SET created_at = created_at - interval '61 seconds' WHERE seq = 1`)
	assert.Equal(t, []int{1}, payloads(t, pop(t, s, queue.PopRequest{Queue: "q", Group: "g", Batch: 9}).Messages))
	exec(t, s, `UPDATE messages SET created_at = created_at - interval '61 seconds' WHERE seq = 2`)
	assert.Equal(t, []int{1, 2}, payloads(t, pop(t, s, queue.PopRequest{Queue: "q", Batch: 9}).Messages))
}

func TestWindowBuffer(t *testing.T) {
	s := newStore(t)
	_, err := s.Configure(ctxT(t), queue.ConfigureRequest{Queue: "q", Options: optsJSON(func(o *queue.Options) { o.WindowBuffer = 30 })})
	require.NoError(t, err)
	push(t, s, "q", "busy", nums(1, 1)...)
	push(t, s, "q", "quiet", nums(2, 2)...)
	exec(t, s, `UPDATE partitions SET last_push_at = now() - interval '31 seconds' WHERE name = 'quiet'`)
	res := pop(t, s, queue.PopRequest{Queue: "q", Batch: 9, Partitions: 5})
	assert.Equal(t, []int{2}, payloads(t, res.Messages), "only the partition quiet for 30 s is eligible")
	assert.Equal(t, "quiet", res.Partition)
}

func TestAutoAck(t *testing.T) {
	s := newStore(t)
	push(t, s, "q", "", nums(1, 3)...)
	res := pop(t, s, queue.PopRequest{Queue: "q", AutoAck: true, Batch: 2})
	assert.Equal(t, ints(1, 2), payloads(t, res.Messages))
	assert.Empty(t, res.LeaseID)
	assert.Empty(t, res.Messages[0].LeaseID)
	// No lease kept: the next pop goes straight on.
	assert.Equal(t, []int{3}, payloads(t, pop(t, s, queue.PopRequest{Queue: "q", Batch: 2}).Messages))
}

func TestPop_SpecificAndMultiplePartitions(t *testing.T) {
	s := newStore(t)
	for _, p := range []string{"p1", "p2", "p3"} {
		push(t, s, "q", p, nums(1, 2)...)
	}
	one := pop(t, s, queue.PopRequest{Queue: "q", Partition: "p2", Batch: 9})
	assert.Equal(t, "p2", one.Partition)
	assert.Len(t, one.Messages, 2)
	assert.Equal(t, 1, one.PartitionsClaimed)

	many := pop(t, s, queue.PopRequest{Queue: "q", Partitions: 5, Batch: 3})
	assert.Len(t, many.Messages, 3, "batch bounds the total across partitions")
	assert.Equal(t, 2, many.PartitionsClaimed)
	seen := map[string]bool{}
	for _, m := range many.Messages {
		seen[m.Partition] = true
		assert.Equal(t, many.LeaseID, m.LeaseID)
	}
	assert.False(t, seen["p2"])
	// One lease id covers both partitions: extend and ack work across them.
	ext, err := s.ExtendLease(ctxT(t), many.LeaseID, 60, "")
	require.NoError(t, err)
	assert.True(t, ext.Success)
	for _, r := range ackAll(t, s, many, queue.StatusCompleted) {
		assert.True(t, r.Success)
	}
}

func TestPop_ByNamespaceAndTask(t *testing.T) {
	s := newStore(t)
	_, err := s.Configure(ctxT(t), queue.ConfigureRequest{Queue: "invoices-eu", Namespace: "billing", Task: "invoices"})
	require.NoError(t, err)
	push(t, s, "invoices-eu", "", nums(1, 1)...)
	push(t, s, "billing.refunds", "", nums(2, 2)...) // namespace and task from the dotted name
	push(t, s, "other", "", nums(3, 3)...)

	res := pop(t, s, queue.PopRequest{Namespace: "billing", Task: "refunds"})
	assert.Equal(t, []int{2}, payloads(t, res.Messages))
	assert.Equal(t, "billing.refunds", res.Queue)
	res = pop(t, s, queue.PopRequest{Namespace: "billing", Batch: 9})
	assert.Equal(t, []int{1}, payloads(t, res.Messages))
	assert.Empty(t, pop(t, s, queue.PopRequest{Namespace: "billing"}).Messages)
}

func TestTransaction(t *testing.T) {
	s := newStore(t)
	push(t, s, "src", "", nums(1, 1)...)
	res := pop(t, s, queue.PopRequest{Queue: "src"})
	m := res.Messages[0]

	// A failing ack rolls back the push before it.
	bad, err := s.Transaction(ctxT(t), []queue.TxOp{
		{Type: "push", Items: []queue.PushItem{{Queue: "dst", Payload: json.RawMessage(`{"n":99}`)}}},
		{Type: "ack", Ack: queue.Ack{TransactionID: "no-such-tx", PartitionID: m.PartitionID}},
	}, nil, "")
	require.NoError(t, err)
	assert.False(t, bad.Success)
	assert.Equal(t, "ACK operation failed: Message not found", bad.Error)
	assert.Empty(t, pop(t, s, queue.PopRequest{Queue: "dst"}).Messages, "the push was rolled back")

	good, err := s.Transaction(ctxT(t), []queue.TxOp{
		{Type: "ack", Ack: queue.Ack{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID}},
		{Type: "push", Items: []queue.PushItem{{Queue: "dst", Payload: json.RawMessage(`{"n":2}`)}}},
	}, []string{res.LeaseID}, "")
	require.NoError(t, err)
	require.True(t, good.Success, good.Error)
	require.Len(t, good.Results, 2)
	assert.Equal(t, []int{2}, payloads(t, pop(t, s, queue.PopRequest{Queue: "dst"}).Messages))

	stale, err := s.Transaction(ctxT(t), []queue.TxOp{{Type: "push", Items: []queue.PushItem{{Queue: "dst"}}}},
		[]string{res.LeaseID}, "")
	require.NoError(t, err)
	assert.False(t, stale.Success, "the required lease was released by the ack")

	_, err = s.Transaction(ctxT(t), nil, nil, "")
	assert.True(t, queue.IsInputError(err))
}

func TestConfigureAndDelete(t *testing.T) {
	s := newStore(t)
	res, err := s.Configure(ctxT(t), queue.ConfigureRequest{Queue: "q"})
	require.NoError(t, err)
	assert.NotEmpty(t, res.QueueID)
	assert.NotEmpty(t, res.PartitionID)
	assert.Equal(t, 300, res.Options.LeaseTime)
	again, err := s.Configure(ctxT(t), queue.ConfigureRequest{Queue: "q", Options: optsJSON(func(o *queue.Options) { o.LeaseTime = 10 })})
	require.NoError(t, err)
	assert.Equal(t, res.QueueID, again.QueueID)
	assert.Equal(t, res.PartitionID, again.PartitionID)

	_, err = s.Configure(ctxT(t), queue.ConfigureRequest{Queue: "q", Options: optsJSON(func(o *queue.Options) { o.RetryLimit = -1 })})
	assert.True(t, queue.IsInputError(err))

	push(t, s, "q", "", nums(1, 1)...)
	existed, err := s.DeleteQueue(ctxT(t), "q")
	require.NoError(t, err)
	assert.True(t, existed)
	existed, err = s.DeleteQueue(ctxT(t), "q")
	require.NoError(t, err)
	assert.False(t, existed)
	// The cached partition id is gone with the queue: a push recreates it.
	res2 := push(t, s, "q", "", nums(2, 2)...)
	assert.NotEqual(t, res.PartitionID, res2[0].PartitionID)
	assert.Equal(t, []int{2}, payloads(t, pop(t, s, queue.PopRequest{Queue: "q"}).Messages))
}

// optsJSON is the JSON of the default options changed by f.
func optsJSON(f func(*queue.Options)) json.RawMessage {
	o := queue.DefaultOptions()
	f(&o)
	b, _ := json.Marshal(o)
	return b
}

func TestConfigure_MergeAndReplace(t *testing.T) {
	s := newStore(t)
	_, err := s.Configure(ctxT(t), queue.ConfigureRequest{Queue: "q", Namespace: "ns", Task: "tk",
		Options: json.RawMessage(`{"retryLimit":7,"priority":5}`)})
	require.NoError(t, err)
	// A merge changes only what it names, and keeps namespace and task.
	res, err := s.Configure(ctxT(t), queue.ConfigureRequest{Queue: "q", Options: json.RawMessage(`{"leaseTime":60}`)})
	require.NoError(t, err)
	assert.Equal(t, 60, res.Options.LeaseTime)
	assert.Equal(t, 7, res.Options.RetryLimit)
	assert.Equal(t, 5, res.Options.Priority)
	assert.Equal(t, "ns", res.Namespace)
	assert.Equal(t, "tk", res.Task)
	// Replace resets what it does not name.
	res, err = s.Configure(ctxT(t), queue.ConfigureRequest{Queue: "q", Replace: true, Options: json.RawMessage(`{"priority":1}`)})
	require.NoError(t, err)
	want := queue.DefaultOptions()
	want.Priority = 1
	assert.Equal(t, want, res.Options)
	_, err = s.Configure(ctxT(t), queue.ConfigureRequest{Queue: "q", Options: json.RawMessage(`{"leaseTime":"long"}`)})
	assert.True(t, queue.IsInputError(err), "%v", err)
}

// Option names match as written, as the reference's JSON.parse reads them:
// "LeaseTime" is an unknown name, ignored (encoding/json applied it).
func TestConfigure_OptionNamesAreCaseSensitive(t *testing.T) {
	s := newStore(t)
	res, err := s.Configure(ctxT(t), queue.ConfigureRequest{Queue: "q",
		Options: json.RawMessage(`{"LeaseTime":60,"RETRYLIMIT":9,"priority":2}`)})
	require.NoError(t, err)
	assert.Equal(t, queue.DefaultOptions().LeaseTime, res.Options.LeaseTime)
	assert.Equal(t, queue.DefaultOptions().RetryLimit, res.Options.RetryLimit)
	assert.Equal(t, 2, res.Options.Priority)
}

// Values Postgres cannot store are the client's fault: an InputError (400),
// never a server fault, and nothing is stored.
func TestBadInput_IsInputError(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	for name, items := range map[string][]queue.PushItem{
		"NulEscapeInPayload": {{Queue: "q", Payload: json.RawMessage(`{"a":"\u0000"}`)}},
		"NumberOverflow":     {{Queue: "q", Payload: json.RawMessage(`{"a":1e999999}`)}},
		"NulInTransactionID": {{Queue: "q", TransactionID: "a\x00b"}},
		"NulInQueue":         {{Queue: "q\x00"}},
	} {
		_, err := s.Push(ctx, items)
		assert.True(t, queue.IsInputError(err), "%s: %v", name, err)
	}
	_, err := s.Pop(ctx, queue.PopRequest{Queue: "q", Partition: "p\x00"})
	assert.True(t, queue.IsInputError(err), "%v", err)
	_, err = s.Pop(ctx, queue.PopRequest{Namespace: "n\x00"})
	assert.True(t, queue.IsInputError(err), "%v", err)
	_, err = s.Ack(ctx, []queue.Ack{{TransactionID: "t\x00", PartitionID: "00000000-0000-0000-0000-000000000000"}})
	assert.True(t, queue.IsInputError(err), "%v", err)
	_, err = s.DLQ(ctx, queue.DLQQuery{Queue: "q\x00"})
	assert.True(t, queue.IsInputError(err), "%v", err)
	_, err = s.DeleteQueue(ctx, "q\x00")
	assert.True(t, queue.IsInputError(err), "%v", err)
	assert.Empty(t, pop(t, s, queue.PopRequest{Queue: "q", Batch: 10}).Messages, "nothing was stored")
}

// The push SQL function, for SQL producers, has the HTTP push's semantics.
func TestPushFunction(t *testing.T) {
	s := newStore(t)
	var id1, id2 string
	var st1, st2 string
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT message_id::text, status FROM push('sql.q', 'p1', '{"n":1}', 'tx-1')`).Scan(&id1, &st1))
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT message_id::text, status FROM push('sql.q', 'p1', '{"n":9}', 'tx-1')`).Scan(&id2, &st2))
	assert.Equal(t, "queued", st1)
	assert.Equal(t, "duplicate", st2)
	assert.Equal(t, id1, id2)
	_, err := s.Pool().Exec(ctxT(t), `SELECT push('sql.q', NULL, '{"n":2}', NULL)`)
	require.NoError(t, err)
	res := pop(t, s, queue.PopRequest{Queue: "sql.q", Partition: "p1", Batch: 10})
	assert.Equal(t, []int{1}, payloads(t, res.Messages))
	assert.Equal(t, int64(1), res.Messages[0].Offset)
	assert.Equal(t, id1, res.Messages[0].ID)
	// namespace and task from the dotted name; NULL partition is Default.
	res = pop(t, s, queue.PopRequest{Namespace: "sql", Task: "q", Batch: 10})
	assert.Equal(t, []int{2}, payloads(t, res.Messages))
	assert.Equal(t, "Default", res.Messages[0].Partition)
	// A Go push after the SQL ones continues the dense offsets.
	push(t, s, "sql.q", "p1", nums(3, 3)...)
	var last int64
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT last_offset FROM partitions WHERE name = 'p1'`).Scan(&last))
	assert.Equal(t, int64(2), last)
}

// sqlPushRowsWritten runs the push SQL function once in a transaction of
// its own and returns how many consumer rows it wrote (inserted or
// updated), as PostgreSQL counts them for the transaction: a count of the
// work, not a time.
func sqlPushRowsWritten(t *testing.T, s *queue.Store, q string, n int) int64 {
	t.Helper()
	ctx := ctxT(t)
	tx, err := s.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	// The backend's counts not yet sent to the statistics are part of what
	// the view reads (PostgreSQL 15 and later): the push's is the difference.
	const count = `SELECT coalesce(sum(n_tup_ins + n_tup_upd), 0)::bigint
		FROM pg_stat_xact_user_tables WHERE relname = 'consumers' AND schemaname = current_schema()`
	var before, after int64
	require.NoError(t, tx.QueryRow(ctx, count).Scan(&before))
	_, err = tx.Exec(ctx, `SELECT push($1, NULL, jsonb_build_object('n', $2::int), NULL)`, q, n)
	require.NoError(t, err)
	require.NoError(t, tx.QueryRow(ctx, count).Scan(&after))
	require.NoError(t, tx.Commit(ctx))
	return after - before
}

// The push SQL function, like the HTTP push, writes only the consumer rows
// that are caught up: groups that read a queue and left cost it nothing
// once the first push after they left has marked their rows, so its cost
// does not grow with them. A group that comes back gets what it missed,
// and one caught up again is marked by the next push.
func TestPushFunction_CostDoesNotGrowWithIdleGroups(t *testing.T) {
	s := newStore(t)
	const q = "sql-idle"
	push(t, s, q, "", nums(1, 1)...)
	const idle = 30
	for i := range idle {
		g := fmt.Sprintf("gone%02d", i)
		res := pop(t, s, queue.PopRequest{Queue: q, Group: g, Batch: 10})
		require.Len(t, res.Messages, 1)
		ackAll(t, s, res, queue.StatusCompleted)
	}
	res := pop(t, s, queue.PopRequest{Queue: q, Batch: 10}) // the default group, caught up too
	ackAll(t, s, res, queue.StatusCompleted)

	// The first push after they left marks their rows, once.
	assert.Equal(t, int64(idle+1), sqlPushRowsWritten(t, s, q, 2), "the first push marks every caught-up row")
	before := idleRowVersions(t, s, "gone")
	for n := 3; n <= 6; n++ {
		assert.Zero(t, sqlPushRowsWritten(t, s, q, n), "push %d wrote consumer rows of groups that are not reading", n)
	}
	assert.Equal(t, before, idleRowVersions(t, s, "gone"), "pushes wrote the rows of groups that are not reading")

	// Still ready: a group coming back gets all it missed, in order.
	res = pop(t, s, queue.PopRequest{Queue: q, Group: "gone07", Batch: 10})
	assert.Equal(t, ints(2, 6), payloads(t, res.Messages))
	ackAll(t, s, res, queue.StatusCompleted)
	assert.Equal(t, int64(1), sqlPushRowsWritten(t, s, q, 7), "the one group caught up again is marked")
	res = pop(t, s, queue.PopRequest{Queue: q, Group: "gone07", Batch: 10})
	assert.Equal(t, []int{7}, payloads(t, res.Messages))
}

// Instances that start together on a database whose schema does not exist
// yet all migrate: the lock is taken before the schema is created, so none
// fails on creating it twice.
func TestMigrate_ConcurrentFreshSchema(t *testing.T) {
	ctx := ctxT(t)
	dsn := pgtest.DSN(t)
	schema := "fresh_" + queue.NewID()[24:]
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	admin, err := pgxpool.New(ctx, pgtest.AdminURL(t))
	require.NoError(t, err)
	defer admin.Close()
	defer func() {
		_, err := admin.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		assert.NoError(t, err)
	}()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	applied := make([][]int, 4)
	for i := range 4 {
		pool, err := queue.NewPool(ctx, u.String(), 0)
		require.NoError(t, err)
		defer pool.Close()
		wg.Go(func() { applied[i], errs[i] = queue.Migrate(ctx, pool) })
	}
	wg.Wait()
	total := 0
	for i := range 4 {
		require.NoError(t, errs[i], "instance %d", i)
		total += len(applied[i])
	}
	migs, err := queue.Migrations()
	require.NoError(t, err)
	assert.Equal(t, len(migs), total, "each migration applied exactly once")
}

// A message older than its queue's ttl is never delivered: a pop (leasing
// or autoAck) skips it, finishes it for the group with no dead letter and
// counts it in Expired; the row is caught up when nothing else is left.
// A young message behind it is delivered in the same pop.
func TestPop_MessageOlderThanTTLIsNotDelivered(t *testing.T) {
	s := newStore(t)
	_, err := s.Configure(ctxT(t), queue.ConfigureRequest{Queue: "q", Options: json.RawMessage(`{"ttl":60}`)})
	require.NoError(t, err)
	push(t, s, "q", "", nums(1, 4)...)
	exec(t, s, `UPDATE messages SET created_at = created_at - interval '2 minutes' WHERE seq <> 3`)

	res := pop(t, s, queue.PopRequest{Queue: "q", Batch: 10})
	assert.Equal(t, []int{3}, payloads(t, res.Messages), "1, 2 and 4 expired")
	assert.Equal(t, map[string]int{"q": 3}, res.Expired)
	other := pop(t, s, queue.PopRequest{Queue: "q", Group: "auto", Batch: 10, AutoAck: true})
	assert.Equal(t, []int{3}, payloads(t, other.Messages))
	assert.Equal(t, map[string]int{"q": 3}, other.Expired)

	page, err := s.DLQ(ctxT(t), queue.DLQQuery{Queue: "q"})
	require.NoError(t, err)
	assert.Zero(t, page.Total, "expiry keeps no dead letter")
	var cursor, last int64
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT cursor, last_offset FROM consumers WHERE consumer_group = 'auto'`).
		Scan(&cursor, &last))
	assert.Equal(t, int64(4), cursor, "caught up: nothing left to wake a consumer for")
	assert.Equal(t, cursor, last)
	assert.Empty(t, pop(t, s, queue.PopRequest{Queue: "q", Group: "auto", Batch: 10}).Messages)
}

// A push to two queues, one of them deleted behind the instance's back
// (its partition id still cached), stores nothing on its first try: the
// push's statements share one transaction, which the partition lock
// finding the partition gone rolls back whole; the retry with fresh ids
// stores each item once.
func TestPush_PartitionGoneRollsBackTheWholeFirstTry(t *testing.T) {
	s := newStore(t)
	push(t, s, "kept", "", nums(1, 1)...)
	push(t, s, "gone", "", nums(1, 1)...)
	_, err := s.Pool().Exec(ctxT(t), `DELETE FROM queues WHERE name = 'gone'`)
	require.NoError(t, err)
	before := s.QueryStats().Snapshot()
	res, err := s.Push(ctxT(t), []queue.PushItem{
		{Queue: "kept", Payload: json.RawMessage(`{"n":2}`)},
		{Queue: "gone", Payload: json.RawMessage(`{"n":2}`)},
	})
	require.NoError(t, err)
	for _, r := range res {
		assert.Equal(t, queue.StatusQueued, r.Status, "%+v", r)
	}
	assert.Equal(t, before["push_lock"]+2, s.QueryStats().Snapshot()["push_lock"], "a first try, refused, and the retry")
	assert.Equal(t, before["push_insert_lean"]+2, s.QueryStats().Snapshot()["push_insert_lean"],
		"both by the statement without the hand-off's steps, whose guard wrote nothing the first time")
	assert.Equal(t, []int{1, 2}, payloads(t, pop(t, s, queue.PopRequest{Queue: "kept", Batch: 10}).Messages))
	assert.Equal(t, []int{2}, payloads(t, pop(t, s, queue.PopRequest{Queue: "gone", Batch: 10}).Messages))
}
