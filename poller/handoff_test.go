package poller_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
)

// warmLongPoll has a first long-poll of each group on q take message 0 of
// partition p (its pop registers the group's consumer rows) and, with
// manual acks, ack it, so that the groups' rows are caught up: a push
// after it may be handed off.
func warmLongPoll(t *testing.T, e *env, q string, autoAck bool, groups ...string) {
	t.Helper()
	if len(groups) == 0 {
		groups = []string{""}
	}
	var ws []*poller.Waiter
	for _, g := range groups {
		ws = append(ws, e.p.Wait(poller.Intention{Target: queue.Target{Queue: q, Group: g}, Batch: 10, AutoAck: autoAck}))
	}
	e.push(q, "p", 0, 0)
	for _, w := range ws {
		res := receive(t, w, 5*time.Second)
		require.Equal(t, []int{0}, ns(res))
		if !autoAck {
			ackResult(t, e, res)
		}
	}
}

// ackResult completes every message of res, each ack taken, and returns
// the results.
func ackResult(t *testing.T, e *env, res *queue.PopResult) []queue.AckResult {
	t.Helper()
	var acks []queue.Ack
	for _, m := range res.Messages {
		acks = append(acks, queue.Ack{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID, Group: m.Group})
	}
	out, err := e.store.Ack(context.Background(), acks)
	require.NoError(t, err)
	for _, r := range out {
		require.True(t, r.Success, r.Error)
	}
	return out
}

// A long-poll waiting on a partition is answered by the push itself, as a
// subscription is (the hand-off): the push leases it the messages in its
// own transaction, and no pre-flight, cycle or pop of its own runs. The
// one-shot intention ends with that answer; the lease is the client's
// (a restart of the instance leaves it), and its ack completes it.
func TestHandOff_WaitingLongPollIsServedByThePush(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, slowSweep, func(c *poller.Config) { c.Registerer = reg })
	ctx := context.Background()
	warmLongPoll(t, e, "hl", false)
	w := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "hl"}, Batch: 10})
	e.settled()
	handoffs := metricValue(t, reg, "herald_handoffs_total")
	cycles := metricValue(t, reg, "herald_poll_cycles_total")
	stats := e.store.QueryStats()
	before := stats.Snapshot()

	e.push("hl", "p", 1, 3)
	res := receive(t, w, 5*time.Second)
	assert.Equal(t, []int{1, 2, 3}, ns(res))
	require.NotEmpty(t, res.LeaseID)
	for _, m := range res.Messages {
		assert.Equal(t, res.LeaseID, m.LeaseID)
	}
	assert.Equal(t, handoffs+1, metricValue(t, reg, "herald_handoffs_total"), "handed off by the push")
	e.settled()
	ops := opsBetween(before, stats.Snapshot())
	assert.Zero(t, ops["preflight"], "no pre-flight: %v", ops)
	assert.Zero(t, ops["pop_assigned"], "no pop: %v", ops)
	assert.Equal(t, uint64(1), ops["push_insert_lease"], "leased by the statement without the steps of a stream's lease: %v", ops)
	assert.Equal(t, cycles, metricValue(t, reg, "herald_poll_cycles_total"), "no pre-flight cycle")
	assert.Zero(t, e.p.Intentions(), "the long-poll ended with its answer")
	assert.Nil(t, w.Cancel(), "answered once")

	// The lease is the client's, not a stream's of this instance: a
	// restart of the instance gives back none of it.
	freed, err := e.store.ReleaseInstanceLeases(ctx)
	require.NoError(t, err)
	assert.Empty(t, freed, "a long-poll's lease outlives the instance")
	ackResult(t, e, res)
	got, err := e.store.Pop(ctx, queue.PopRequest{Queue: "hl", Batch: 10, AutoAck: true})
	require.NoError(t, err)
	assert.Empty(t, got.Messages, "acked: nothing left")
}

