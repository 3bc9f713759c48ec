package queue_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// ackRig is a store that runs one ack transaction at a time, so a test can
// hold that one in the database (blocking its consumer row) while the calls
// it wants merged queue up behind it.
type ackRig struct {
	t *testing.T
	s *queue.Store
}

func newAckRig(t *testing.T) *ackRig {
	base := newStore(t)
	s, err := queue.New(queue.Config{Pool: base.Pool(), InstanceID: "test", AckFlushers: 1})
	require.NoError(t, err)
	return &ackRig{t: t, s: s}
}

// lease pushes n messages to partition part of queue "q" and leases them.
func (r *ackRig) lease(part string, n int) []queue.Message {
	r.t.Helper()
	push(r.t, r.s, "q", part, nums(1, n)...)
	res := pop(r.t, r.s, queue.PopRequest{Queue: "q", Partition: part, Batch: n})
	require.Len(r.t, res.Messages, n)
	return res.Messages
}

// block locks m's consumer row until the returned func is called: an ack
// transaction on it waits in the database meanwhile.
func (r *ackRig) block(m queue.Message) (release func()) {
	r.t.Helper()
	tx, err := r.s.Pool().Begin(ctxT(r.t))
	require.NoError(r.t, err)
	_, err = tx.Exec(ctxT(r.t), `SELECT 1 FROM consumers WHERE partition_id = $1::uuid FOR UPDATE`, m.PartitionID)
	require.NoError(r.t, err)
	return func() { require.NoError(r.t, tx.Rollback(context.Background())) }
}

type ackOutcome struct {
	res []queue.AckResult
	err error
}

// ack starts an Ack call and returns where its outcome will arrive.
func (r *ackRig) ack(ctx context.Context, acks ...queue.Ack) <-chan ackOutcome {
	ch := make(chan ackOutcome, 1)
	go func() {
		res, err := r.s.Ack(ctx, acks)
		ch <- ackOutcome{res, err}
	}()
	return ch
}

// ackQueued starts an Ack call and waits until it queues behind the
// transaction in flight.
func (r *ackRig) ackQueued(ctx context.Context, acks ...queue.Ack) <-chan ackOutcome {
	r.t.Helper()
	n := r.s.AckQueued()
	ch := r.ack(ctx, acks...)
	r.waitFor("the call to queue", func() bool { return r.s.AckQueued() == n+1 })
	return ch
}

// completeEachWhileHeld queues one completion call per message while a
// first ack holds the transaction slot, releases it, and returns each
// call's one result (every call answered without error) and how many ack
// transactions ran from the first on.
func (r *ackRig) completeEachWhileHeld(msgs []queue.Message) (res []queue.AckResult, transactions uint64) {
	r.t.Helper()
	release, first := r.holdFirst("blocker")
	before := r.ackTransactions()
	outs := make([]<-chan ackOutcome, len(msgs))
	for i, m := range msgs {
		outs[i] = r.ackQueued(context.Background(), ackOf(m, queue.StatusCompleted))
	}
	release()
	require.NoError(r.t, r.outcome(first).err)
	for i, ch := range outs {
		o := r.outcome(ch)
		require.NoError(r.t, o.err, "call %d", i)
		require.Len(r.t, o.res, 1, "call %d", i)
		res = append(res, o.res[0])
	}
	return res, r.ackTransactions() - before
}

// holdFirst leases a message, blocks its row, starts acking it, and waits
// until that ack is the transaction in flight: calls made until release
// queue behind it.
func (r *ackRig) holdFirst(part string) (release func(), first <-chan ackOutcome) {
	r.t.Helper()
	m := r.lease(part, 1)[0]
	release = r.block(m)
	first = r.ack(context.Background(), ackOf(m, queue.StatusCompleted))
	r.waitForLockWait("the first ack")
	return release, first
}

// waitForLockWait waits until an ack transaction waits on a blocked row.
func (r *ackRig) waitForLockWait(what string) {
	r.t.Helper()
	r.waitFor(what+" to wait on the locked row", func() bool {
		var n int
		err := r.s.Pool().QueryRow(ctxT(r.t), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%herald:ack_lock%'`).Scan(&n)
		return err == nil && n == 1
	})
}

// unacked expires every lease and pops what is left of queue "q".
func (r *ackRig) unacked() []queue.Message {
	r.t.Helper()
	exec(r.t, r.s, `UPDATE consumers SET lease_expires_at = now() - interval '1 second'`)
	return pop(r.t, r.s, queue.PopRequest{Queue: "q", Batch: 100, Partitions: 100}).Messages
}

func (r *ackRig) waitFor(what string, cond func() bool) {
	r.t.Helper()
	require.Eventually(r.t, cond, 10*time.Second, time.Millisecond, "waiting for %s", what)
}

// ackTransactions counts the ack transactions run so far (each locks its
// consumers once). pgx traces a batch's statement when its result is read,
// so one waiting on a locked row counts when the row is released.
func (r *ackRig) ackTransactions() uint64 { return r.s.QueryStats().Snapshot()["ack_lock"] }

func (r *ackRig) outcome(ch <-chan ackOutcome) ackOutcome {
	r.t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(10 * time.Second):
		r.t.Fatal("an Ack call did not return")
		return ackOutcome{}
	}
}

