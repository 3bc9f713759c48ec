package poller_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
)

// TestWorker_NoCallbackUnderLock checks the rule of doc.go's Concurrency
// section: no callback runs while a poller mutex is held. Each subtest
// blocks one callback (Deliver, OnPresence, LeaseHints) on a poller with a
// single worker, so every queue shares that worker's mutex, and meanwhile
// calls the poller's entry points from another goroutine: registering and
// cancelling, wake-ups, credit, a push handed off (Reserve, Settle). They
// must all return while the callback is blocked; a lock held across the
// callback would hold them until the 10 s ceiling.
func TestWorker_NoCallbackUnderLock(t *testing.T) {
	t.Run("Deliver", testDeliverBlocked)
	t.Run("OnPresence", testPresenceBlocked)
	t.Run("LeaseHints", testHintsBlocked)
}

// blocker is one blocked callback: the first call after arm signals
// entered and waits for release (at most 10 s, so a failing test ends).
type blocker struct {
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func newBlocker(t *testing.T) *blocker {
	b := &blocker{entered: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(b.unblock) // before the poller stops: cleanups run last first
	return b
}

// block blocks if armed (once).
func (b *blocker) block() {
	if !b.armed.CompareAndSwap(true, false) {
		return
	}
	close(b.entered)
	select {
	case <-b.release:
	case <-time.After(10 * time.Second):
	}
}

func (b *blocker) unblock() { b.once.Do(func() { close(b.release) }) }

// waitEntered waits until the callback is blocked.
func (b *blocker) waitEntered(t *testing.T) {
	t.Helper()
	select {
	case <-b.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the callback was never called")
	}
}

// within runs f on another goroutine and fails the test unless it returns
// within 10 s: the poller's entry points it calls are held by a lock.
func within(t *testing.T, f func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the poller's entry points blocked while a callback ran: a lock is held across it")
	}
}

// entryPoints calls what the gateway and the wake sources call, on a queue
// other than the blocked one (same worker).
func entryPoints(e *env, in *poller.Intention) {
	cancel := e.p.Register(&poller.Intention{Target: queue.Target{Queue: "other"},
		Deliver: func(*queue.PopResult) bool { return false }})
	e.p.Wake(poller.SourcePush, "other", "p")
	e.p.Wake(poller.SourceAck, "q", "")
	e.p.WakeAll("test")
	if in != nil {
		e.p.AddCredit(in, 0)
	}
	_ = e.p.Intentions()
	cancel()
}

func pushItems(q, part string, from, to int) []queue.PushItem {
	var items []queue.PushItem
	for i := from; i <= to; i++ {
		items = append(items, queue.PushItem{Queue: q, Partition: part, Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))})
	}
	return items
}

func oneWorker(c *poller.Config) { c.Workers = 1 }

// Deliver blocks on the worker goroutine; a push meanwhile hands off to a
// subscription of another group on the same queue (Reserve and Settle take
// the worker's mutex).
func testDeliverBlocked(t *testing.T) {
	e := newEnv(t, slowSweep, oneWorker)
	sub, subGot := e.subscribe(poller.Intention{Target: queue.Target{Queue: "q", Group: "g2"}, Batch: 10, Credit: 100})
	e.push("q", "p", 0, 0) // the queue, g2's registration
	ackAll(t, e, sub, receive1(t, subGot))
	first := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q"}, AutoAck: true}) // the default group's
	receive(t, first, 5*time.Second)
	e.settled()
	e.push("q", "p", 1, 3) // g2 by the hand-off; the default group's wait for the long-poll
	ackAll(t, e, sub, receive1(t, subGot))
	e.settled()

	b := newBlocker(t)
	b.armed.Store(true)
	var mu sync.Mutex
	var calls int
	var got []int
	// Its registration's cycle pops 1–3 for it, on the worker goroutine (a
	// long-poll waiting before the push would be handed them by the push).
	cancel := e.p.Register(&poller.Intention{Target: queue.Target{Queue: "q"}, Batch: 10, Deliver: func(res *queue.PopResult) bool {
		mu.Lock()
		calls++
		got = append(got, ns(res)...)
		mu.Unlock()
		b.block()
		return true
	}})
	defer cancel()
	b.waitEntered(t)

	var handed []int
	within(t, func() error {
		entryPoints(e, sub)
		if _, err := e.store.Push(context.Background(), pushItems("q", "p", 4, 5)); err != nil {
			return err
		}
		select {
		case res := <-subGot: // Settle delivered it when the push was over
			handed = ns(res)
			return nil
		case <-time.After(5 * time.Second):
			return errors.New("the hand-off delivered nothing")
		}
	})
	assert.Equal(t, []int{4, 5}, handed)
	b.unblock()
	e.settled()
	mu.Lock()
	assert.Equal(t, 1, calls, "one delivery to the long-poll")
	assert.Equal(t, []int{1, 2, 3}, got, "once, in order")
	mu.Unlock()
	select {
	case res := <-subGot:
		t.Fatalf("delivered again to the subscription: %v", ns(res))
	default:
	}
}

// OnPresence blocks in a cancel (the withdrawal of the queue's consumer).
func testPresenceBlocked(t *testing.T) {
	b := newBlocker(t)
	e := newEnv(t, slowSweep, oneWorker, func(c *poller.Config) {
		c.OnPresence = func(q string, present bool) bool {
			if q == "gone" && !present {
				b.block()
			}
			return false
		}
	})
	cancel := e.p.Register(&poller.Intention{Target: queue.Target{Queue: "gone"},
		Deliver: func(*queue.PopResult) bool { return false }})
	e.settled()
	b.armed.Store(true)
	cancelled := make(chan struct{})
	go func() {
		defer close(cancelled)
		cancel()
	}()
	b.waitEntered(t)
	within(t, func() error {
		entryPoints(e, nil)
		_, err := e.store.Push(context.Background(), pushItems("q", "p", 1, 1))
		return err
	})
	b.unblock()
	<-cancelled
	assert.Zero(t, e.p.Intentions())
}

// LeaseHints blocks in a push hint's fast path (LeasedElsewhere). No
// hand-off: the push would answer the long-poll itself.
func testHintsBlocked(t *testing.T) {
	h := &blockingHints{b: newBlocker(t)}
	e := newEnv(t, slowSweep, oneWorker, func(c *poller.Config) { c.Hints = h; c.NoHandOff = true })
	first := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q"}, AutoAck: true})
	e.push("q", "p", 0, 0) // the queue, its partition id, the group's rows
	receive(t, first, 5*time.Second)
	w := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q"}})
	defer w.Cancel()
	e.settled()
	h.b.armed.Store(true)
	e.push("q", "p", 1, 1)
	h.b.waitEntered(t)
	within(t, func() error {
		entryPoints(e, nil)
		return nil
	})
	h.b.unblock()
	assert.Equal(t, []int{1}, ns(receive(t, w, 5*time.Second)))
}

// blockingHints knows of no lease elsewhere; its LeasedElsewhere blocks
// when armed.
type blockingHints struct{ b *blocker }

func (h *blockingHints) LeaseAcquired(string, string, string, string, time.Time) {}
func (h *blockingHints) LeaseReleased(string, string, string, string)            {}
func (h *blockingHints) HintAudited(bool)                                        {}

func (h *blockingHints) LeasedElsewhere(string, string) (time.Time, bool) {
	h.b.block()
	return time.Time{}, false
}
