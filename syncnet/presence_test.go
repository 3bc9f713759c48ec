package syncnet

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// heldPresence makes node 1's presence datagrams (CONSUMER_REGISTERED and
// PRESENCE_SET) be lost while the returned flag holds.
func heldPresence() (*atomic.Bool, func(i int, c *Config)) {
	var held atomic.Bool
	return &held, func(i int, c *Config) {
		if i == 1 {
			c.Drop = func(t Type) bool { return held.Load() && (t == ConsumerRegistered || t == PresenceSet) }
		}
	}
}

// woken reports whether nd was woken for want, and every wake-up it had.
func woken(nd *testNode, want string) (bool, []string) {
	nd.wakes.mu.Lock()
	defer nd.wakes.mu.Unlock()
	for _, got := range nd.wakes.got {
		if got == want {
			return true, append([]string(nil), nd.wakes.got...)
		}
	}
	return false, nil
}

// A push made before this instance heard of a peer's consumer reaches that
// consumer once it hears of it: a CONSUMER_REGISTERED for a queue pushed to
// lately is answered, to that peer alone, with a MESSAGE_AVAILABLE for the
// whole queue. Whatever the timing, the peer either was known at the push
// (woken by it) or becomes known after it (woken by the answer). A queue
// not pushed to lately gets no answer.
func TestPresence_LateRegistrationIsWokenForAPushBeforeIt(t *testing.T) {
	held, tweak := heldPresence()
	nodes := mesh(t, 2, nil, tweak)
	a, b := nodes[0], nodes[1]
	b.SetLocal("quiet", true) // heard at once: nothing was pushed to it
	require.Eventually(t, func() bool {
		has, known := a.HasSubscribers("quiet")
		_, knownOrders := a.HasSubscribers("orders")
		return has && known && knownOrders
	}, 5*time.Second, 10*time.Millisecond, "A knows B's presence")

	held.Store(true)
	b.SetLocal("orders", true) // its CONSUMER_REGISTERED is late (lost, re-announced)
	has, known := a.HasSubscribers("orders")
	require.True(t, known && !has, "A does not know of B's consumer yet")
	before := sentTo(t, a, MessageAvailable)
	a.Notify("orders", "p1")
	assert.Equal(t, before, sentTo(t, a, MessageAvailable), "the push wakes nobody: B is absent to A")

	held.Store(false) // B's next re-announcement arrives
	require.Eventually(t, func() bool { has, _ := a.HasSubscribers("orders"); return has }, 5*time.Second, 5*time.Millisecond,
		"A hears of B's consumer")
	var got []string
	require.Eventually(t, func() bool {
		ok, all := woken(b, "orders/")
		got = all
		return ok
	}, 5*time.Second, 5*time.Millisecond, "B woken for the push it missed")
	assert.NotContains(t, got, "quiet/", "no answer for a queue nothing was pushed to")
	assert.Equal(t, before+1, sentTo(t, a, MessageAvailable), "one answer, to B alone")
}

// The same when the peer's presence arrives by a pull (members: its
// registration lost, its digest differs, the reader pulls its whole set).
func TestPresence_PulledRegistrationIsWokenForAPushBeforeIt(t *testing.T) {
	held, tweak := heldPresence()
	nodes := mesh(t, 2, nil, tweak)
	a, b := nodes[0], nodes[1]
	a.SetPeers(nil)
	b.SetPeers(nil)
	members(a, b)
	require.Eventually(t, func() bool { return a.Known("b:1") }, 5*time.Second, 10*time.Millisecond)

	held.Store(true)
	b.SetLocal("orders", true) // its CONSUMER_REGISTERED is lost
	has, known := a.HasSubscribers("orders")
	require.True(t, known && !has, "A does not know of B's consumer yet")
	a.Notify("orders", "p1")

	held.Store(false)
	require.Eventually(t, func() bool {
		members(a, b) // the table's reads, every MemberRead in the server
		has, _ := a.HasSubscribers("orders")
		return has
	}, 10*time.Second, 50*time.Millisecond, "A pulls B's presence")
	require.Eventually(t, func() bool { ok, _ := woken(b, "orders/"); return ok }, 5*time.Second, 5*time.Millisecond,
		"B woken for the push it missed")
}