// An autoAck long-poll is handed a push's messages too: the push moves its
// group's cursor past them, and no lease is kept.
func TestHandOff_WaitingAutoAckLongPollIsServedByThePush(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, slowSweep, func(c *poller.Config) { c.Registerer = reg })
	warmLongPoll(t, e, "ha", true, "dash")
	w := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "ha", Group: "dash"}, Batch: 10, AutoAck: true})
	e.settled()
	handoffs := metricValue(t, reg, "herald_handoffs_total")
	stats := e.store.QueryStats()
	before := stats.Snapshot()
	e.push("ha", "p", 1, 2)
	res := receive(t, w, 5*time.Second)
	assert.Equal(t, []int{1, 2}, ns(res))
	assert.Empty(t, res.LeaseID, "autoAck keeps no lease")
	assert.Equal(t, handoffs+1, metricValue(t, reg, "herald_handoffs_total"))
	e.settled()
	ops := opsBetween(before, stats.Snapshot())
	assert.Zero(t, ops["preflight"], "no pre-flight: %v", ops)
	assert.Zero(t, ops["pop_assigned"], "no pop: %v", ops)
	got, err := e.store.Pop(context.Background(), queue.PopRequest{Queue: "ha", Group: "dash", Batch: 10, AutoAck: true})
	require.NoError(t, err)
	assert.Empty(t, got.Messages, "consumed once")
}

// One push answers ONE waiting long-poll per consumer group, the oldest
// (as a cycle would pick): the others keep waiting, and nothing is
// delivered twice.
func TestHandOff_OnePushAnswersOneLongPollPerGroup(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, slowSweep, func(c *poller.Config) { c.Registerer = reg })
	warmLongPoll(t, e, "ho", false, "a", "b")
	a1 := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "ho", Group: "a"}, Batch: 10})
	a2 := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "ho", Group: "a"}, Batch: 10})
	b1 := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "ho", Group: "b"}, Batch: 10})
	e.settled()
	handoffs := metricValue(t, reg, "herald_handoffs_total")
	stats := e.store.QueryStats()
	before := stats.Snapshot()
	e.push("ho", "p", 1, 1)
	assert.Equal(t, []int{1}, ns(receive(t, a1, 5*time.Second)), "the oldest of group a")
	assert.Equal(t, []int{1}, ns(receive(t, b1, 5*time.Second)), "group b's own copy")
	e.settled()
	nothing(t, a2, 50*time.Millisecond)
	assert.Equal(t, 1, e.p.Intentions(), "a2 still waits")
	assert.Equal(t, handoffs+2, metricValue(t, reg, "herald_handoffs_total"), "one hand-off per group")
	ops := opsBetween(before, stats.Snapshot())
	assert.Zero(t, ops["pop_assigned"], "no pop: %v", ops)
	assert.Nil(t, a2.Cancel())
}

// handOffHook runs during before each Settle of a reservation: the push
// has committed, its hand-off is not settled yet.
type handOffHook struct {
	queue.HandOff
	during func(r queue.Reservation, res *queue.PopResult)
}

func (h handOffHook) Settle(r queue.Reservation, res *queue.PopResult) {
	h.during(r, res)
	h.HandOff.Settle(r, res)
}

// A long-poll whose client goes away while a push hands it messages (its
// wait ends between the push's commit and the delivery) loses nothing:
// its Cancel waits for the hand-off under way and returns what it was
// given (with autoAck the push consumed it), for the caller to answer or
// give back.
func TestHandOff_LongPollGoneDuringHandOffLosesNothing(t *testing.T) {
	for _, autoAck := range []bool{false, true} {
		name := "ManualAck"
		if autoAck {
			name = "AutoAck"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, slowSweep)
			ctx := context.Background()
			warmLongPoll(t, e, "hg", autoAck)
			w := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "hg"}, Batch: 10, AutoAck: autoAck})
			e.settled()
			cancelled := make(chan *queue.PopResult, 1)
			leased := make(chan bool, 1)
			e.store.SetHandOff(handOffHook{HandOff: e.p, during: func(_ queue.Reservation, res *queue.PopResult) {
				leased <- res != nil
				// The long-poll's wait ends now, in the hand-off's way.
				go func() { cancelled <- w.Cancel() }()
				select {
				case got := <-cancelled:
					cancelled <- got
					t.Log("Cancel returned before the hand-off was settled")
				case <-time.After(200 * time.Millisecond): // it waits for the hand-off
				}
			}})
			e.push("hg", "p", 1, 2)
			select {
			case ok := <-leased:
				require.True(t, ok, "the push leased to the long-poll")
			default:
				t.Fatal("the push reserved nothing for the waiting long-poll")
			}
			var got *queue.PopResult
			select {
			case got = <-cancelled:
			case <-time.After(10 * time.Second):
				t.Fatal("Cancel did not return")
			}
			require.NotNil(t, got, "the hand-off under way gave messages 1 and 2 to the long-poll: Cancel returns them")
			assert.Equal(t, []int{1, 2}, ns(got))
			if autoAck {
				res, err := e.store.Pop(ctx, queue.PopRequest{Queue: "hg", AutoAck: true, Batch: 10})
				require.NoError(t, err)
				assert.Empty(t, res.Messages, "taken once")
				return
			}
			// What the gateway does for a client that left: give the lease
			// back, and the messages are there for the next consumer now.
			e.p.Release(ctx, got.LeaseID, got.Messages)
			res, err := e.store.Pop(ctx, queue.PopRequest{Queue: "hg", AutoAck: true, Batch: 10})
			require.NoError(t, err)
			assert.Equal(t, []int{1, 2}, ns(res), "given back at once, not at lease expiry")
		})
	}
}