func ackOf(m queue.Message, st queue.AckStatus) queue.Ack {
	return queue.Ack{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID, Status: st}
}

func TestAck_ConcurrentCallsShareTransaction(t *testing.T) {
	r := newAckRig(t)
	const calls = 8
	msgs := make([]queue.Message, calls)
	for i := range msgs {
		msgs[i] = r.lease(fmt.Sprintf("p%d", i), 1)[0]
	}
	res, transactions := r.completeEachWhileHeld(msgs)
	for i, o := range res {
		assert.Equal(t, queue.AckResult{Index: 0, TransactionID: msgs[i].TransactionID, Success: true, Queue: "q",
			Partition: fmt.Sprintf("p%d", i), LeaseReleased: true, LeaseID: msgs[i].LeaseID}, o, "call %d", i)
	}
	assert.Equal(t, uint64(2), transactions, "the first ack, then the eight queued calls in one transaction")
	assert.Equal(t, []string(nil), partitionsOf(r.unacked()), "every ack was applied")
}

// A failed item in call A gives its lease back after A's last item; call B,
// completing another message of the same lease, must then be refused as if
// it ran after A. Merged naively into one request, B's item would be
// applied under the lease A already ended.
func TestAck_OverlappingCallsKeepPerRequestSemantics(t *testing.T) {
	r := newAckRig(t)
	pair := r.lease("shared", 2)
	other := r.lease("other", 1)[0]
	release, first := r.holdFirst("blocker")
	before := r.ackTransactions()
	a := r.ackQueued(context.Background(), ackOf(pair[0], queue.StatusFailed))
	b := r.ackQueued(context.Background(), ackOf(pair[1], queue.StatusCompleted))
	c := r.ackQueued(context.Background(), ackOf(other, queue.StatusCompleted))
	release()

	require.NoError(t, r.outcome(first).err)
	oa, ob, oc := r.outcome(a), r.outcome(b), r.outcome(c)
	require.NoError(t, oa.err)
	require.NoError(t, ob.err)
	require.NoError(t, oc.err)
	assert.True(t, oa.res[0].Success)
	assert.True(t, oa.res[0].LeaseReleased, "A's failed item gives the lease back")
	assert.False(t, ob.res[0].Success)
	assert.Equal(t, queue.ErrTextInvalidLease, ob.res[0].Error, "B runs after A: the lease is gone")
	assert.True(t, oc.res[0].Success)
	assert.Equal(t, uint64(3), r.ackTransactions()-before, "the first ack, A and C (disjoint) together, B after them")

	again := pop(t, r.s, queue.PopRequest{Queue: "q", Partition: "shared", Batch: 10})
	assert.Equal(t, []int{1, 2}, payloads(t, again.Messages), "neither message of the shared lease was completed")
}

func TestAck_BadCallDoesNotFailNeighbours(t *testing.T) {
	r := newAckRig(t)
	m := make([]queue.Message, 4)
	for i := range m {
		m[i] = r.lease(fmt.Sprintf("p%d", i), 1)[0]
	}
	release, first := r.holdFirst("blocker")
	good1 := r.ackQueued(context.Background(), ackOf(m[0], queue.StatusCompleted))
	staleLease := ackOf(m[1], queue.StatusCompleted)
	staleLease.LeaseID = "00000000-0000-4000-8000-000000000000"
	unknown := ackOf(m[1], queue.StatusCompleted)
	unknown.TransactionID = "no-such-message"
	perItem := r.ackQueued(context.Background(), staleLease, unknown)
	fails := r.ackQueued(context.Background(), ackOf(m[2], "bogus"))
	good2 := r.ackQueued(context.Background(), ackOf(m[3], queue.StatusCompleted))
	release()

	require.NoError(t, r.outcome(first).err)
	for i, ch := range []<-chan ackOutcome{good1, good2} {
		o := r.outcome(ch)
		require.NoError(t, o.err, "good call %d", i)
		assert.True(t, o.res[0].Success, "good call %d", i)
		assert.True(t, o.res[0].LeaseReleased, "good call %d", i)
	}
	o := r.outcome(perItem)
	require.NoError(t, o.err, "refused items are results")
	require.Len(t, o.res, 2)
	assert.Equal(t, []string{queue.ErrTextInvalidLease, queue.ErrTextNotFound}, []string{o.res[0].Error, o.res[1].Error})
	assert.Equal(t, []int{0, 1}, []int{o.res[0].Index, o.res[1].Index}, "indexes are per call")
	o = r.outcome(fails)
	require.Error(t, o.err)
	assert.True(t, queue.IsInputError(o.err), "the bad call gets its own error: %v", o.err)
	assert.Equal(t, []string{"p1", "p2"}, sorted(partitionsOf(r.unacked())), "only the good calls were applied")
}

