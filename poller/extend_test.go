package poller_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
)

// extendingStream subscribes a stream that a push may extend the lease of
// (as a WebSocket subscription is) to queue q, and has it hold partition
// p's lease over message 1: the first delivery, not acked.
func extendingStream(t *testing.T, e *env, q string) (*poller.Intention, <-chan *queue.PopResult, *queue.PopResult) {
	t.Helper()
	in, got := e.subscribe(poller.Intention{Target: queue.Target{Queue: q}, Batch: 10, Credit: 100, Extend: true})
	e.push(q, "p", 1, 1)
	first := receive1(t, got)
	require.Equal(t, []int{1}, ns(first))
	require.NotEmpty(t, first.LeaseID)
	return in, got, first
}

// ackAs acknowledges msgs with status under the lease each names and does
// what the gateway does after: a released lease is told to the poller
// (and its partition woken when messages wait), the credit comes back.
func ackAs(t *testing.T, e *env, in *poller.Intention, status queue.AckStatus, msgs ...queue.Message) []queue.AckResult {
	t.Helper()
	var acks []queue.Ack
	for _, m := range msgs {
		acks = append(acks, queue.Ack{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID,
			Group: m.Group, Status: status})
	}
	out, err := e.store.Ack(context.Background(), acks)
	require.NoError(t, err)
	for i, r := range out {
		if !r.LeaseReleased {
			continue
		}
		m := msgs[i]
		e.p.LeaseReleased(m.Queue, m.Partition, m.PartitionID, m.Group)
		if r.Pending {
			e.p.Wake(poller.SourceAck, m.Queue, m.Partition)
		}
	}
	e.p.AddCredit(in, len(msgs))
	return out
}

// receiveAcking receives n messages, acking each delivery as it comes
// (a failed message may come alone, the rest after its ack).
func receiveAcking(t *testing.T, e *env, in *poller.Intention, got <-chan *queue.PopResult, n int) []queue.Message {
	t.Helper()
	var out []queue.Message
	for len(out) < n {
		res := receive1(t, got)
		out = append(out, res.Messages...)
		for _, r := range ackAs(t, e, in, queue.StatusCompleted, res.Messages...) {
			require.True(t, r.Success, r.Error)
		}
	}
	return out
}

// A stream holding a partition gets the partition's next push while its
// earlier message is still unacked: the push extends the lease over it,
// with no pop and no pre-flight, and the lease ends with the ack of the
// last message it was extended over.
func TestExtend_StreamHoldingAPartitionGetsItsNextPushBeforeItsAck(t *testing.T) {
	e := newEnv(t, slowSweep)
	in, got, first := extendingStream(t, e, "x")
	e.settled()
	stats := e.store.QueryStats()
	before := stats.Snapshot()

	e.push("x", "p", 2, 2)
	second := receive1(t, got)
	assert.Equal(t, []int{2}, ns(second))
	assert.Equal(t, first.LeaseID, second.LeaseID, "under the lease the stream holds")
	e.push("x", "p", 3, 4)
	third := receive1(t, got)
	assert.Equal(t, []int{3, 4}, ns(third))
	e.settled()
	ops := opsBetween(before, stats.Snapshot())
	assert.Zero(t, ops["pop_assigned"], "no pop: %v", ops)
	assert.Zero(t, ops["preflight"], "no pre-flight: %v", ops)

	r := ackAs(t, e, in, queue.StatusCompleted, first.Messages[0], second.Messages[0])
	assert.True(t, r[0].Success && r[1].Success, "%v", r)
	assert.False(t, r[1].LeaseReleased, "the lease holds 3 and 4 still")
	r = ackAs(t, e, in, queue.StatusCompleted, third.Messages...)
	assert.True(t, r[0].Success && r[1].Success, "%v", r)
	assert.True(t, r[1].LeaseReleased, "the ack of the last message it was extended over ends it")
}