// A long-poll whose deadline passes while a push hands it messages, and a
// cycle runs meanwhile, is still given them: the cycle does not end an
// intention a hand-off is serving (with autoAck, that would lose the
// messages the push consumed for it).
func TestHandOff_LongPollPastItsDeadlineDuringHandOffIsAnswered(t *testing.T) {
	e := newEnv(t, slowSweep)
	warmLongPoll(t, e, "hd", true)
	deadline := time.Now().Add(time.Second)
	w := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "hd"}, Batch: 10, AutoAck: true, Deadline: deadline})
	e.settled()
	leased, cycled := make(chan bool, 1), make(chan bool, 1)
	e.store.SetHandOff(handOffHook{HandOff: e.p, during: func(_ queue.Reservation, res *queue.PopResult) {
		leased <- res != nil
		<-time.After(time.Until(deadline) + 10*time.Millisecond)
		runs := e.p.WorkerRuns()
		e.p.Wake(poller.SourceAck, "hd", "") // a cycle past the deadline
		ran := false
		for end := time.Now().Add(5 * time.Second); !ran && time.Now().Before(end); {
			<-time.After(5 * time.Millisecond)
			ran = e.p.WorkerRuns() > runs && !e.p.Pending()
		}
		cycled <- ran
	}})
	e.push("hd", "p", 1, 1)
	select {
	case ok := <-leased:
		require.True(t, ok, "the push leased to the long-poll")
	default:
		t.Fatal("the push reserved nothing for the waiting long-poll")
	}
	require.True(t, <-cycled, "a cycle ran past the deadline during the hand-off")
	assert.Equal(t, []int{1}, ns(receive(t, w, 5*time.Second)), "answered, not lost")
}

// A long-poll that registers while messages wait for it on several
// partitions is answered by its cycle with all of them in one batch, not
// by a push's hand-off with its own partition's: no cycle has found it
// caught up yet. (Handed each push as it came, a long-poll's client came
// back for every message: at 1,000 msgs/s over 16 partitions its p99 went
// from 100 ms to 1 s.)
func TestHandOff_LongPollWithMessagesWaitingIsAnsweredByItsCycleInOneBatch(t *testing.T) {
	e := newEnv(t, slowSweep, oneWorker)
	ctx := context.Background()
	e.push("q", "a", 1, 1)
	e.push("q", "b", 2, 2)
	e.push("q", "c", 0, 0)
	res, err := e.store.Pop(ctx, queue.PopRequest{Queue: "q", Partition: "c", AutoAck: true, Batch: 10})
	require.NoError(t, err)
	require.Equal(t, []int{0}, ns(res), "c is caught up; 1 waits on a, 2 on b")

	// The one worker is busy delivering elsewhere while the long-poll
	// registers and a push to c comes.
	e.push("blk", "p", 0, 0)
	b := newBlocker(t)
	b.armed.Store(true)
	t.Cleanup(e.p.Register(&poller.Intention{Target: queue.Target{Queue: "blk"}, AutoAck: true,
		Deliver: func(*queue.PopResult) bool { b.block(); return true }}))
	b.waitEntered(t)
	w := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q"}, Batch: 10, Partitions: 3})
	e.push("q", "c", 3, 3)
	b.unblock()
	got := receive(t, w, 5*time.Second)
	assert.ElementsMatch(t, []int{1, 2, 3}, ns(got), "one answer with what waited on a, b and c")
	assert.Equal(t, 3, got.PartitionsClaimed)
}