func partitionsOf(msgs []queue.Message) []string {
	seen := map[string]bool{}
	var out []string
	for _, m := range msgs {
		if !seen[m.Partition] {
			seen[m.Partition] = true
			out = append(out, m.Partition)
		}
	}
	return out
}

// A caller whose context ends while its merged transaction runs does not
// cancel it while another caller of it still waits: every call in it is
// applied and answered. (Once every caller has gone the run is cancelled:
// TestGroupCommit_EndsWhenItsCallersGiveUp.) A caller whose context ends
// before its turn gets the context's error, and its ack is not applied.
func TestAck_CancelledWaiterDoesNotCancelMergedRun(t *testing.T) {
	r := newAckRig(t)
	m := make([]queue.Message, 3)
	for i := range m {
		m[i] = r.lease(fmt.Sprintf("p%d", i), 1)[0]
	}
	late := r.lease("late", 1)[0]
	second := r.lease("second-blocker", 1)[0]
	releaseSecond := r.block(second)
	releaseFirst, first := r.holdFirst("blocker")

	ctxs := make([]context.Context, 3)
	cancels := make([]context.CancelFunc, 3)
	outs := make([]<-chan ackOutcome, 3)
	for i := range ctxs {
		ctxs[i], cancels[i] = context.WithCancel(context.Background())
		defer cancels[i]()
	}
	// The merged batch holds up on second's row, which stays locked.
	outs[0] = r.ackQueued(ctxs[0], ackOf(m[0], queue.StatusCompleted))
	outs[1] = r.ackQueued(ctxs[1], ackOf(m[1], queue.StatusCompleted), ackOf(second, queue.StatusCompleted))
	outs[2] = r.ackQueued(ctxs[2], ackOf(m[2], queue.StatusCompleted))
	lateCtx, cancelLate := context.WithCancel(context.Background())
	lateOut := r.ackQueued(lateCtx, ackOf(late, queue.StatusCompleted))
	cancelLate()
	releaseFirst()
	require.NoError(t, r.outcome(first).err)

	o := r.outcome(lateOut)
	assert.ErrorIs(t, o.err, context.Canceled, "gone before its turn")
	r.waitForLockWait("the merged ack")
	for _, cancel := range cancels[:len(cancels)-1] {
		cancel() // whichever caller runs the merged transaction among them; the last still waits
	}
	releaseSecond()
	for i, ch := range outs {
		o := r.outcome(ch)
		require.NoError(t, o.err, "call %d", i)
		for _, res := range o.res {
			assert.True(t, res.Success, "call %d: %+v", i, res)
			assert.True(t, res.LeaseReleased, "call %d: %+v", i, res)
		}
	}
	res, err := r.s.Ack(ctxT(t), []queue.Ack{ackOf(late, queue.StatusCompleted)})
	require.NoError(t, err)
	assert.True(t, res[0].LeaseReleased, "the cancelled call's ack was not applied: this one ends the lease")
	assert.Equal(t, []string(nil), partitionsOf(r.unacked()))
}

func sorted(s []string) []string {
	slices.Sort(s)
	return s
}