// A nack under an extended lease gives back from the first unacked
// message, as for any lease: what followed it comes again in order, the
// failed one with its attempt counted, and acks under the ended lease are
// refused.
func TestExtend_NackRedeliversFromTheFirstUnacked(t *testing.T) {
	e := newEnv(t, slowSweep)
	in, got, first := extendingStream(t, e, "x")
	e.push("x", "p", 2, 2)
	second := receive1(t, got)
	e.push("x", "p", 3, 3)
	third := receive1(t, got)
	require.Equal(t, first.LeaseID, third.LeaseID)

	require.True(t, ackAs(t, e, in, queue.StatusCompleted, first.Messages[0])[0].Success)
	r := ackAs(t, e, in, queue.StatusFailed, second.Messages[0])
	require.True(t, r[0].Success, r[0].Error)
	assert.True(t, r[0].LeaseReleased, "the nack ends the lease")
	r = ackAs(t, e, in, queue.StatusCompleted, third.Messages[0])
	assert.Equal(t, queue.ErrTextInvalidLease, r[0].Error, "3 was extended over the ended lease")

	again := receiveAcking(t, e, in, got, 2)
	assert.Equal(t, []int{2, 3}, ns(&queue.PopResult{Messages: again}), "from the first unacked, in order")
	assert.Equal(t, 1, again[0].RetryCount, "the nack counted an attempt")
	assert.NotEqual(t, first.LeaseID, again[0].LeaseID, "under a new lease")
}

// An extended lease that expires (its consumer stopped acking) gives back
// from its first unacked message, as any lease: everything it was extended
// over comes again, in order, with an attempt counted.
func TestExtend_ExpiryRedeliversFromTheFirstUnacked(t *testing.T) {
	e := newEnv(t, slowSweep)
	_, err := e.store.Configure(context.Background(), queue.ConfigureRequest{Queue: "x", Options: []byte(`{"leaseTime":1}`)})
	require.NoError(t, err)
	in, got, first := extendingStream(t, e, "x")
	e.push("x", "p", 2, 2)
	second := receive1(t, got)
	require.Equal(t, first.LeaseID, second.LeaseID)
	// The stream looks again, as a WebSocket session's lease check has it
	// do: its pre-flight finds the partition blocked until the lease's
	// expiry, which arms the poller's timer (no ack ever comes).
	e.p.AddCredit(in, 0)

	again := receiveAcking(t, e, in, got, 2)
	assert.Equal(t, []int{1, 2}, ns(&queue.PopResult{Messages: again}))
	assert.Equal(t, 1, again[0].RetryCount, "the expiry counted an attempt")
	assert.NotEqual(t, first.LeaseID, again[0].LeaseID)
}

// Two pushes extending one stream's lease at once reach it in offset
// order: the later one's answer, come first, waits for the earlier's
// delivery.
func TestExtend_TwoPushesInFlightAreDeliveredInOrder(t *testing.T) {
	e := newEnv(t, slowSweep)
	_, got, _ := extendingStream(t, e, "x")
	e.settled()
	entered, release := make(chan struct{}), make(chan struct{})
	var once bool
	t.Cleanup(e.p.AfterSettle(func() {
		if !once {
			once = true // only the first push's Settle runs the hook: the second parks before it
			close(entered)
			<-release
		}
	}))
	pushed := make(chan struct{})
	go func() {
		defer close(pushed)
		e.push("x", "p", 2, 2)
	}()
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the first push's hand-off was not settled")
	}
	e.push("x", "p", 3, 3) // its Settle comes while 2's delivery waits
	select {
	case res := <-got:
		t.Fatalf("delivered %v before 2", ns(res))
	default:
	}
	close(release)
	<-pushed
	assert.Equal(t, []int{2}, ns(receive1(t, got)))
	assert.Equal(t, []int{3}, ns(receive1(t, got)))
}

// A message pushed where no hand-off reserved it (another instance) is
// never extended over: a later push here is not handed past it, and both
// come in order once the stream's lease ends.
func TestExtend_PushElsewhereStopsTheExtensionUntilTheLeaseEnds(t *testing.T) {
	e := newEnv(t, slowSweep)
	in, got, first := extendingStream(t, e, "x")
	e.store.SetHandOff(nil) // a push through another instance
	_, err := e.store.Push(context.Background(), []queue.PushItem{{Queue: "x", Partition: "p", Payload: []byte(`{"n":2}`)}})
	require.NoError(t, err)
	e.store.SetHandOff(e.p)
	e.push("x", "p", 3, 3)
	select {
	case res := <-got:
		t.Fatalf("delivered %v while 1's lease holds", ns(res))
	case <-time.After(300 * time.Millisecond):
	}
	r := ackAs(t, e, in, queue.StatusCompleted, first.Messages[0])
	require.True(t, r[0].LeaseReleased && r[0].Pending, "%+v", r[0])
	var next []queue.Message
	for len(next) < 2 {
		next = append(next, receive1(t, got).Messages...)
	}
	assert.Equal(t, []int{2, 3}, ns(&queue.PopResult{Messages: next}))
}