// caughtUpLongPoll consumes (autoAck) one message on each of q's
// partitions a and b, so that the group is caught up on both, and returns
// an autoAck long-poll of q waiting once its registration's cycle is over.
func caughtUpLongPoll(t *testing.T, e *env, q string) *poller.Waiter {
	t.Helper()
	e.push(q, "a", 0, 0)
	e.push(q, "b", 0, 0)
	res, err := e.store.Pop(context.Background(), queue.PopRequest{Queue: q, AutoAck: true, Batch: 10, Partitions: 2})
	require.NoError(t, err)
	require.Len(t, res.Messages, 2, "both partitions caught up")
	w := e.p.Wait(poller.Intention{Target: queue.Target{Queue: q}, Batch: 10, Partitions: 2, AutoAck: true})
	e.settled()
	return w
}

// A push to two partitions answers a waiting long-poll once, with one
// partition's messages (its one-shot intention ends there); the other
// partition's message is left for the next consumer, neither lost nor
// delivered twice.
func TestHandOff_PushToTwoPartitionsAnswersALongPollOnce(t *testing.T) {
	e := newEnv(t, slowSweep)
	ctx := context.Background()
	w := caughtUpLongPoll(t, e, "h2")
	_, err := e.store.Push(ctx, append(pushItems("h2", "a", 1, 1), pushItems("h2", "b", 2, 2)...))
	require.NoError(t, err)
	got := receive(t, w, 5*time.Second)
	require.Len(t, got.Messages, 1, "one partition's, by the push")
	rest := restOfAB(t, e, "h2")
	assert.ElementsMatch(t, []int{1, 2}, append(ns(got), ns(rest)...), "each once")
	e.settled()
	left, err := e.store.Pop(ctx, queue.PopRequest{Queue: "h2", AutoAck: true, Batch: 10, Partitions: 2})
	require.NoError(t, err)
	assert.Empty(t, left.Messages)
}

// The lease a push hands a subscription is its stream's, this instance's:
// a restart of the instance gives it back (where a long-poll's outlives
// it: TestHandOff_WaitingLongPollIsServedByThePush).
func TestHandOff_SubscriptionLeaseEndsWithARestartOfTheInstance(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, slowSweep, func(c *poller.Config) { c.Registerer = reg })
	in, got := e.subscribe(poller.Intention{Target: queue.Target{Queue: "hs"}, Batch: 10, Credit: 100})
	e.push("hs", "p", 0, 0) // registers the group, learns the partition
	ackAll(t, e, in, receive1(t, got))
	e.settled()
	handoffs := metricValue(t, reg, "herald_handoffs_total")
	e.push("hs", "p", 1, 1)
	res := receive1(t, got)
	require.Equal(t, handoffs+1, metricValue(t, reg, "herald_handoffs_total"), "handed off by the push")
	require.NotEmpty(t, res.LeaseID)
	freed, err := e.store.ReleaseInstanceLeases(context.Background())
	require.NoError(t, err)
	require.Len(t, freed, 1, "the stream's lease is given back")
	assert.Equal(t, "hs", freed[0].Queue)
}

// A long-poll a push's hand-off answers is never handed a second push's
// messages: from the moment the first push's hand-off is settled, the
// one-shot intention has its answer and no credit left, though its
// delivery is still under way. A second push (another partition) in that
// moment leased it its message too (with autoAck it moved the cursor past
// it): one of the two deliveries found the intention ended and gave its
// messages back; with autoAck nothing was given back, and the message was
// lost.
func TestHandOff_LongPollAnsweredByOnePushIsNotHandedAnothers(t *testing.T) {
	e := newEnv(t, slowSweep)
	ctx := context.Background()
	w := caughtUpLongPoll(t, e, "h3")
	// A first push's hand-off settled: the second comes in before the
	// first delivery.
	var second atomic.Bool
	var secondErr error
	defer e.p.AfterSettle(func() {
		if second.CompareAndSwap(false, true) {
			_, secondErr = e.store.Push(ctx, pushItems("h3", "b", 2, 2))
		}
	})()
	_, err := e.store.Push(ctx, pushItems("h3", "a", 1, 1))
	require.NoError(t, err)
	require.NoError(t, secondErr)
	require.True(t, second.Load(), "the first push was handed off")
	got := receive(t, w, 5*time.Second)
	require.Len(t, got.Messages, 1, "one push's")

	rest := restOfAB(t, e, "h3")
	assert.ElementsMatch(t, []int{1, 2}, append(ns(got), ns(rest)...), "each once, none lost")
}

