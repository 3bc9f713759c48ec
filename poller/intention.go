package poller

import (
	"sync"
	"time"

	"github.com/heraldmq/herald/queue"
)

// Intention is one waiting consumer: what it wants, how much it may take,
// until when, and where the messages go. Fields are read-only once
// registered.
type Intention struct {
	Target     queue.Target
	Batch      int  // messages per delivery; zero means 1
	Partitions int  // partitions a wildcard intention may claim; zero means 1
	AutoAck    bool // deliver at-most-once, keeping no lease
	// Subject is who the consumer is (its token's sub; "" for none): the
	// leases it gets record it (queue.Assignment.Subject).
	Subject string
	// Credit is how many messages it may take before AddCredit; zero means
	// Batch. A long-poll takes one batch; a streaming subscription takes
	// maxInFlight − unacked.
	Credit int
	// Deadline, when set, ends the intention unserved.
	Deadline time.Time
	// Standing intentions stay registered after a delivery (subscriptions);
	// the others end with their first delivery (long-polls). A standing
	// intention's leases are its stream's, given back when the instance
	// restarts (queue.Assignment.Stream); a long-poll's are its client's.
	Standing bool
	// Extend lets a push here extend the lease this standing intention
	// holds on a partition over the push's messages, so that it gets them
	// before it acks the earlier ones (extend.go). Its consumer then holds
	// several deliveries under one lease: a nack of one ends the lease for
	// all, which come again; its transport answers their own nacks
	// accordingly.
	Extend bool
	// Deliver receives leased messages. A poller worker calls it, or the
	// goroutine of a push that handed messages off to it, with no poller
	// lock held; it must not block. It returns
	// false when the consumer is gone; the poller then releases the lease at
	// once, so nothing waits for it to expire.
	Deliver func(*queue.PopResult) bool
	// Hold, when set and true, makes the intention take nothing for now, as
	// if it had no credit: its consumer cannot take more (a full write
	// buffer). It is read with the worker's mutex held, the one callback
	// that is (doc.go, Concurrency): it must be a plain load that takes no
	// lock and calls nothing. Call AddCredit(in, 0) once it may take again.
	Hold func() bool

	// Set at registration, then guarded by the owning worker's mutex.
	key    string
	seq    uint64
	credit int
	// reserved: credit a push in flight holds for a hand-off (Reserve
	// until Settle).
	reserved int
	// serving: pops and push hand-offs under way for this intention, from
	// hold or Reserve until their result is delivered; counted for a
	// one-shot intention and an autoAck subscription (counted). A one-shot
	// intention's cancel waits for them, and a cycle does not end it at its
	// deadline meanwhile, so a long-poll whose wait ends mid-pop gets what
	// the pop took (with autoAck the pop consumed it) instead of losing it.
	// An autoAck subscription takes nothing meanwhile (inOrder): each moves
	// its cursor at its commit and keeps no lease, so a second one would
	// take the same partition's next messages and could deliver them
	// first; what passed it over looks again once delivered (doneServing).
	serving int
	// answered: a pop or a push's hand-off leased this one-shot intention
	// messages, and their delivery (which ends it) is under way: it takes
	// nothing more (charge), or a second push in between would lease it
	// messages that delivery finds it ended for (with autoAck, consumed).
	answered bool
	gone     bool
	// missed: a cycle passed it over while it could take nothing (no
	// credit, or held), so when it can take again its queue must be looked
	// at; otherwise new credit alone finds nothing a pre-flight would not
	// have found already.
	missed bool
	// limited: its last delivery took all it could (or left messages
	// behind), so credit given back may find more. A one-shot intention
	// is limited from its registration until a cycle found nothing for
	// it (or its target was known to have nothing waiting and nothing
	// hinted: keyState.known): until then messages may wait for it across
	// partitions, which a cycle answers in one batch, not a push's
	// hand-off with its own partition's.
	limited bool
}

// take is the most messages one cycle leases for the intention: a batch
// for a one-shot intention (a long-poll answers with one batch); for a
// standing one, a batch from each partition it may claim, within its credit,
// delivered a batch at a time (see worker.deliver). Called with the owning
// worker's mutex.
func (in *Intention) take() int {
	if !in.Standing {
		return min(in.Batch, in.free())
	}
	return min(max(in.Partitions, 1)*in.Batch, in.free())
}

// free is the credit no push in flight holds. Called with the owning
// worker's mutex.
func (in *Intention) free() int { return in.credit - in.reserved }

// ready reports whether the intention may take messages now. Called with
// the owning worker's mutex.
func (in *Intention) ready() bool {
	return !in.answered && in.free() > 0 && !in.inOrder() && (in.Hold == nil || !in.Hold())
}

// counted reports whether the pops and hand-offs under way for the
// intention are counted (serving): a one-shot intention's, and an autoAck
// subscription's.
func (in *Intention) counted() bool { return !in.Standing || in.AutoAck }

// inOrder reports whether the intention is an autoAck subscription with a
// pop or a hand-off under way (serving), which must be delivered before it
// takes more. Called with the owning worker's mutex.
func (in *Intention) inOrder() bool { return in.Standing && in.AutoAck && in.serving > 0 }

// targetKey groups intentions that are woken together: one queue, or one
// namespace/task pattern.
func targetKey(t queue.Target) string {
	if t.Queue != "" {
		return "q:" + t.Queue
	}
	return "n:" + t.Namespace + "\x00" + t.Task + "\x00" + t.QueueMatch
}

// Waiter is a one-shot intention whose delivery arrives on a channel: the
// long-poll's view of the poller.
type Waiter struct {
	ch     chan *queue.PopResult
	cancel func()

	mu    sync.Mutex
	state int // waiterWaiting, waiterDelivered, waiterCancelled
}

const (
	waiterWaiting = iota
	waiterDelivered
	waiterCancelled
)

// Wait registers a one-shot intention and returns its Waiter. in.Deliver
// and in.Standing are set by Wait.
func (p *Poller) Wait(in Intention) *Waiter {
	w := &Waiter{ch: make(chan *queue.PopResult, 1)}
	in.Deliver = w.deliver
	in.Standing = false
	w.cancel = p.Register(&in)
	return w
}

func (w *Waiter) deliver(res *queue.PopResult) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state != waiterWaiting {
		return false
	}
	w.state = waiterDelivered
	w.ch <- res // buffered: never blocks
	return true
}

// C delivers the leased messages, once.
func (w *Waiter) C() <-chan *queue.PopResult { return w.ch }

// Cancel withdraws the intention. If messages were delivered but not yet
// received from C, it returns them: the caller must use them or release
// their lease, so that a consumer that leaves never swallows a message.
func (w *Waiter) Cancel() *queue.PopResult {
	w.cancel()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state == waiterWaiting {
		w.state = waiterCancelled
		return nil
	}
	select {
	case res := <-w.ch:
		return res
	default:
		return nil
	}
}