// Which queues a presence new to this instance is answered for: a queue
// woken within pushRecall; for a consumer of any queue, the latest ones
// woken, at most answerQueuesMax; past pushedMax queues remembered, any
// queue until pushRecall has passed. A lease release is remembered as a
// push is; a lease acquisition is not.
func TestPresence_AnswerIsForQueuesWokenLately(t *testing.T) {
	nd, err := New(Config{Bind: "127.0.0.1:0", ServerID: "x:1", Waker: newWakes()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = nd.Close() })
	now := time.Now()
	missed := func(added ...string) []string {
		nd.mu.Lock()
		defer nd.mu.Unlock()
		return nd.missedLocked(added, now)
	}
	nd.Notify("pushed", "p")
	nd.LeaseReleased("released", "p", "pid", "g")
	nd.LeaseAcquired("acquired", "p", "pid", "g", now.Add(time.Minute))
	nd.mu.Lock()
	nd.pushed["old"] = now.Add(-pushRecall - time.Second)
	nd.mu.Unlock()
	assert.Equal(t, []string{"pushed", "released"}, missed("pushed", "released", "acquired", "old", "never"))
	assert.ElementsMatch(t, []string{"pushed", "released"}, missed(AnyQueue))

	nd.mu.Lock()
	for i := range answerQueuesMax + 8 {
		nd.pushed[string(rune('A'+i))] = now.Add(time.Duration(i) * time.Millisecond)
	}
	nd.mu.Unlock()
	latest := missed(AnyQueue)
	require.Len(t, latest, answerQueuesMax)
	assert.Equal(t, string(rune('A'+answerQueuesMax+7)), latest[0], "the latest first")

	nd.mu.Lock()
	delete(nd.pushed, "old") // every one remembered is recent: none to prune
	for i := len(nd.pushed); i < pushedMax; i++ {
		nd.pushed[string(rune(0x1000+i))] = now
	}
	nd.pushedLocked("one-too-many", now)
	_, kept := nd.pushed["one-too-many"]
	nd.mu.Unlock()
	assert.False(t, kept, "bounded")
	assert.Equal(t, []string{"never"}, missed("never"), "past the bound, any queue is answered")
}

// A consumer registered while this instance answers a pull (its
// PRESENCE_SET in several datagrams, computed before the consumer came) is
// announced after the set, not between its parts: the set, completed
// after, would undo it, and the peer would not know of the consumer.
func TestPresence_RegistrationDuringAPulledSetIsKept(t *testing.T) {
	h := newSendHold(PresenceSet)
	nodes := mesh(t, 2, nil, func(i int, c *Config) {
		if i == 1 {
			c.Drop = h.drop
		}
	})
	a, b := nodes[0], nodes[1]
	a.SetPeers(nil)
	b.SetPeers(nil)
	members(a, b)
	for i := range 60 { // two datagrams' worth of queue names
		b.SetLocal(fmt.Sprintf("a-queue-with-a-long-name-%03d", i), true)
	}
	require.Eventually(t, func() bool { return a.Known("b:1") }, 5*time.Second, 10*time.Millisecond)
	sets := testutil.ToFloat64(a.m.received.WithLabelValues(PresenceSet.String()))

	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(h.release)
	h.hold(t, &wg, func() { b.sendPresence(a.Addr()) }, "the set (a pull's answer)")
	registered := make(chan struct{})
	wg.Go(func() {
		b.SetLocal("late", true)
		close(registered)
	})
	select { // announced at once, or once the set is sent
	case <-registered:
	case <-time.After(time.Second):
	}
	h.release <- struct{}{}
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(a.m.received.WithLabelValues(PresenceSet.String())) >= sets+2
	}, 5*time.Second, 5*time.Millisecond, "A took the whole set")
	<-registered
	b.SetLocal("marker", true) // after everything B sent before
	require.Eventually(t, func() bool { has, _ := a.HasSubscribers("marker"); return has }, 5*time.Second, 5*time.Millisecond)
	has, _ := a.HasSubscribers("late")
	assert.True(t, has, "A knows of the consumer registered during the set")
}