// Acks queued one after the other on the same
// (partition, group) must apply in that order (QueueAck promises it: a
// WebSocket connection's frames rely on it). The batcher kept them out of
// one batch, but with two flushers the second ran in a batch of its own at
// the same time as the first, and either could win: a completed ack queued
// after a retry that gave the lease back succeeded about one time in five.
// A request waits now for every running batch it overlaps.
func TestAck_QueuedOnOnePairKeepTheirOrder(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	for i := range 60 {
		push(t, s, "ord", "p", 1, 2)
		r := pop(t, s, queue.PopRequest{Queue: "ord", Group: "g", Batch: 2})
		require.Len(t, r.Messages, 2)
		m1, m2 := r.Messages[0], r.Messages[1]
		p1, err := s.QueueAck(ctx, []queue.Ack{{TransactionID: m1.TransactionID, PartitionID: m1.PartitionID,
			LeaseID: m1.LeaseID, Status: queue.StatusRetry, Group: "g"}})
		require.NoError(t, err)
		p2, err := s.QueueAck(ctx, []queue.Ack{{TransactionID: m2.TransactionID, PartitionID: m2.PartitionID,
			LeaseID: m2.LeaseID, Status: queue.StatusCompleted, Group: "g"}})
		require.NoError(t, err)
		var wg sync.WaitGroup
		var r1, r2 []queue.AckResult
		var e1, e2 error
		wg.Go(func() { r1, e1 = p1.Wait() })
		wg.Go(func() { r2, e2 = p2.Wait() })
		wg.Wait()
		require.NoError(t, e1)
		require.NoError(t, e2)
		require.True(t, r1[0].Success, "round %d: the retry gives the lease back", i)
		require.False(t, r2[0].Success, "round %d: the completed ack queued after it finds the lease ended", i)
		// Both come back; finish them for the next round.
		for {
			r := pop(t, s, queue.PopRequest{Queue: "ord", Group: "g", Batch: 10})
			if len(r.Messages) == 0 {
				break
			}
			ackAll(t, s, r, queue.StatusCompleted)
		}
	}
}

// Completions of one lease queued one after the other (a WebSocket stream
// acking each delivery of its following lease as it comes: one frame, one
// call, per push at a thousand a second on one partition) run in one
// transaction, not one each after the other on the row's lock: the row's
// ack rate would be one transaction's, and the stream, out of credit,
// would stall for seconds. Each call is answered as if it ran alone: the
// completion that finishes the lease releases it, and only that one.
func TestAck_CompletionsOfOneLeaseQueuedTogetherShareATransaction(t *testing.T) {
	r := newAckRig(t)
	const calls = 8
	msgs := r.lease("shared", calls)
	res, transactions := r.completeEachWhileHeld(msgs)
	for i, o := range res {
		assert.Equal(t, queue.AckResult{Index: 0, TransactionID: msgs[i].TransactionID, Success: true, Queue: "q",
			Partition: "shared", LeaseReleased: i == calls-1, LeaseID: msgs[i].LeaseID}, o, "call %d", i)
	}
	assert.Equal(t, uint64(2), transactions, "the first ack, then the eight completions in one transaction")
	assert.Equal(t, []string(nil), partitionsOf(r.unacked()), "every ack was applied")
}

// Only completions naming their lease share a pair's transaction: a call
// that may give the lease back (failed) runs after the completions queued
// before it, on its own, and a completion queued after it runs after it,
// finding the lease it gave back gone; so does an ack naming no lease,
// which acts on whatever lease is live when it runs.
func TestAck_CallThatMayGiveTheLeaseBackKeepsItsPlaceAmongCompletions(t *testing.T) {
	r := newAckRig(t)
	msgs := r.lease("shared", 4)
	release, first := r.holdFirst("blocker")
	before := r.ackTransactions()
	done := r.ackQueued(context.Background(), ackOf(msgs[0], queue.StatusCompleted))
	failed := r.ackQueued(context.Background(), ackOf(msgs[1], queue.StatusFailed))
	after := r.ackQueued(context.Background(), ackOf(msgs[2], queue.StatusCompleted))
	noLease := ackOf(msgs[3], queue.StatusCompleted)
	noLease.LeaseID = ""
	leaseless := r.ackQueued(context.Background(), noLease)
	release()

	require.NoError(t, r.outcome(first).err)
	od, of, oa, ol := r.outcome(done), r.outcome(failed), r.outcome(after), r.outcome(leaseless)
	for _, o := range []ackOutcome{od, of, oa, ol} {
		require.NoError(t, o.err)
		require.Len(t, o.res, 1)
	}
	assert.True(t, od.res[0].Success)
	assert.False(t, od.res[0].LeaseReleased)
	assert.True(t, of.res[0].Success)
	assert.True(t, of.res[0].LeaseReleased, "the failed item gives the lease back")
	assert.Equal(t, queue.ErrTextInvalidLease, oa.res[0].Error, "queued after the failed one: its lease is gone")
	assert.True(t, ol.res[0].Success, "with no lease live, a delivered message's ack applies")
	assert.Equal(t, uint64(5), r.ackTransactions()-before, "the first ack, then each call on the pair after the one before it")

	again := pop(t, r.s, queue.PopRequest{Queue: "q", Partition: "shared", Batch: 10})
	assert.Equal(t, []int{2, 3}, payloads(t, again.Messages), "the failed one and the one after it come again")
}