// restOfAB is what a new long-poll of q (autoAck, both partitions) gets
// once partitions a and b are woken: what a first consumer left.
func restOfAB(t *testing.T, e *env, q string) *queue.PopResult {
	t.Helper()
	e.p.Wake(poller.SourcePush, q, "a")
	e.p.Wake(poller.SourcePush, q, "b")
	next := e.p.Wait(poller.Intention{Target: queue.Target{Queue: q}, Batch: 10, Partitions: 2, AutoAck: true})
	return receive(t, next, 5*time.Second)
}

// An autoAck subscription gets a partition's messages in push order when
// two pushes hand off to it back to back. An autoAck hand-off moves the
// cursor at its push's commit and keeps no lease, so nothing held the
// second push back until the first's delivery: its hand-off delivered on
// its own push's goroutine and overtook the first's (a browser tab saw 2
// before 1).
func TestHandOff_AutoAckSubscriptionGetsBackToBackPushesInOrder(t *testing.T) {
	e := newEnv(t, slowSweep)
	ctx := context.Background()
	_, got := e.subscribe(poller.Intention{Target: queue.Target{Queue: "ho"}, Batch: 10, Credit: 100, AutoAck: true})
	e.push("ho", "p", 0, 0) // registers the group, learns the partition
	require.Equal(t, []int{0}, ns(receive1(t, got)))
	e.p.Wake(poller.SourcePush, "ho", "p") // a cycle that finds it caught up
	e.settled()
	var second atomic.Bool
	var secondErr error
	defer e.p.AfterSettle(func() {
		if second.CompareAndSwap(false, true) {
			// The first push's hand-off is settled, its delivery not yet
			// made: the second push comes in now.
			_, secondErr = e.store.Push(ctx, pushItems("ho", "p", 2, 2))
			e.p.Wake(poller.SourcePush, "ho", "p")
		}
	})()
	_, err := e.store.Push(ctx, pushItems("ho", "p", 1, 1))
	require.NoError(t, err)
	require.NoError(t, secondErr)
	require.True(t, second.Load(), "the first push was handed off")
	var order []int
	for len(order) < 2 {
		order = append(order, ns(receive1(t, got))...)
	}
	assert.Equal(t, []int{1, 2}, order, "in push order, each once")
}

// A push handed off to a subscription whose consumer has just gone (its
// Deliver refuses: the connection closed before the intention was
// withdrawn) is given back, and the group's next subscription gets it at
// once, not at the sweep: the mark that the push served the group is stale
// once the lease it took is given back.
func TestHandOff_RefusedByAGoneSubscriptionGoesToTheNextAtOnce(t *testing.T) {
	e := newEnv(t, slowSweep)
	warmLongPoll(t, e, "hg", false)
	var withdraw func()
	var refused atomic.Int32
	gone := &poller.Intention{Target: queue.Target{Queue: "hg"}, Batch: 10, Credit: 10, Standing: true,
		Deliver: func(*queue.PopResult) bool {
			if refused.Add(1) == 1 {
				go withdraw() // as a closing session cancels its subscriptions
			}
			return false
		}}
	withdraw = e.p.Register(gone)
	got := make(chan *queue.PopResult, 10)
	t.Cleanup(e.p.Register(&poller.Intention{Target: queue.Target{Queue: "hg"}, Batch: 10, Credit: 10, Standing: true,
		Deliver: func(res *queue.PopResult) bool { got <- res; return true }}))
	e.settled()

	e.push("hg", "p", 1, 1)
	select {
	case res := <-got:
		assert.Equal(t, []int{1}, ns(res))
	case <-time.After(10 * time.Second): // the sweep is a minute away
		t.Fatalf("the next subscription did not get the message (refused %d times)", refused.Load())
	}
	assert.Positive(t, refused.Load(), "the push handed it to the gone subscription first")
}
