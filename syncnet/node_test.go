package syncnet

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type wakes struct {
	mu  sync.Mutex
	got []string
	ch  chan string
}

func newWakes() *wakes { return &wakes{ch: make(chan string, 100)} }

func (w *wakes) Wake(_, q, p string) {
	w.mu.Lock()
	w.got = append(w.got, q+"/"+p)
	w.mu.Unlock()
	select { // a test that floods wake-ups reads got, not ch
	case w.ch <- q + "/" + p:
	default:
	}
}

func (w *wakes) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.got)
}

type testNode struct {
	*Node
	reg   *prometheus.Registry
	wakes *wakes
	stop  func()
}

// mesh starts n nodes on loopback that know each other.
func mesh(t *testing.T, n int, drop func(Type) bool, tweak ...func(i int, c *Config)) []*testNode {
	t.Helper()
	var nodes []*testNode
	for i := range n {
		reg := prometheus.NewRegistry()
		w := newWakes()
		cfg := Config{Bind: "127.0.0.1:0", Secret: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
			ServerID: string(rune('a'+i)) + ":1", Waker: w, Heartbeat: 50 * time.Millisecond, DeadAfter: 300 * time.Millisecond,
			Announce: 100 * time.Millisecond, Drop: drop, Registerer: reg}
		for _, f := range tweak {
			f(i, &cfg)
		}
		nd, err := New(cfg)
		require.NoError(t, err)
		nodes = append(nodes, &testNode{Node: nd, reg: reg, wakes: w})
	}
	for i, nd := range nodes {
		var peers []string
		for j, o := range nodes {
			if i != j {
				peers = append(peers, o.Addr().String())
			}
		}
		nd.SetPeers(peers)
	}
	for _, nd := range nodes {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = nd.Run(ctx)
		}()
		nd.stop = func() {
			cancel()
			<-done
		}
		t.Cleanup(nd.stop)
	}
	return nodes
}

func sentTo(t *testing.T, nd *testNode, typ Type) float64 {
	t.Helper()
	return testutil.ToFloat64(nd.m.sent.WithLabelValues(typ.String()))
}

// A consumer on C only: a push through A wakes C and sends nothing to B;
// once C is dead, A stops targeting it.
func TestNode_TargetedWakeups(t *testing.T) {
	nodes := mesh(t, 3, nil)
	a, b, c := nodes[0], nodes[1], nodes[2]
	c.SetLocal("orders", true)
	require.Eventually(t, func() bool {
		has, known := a.HasSubscribers("orders")
		_, complete := a.HasSubscribers("invoices")
		return has && known && complete
	}, 5*time.Second, 10*time.Millisecond, "A learns C's presence, and knows B's")
	require.Eventually(t, func() bool { return testutil.ToFloat64(a.m.dead) == 0 }, 10*time.Second, 10*time.Millisecond,
		"no configured peer dead once all are heard")
	has, known := a.HasSubscribers("invoices")
	assert.False(t, has)
	assert.True(t, known, "presence is complete: nobody has invoices")

	before := sentTo(t, a, MessageAvailable)
	start := time.Now()
	a.Notify("orders", "p1")
	select {
	case got := <-c.wakes.ch:
		assert.Equal(t, "orders/p1", got)
		t.Logf("C woken %v after the push", time.Since(start))
	case <-time.After(2 * time.Second):
		t.Fatal("C was not woken")
	}
	assert.Equal(t, before+1, sentTo(t, a, MessageAvailable), "one datagram: to C only")
	assert.Equal(t, uint64(1), a.Stats().Counters["notify:absent"], "B skipped")
	assert.Equal(t, uint64(1), a.Stats().Counters["notify:present"], "C targeted")
	assert.Zero(t, b.wakes.count(), "B has no consumer and got nothing")

	// C goes away: A sees it dead and stops targeting it.
	c.stop()
	require.Eventually(t, func() bool {
		has, _ := a.HasSubscribers("orders")
		return !has
	}, 6*time.Second, 10*time.Millisecond, "A sees C dead within 6 s")
	before = sentTo(t, a, MessageAvailable)
	a.Notify("orders", "p2")
	assert.Equal(t, before, sentTo(t, a, MessageAvailable), "nothing to a dead peer or one without consumers")
	require.Eventually(t, func() bool { return testutil.ToFloat64(a.m.alive) == 1 }, 10*time.Second, 10*time.Millisecond, "only B alive")
	assert.Equal(t, 1.0, testutil.ToFloat64(a.m.dead), "C dead (the peer-dead alert reads it)")

	// The last consumer leaving announces it.
	b.SetLocal("x", true)
	require.Eventually(t, func() bool { has, _ := a.HasSubscribers("x"); return has }, 5*time.Second, 10*time.Millisecond)
	b.SetLocal("x", false)
	require.Eventually(t, func() bool { has, _ := a.HasSubscribers("x"); return !has }, 5*time.Second, 10*time.Millisecond)
}

// With 30% of the datagrams lost, presence heals by re-announcement and
// targeted wake-ups still arrive (a lost one only costs latency: the sweep
// and NOTIFY cover it in the server).
func TestNode_LossyNetworkHeals(t *testing.T) {
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2)) // #nosec G404 -- test randomness
	drop := func(Type) bool {
		mu.Lock()
		defer mu.Unlock()
		return rng.Float64() < 0.3
	}
	nodes := mesh(t, 2, drop)
	a, c := nodes[0], nodes[1]
	c.SetLocal("q", true)
	require.Eventually(t, func() bool { has, known := a.HasSubscribers("q"); return has && known }, 10*time.Second, 10*time.Millisecond,
		"presence gets through by re-announcement")
	delivered := 0
	for i := 0; i < 50; i++ {
		a.Notify("q", "p")
		select {
		case <-c.wakes.ch:
			delivered++
		case <-time.After(200 * time.Millisecond):
		}
	}
	assert.Greater(t, delivered, 20, "about 70 percent arrive (35 expected; 20 is 4.6 standard deviations below)")
	assert.Less(t, delivered, 50, "and some are lost")
	assert.Positive(t, testutil.ToFloat64(c.m.received.WithLabelValues(Heartbeat.String())))
}

// Malformed, forged and replayed datagrams are counted and dropped; a
// restart (new session, later timestamp) is accepted.
func TestNode_DropsBadDatagrams(t *testing.T) {
	nodes := mesh(t, 1, nil)
	nd := nodes[0]
	from := nd.Addr()
	good, err := Encode(Header{Type: MessageAvailable, SenderID: "z:1", Session: "s1", Sequence: 5},
		mustMarshal(t, MessageAvailablePayload{Queue: "q", Partition: "p", TS: nowMS()}), nd.key)
	require.NoError(t, err)
	forged, err := Encode(Header{Type: MessageAvailable, SenderID: "z:1", Session: "s1", Sequence: 6},
		mustMarshal(t, MessageAvailablePayload{Queue: "q", TS: nowMS()}), []byte("wrong"))
	require.NoError(t, err)
	restart, err := Encode(Header{Type: MessageAvailable, SenderID: "z:1", Session: "s2", Sequence: 1},
		mustMarshal(t, MessageAvailablePayload{Queue: "q2", Partition: "r", TS: nowMS() + 1}), nd.key)
	require.NoError(t, err)
	nd.handle(good, from.AddrPort())
	nd.handle(good, from.AddrPort()) // replay
	nd.handle(forged, from.AddrPort())
	nd.handle(good[:50], from.AddrPort())
	long := append([]byte(nil), good...)
	long[3] = 250
	nd.handle(long, from.AddrPort())
	nd.handle(restart, from.AddrPort())
	assert.Equal(t, []string{"q/p", "q2/r"}, nd.wakes.got)
	for reason, want := range map[string]float64{"replay": 1, "signature": 1, "too_short": 1, "length": 1} {
		assert.Equal(t, want, testutil.ToFloat64(nd.m.dropped.WithLabelValues(reason)), reason)
		assert.Equal(t, uint64(want), nd.Stats().Counters["dropped:"+reason], reason)
	}
}

func TestNew_RequiresSecretWithPeers(t *testing.T) {
	_, err := New(Config{Bind: "127.0.0.1:0", Peers: []string{"127.0.0.1:1"}, ServerID: "x", Waker: newWakes()})
	assert.Error(t, err)
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := Marshal(v)
	require.NoError(t, err)
	return b
}

// A queue deleted on one instance: the others hear QUEUE_CONFIG_DELETE and
// drop what they cached of it.
func TestNode_QueueDeletedReachesPeers(t *testing.T) {
	forgot := make(chan string, 1)
	nodes := mesh(t, 2, nil, func(i int, c *Config) {
		if i == 1 {
			c.OnQueueDeleted = func(q string) { forgot <- q }
		}
	})
	require.Eventually(t, func() bool { _, known := nodes[0].HasSubscribers("q"); return known }, 5*time.Second, 10*time.Millisecond)
	nodes[0].QueueDeleted("gone")
	select {
	case q := <-forgot:
		assert.Equal(t, "gone", q)
	case <-time.After(2 * time.Second):
		t.Fatal("the peer was not told")
	}
}

// Two sends that cross (one numbered, then overtaken before it is written,
// as a loaded machine does to a goroutine) are both taken: a peer drops a
// datagram whose sequence is below one it already took (replay.go, and the
// reference server likewise), so a node writes its datagrams in the order
// it numbers them. Here a wake-up is held between its numbering and its
// writing while another datagram is sent.
func TestNode_SendsThatCrossAreAllTaken(t *testing.T) {
	h := newSendHold(MessageAvailable)
	nodes := mesh(t, 2, nil, func(i int, c *Config) {
		if i == 0 {
			c.Drop = h.drop
		}
	})
	a, b := nodes[0], nodes[1]
	b.SetLocal("orders", true)
	require.Eventually(t, func() bool { has, _ := a.HasSubscribers("orders"); return has }, 5*time.Second, 10*time.Millisecond)

	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(h.release)
	h.hold(t, &wg, func() { a.Notify("orders", "p1") }, "the wake-up")
	crossed := make(chan struct{})
	wg.Go(func() {
		a.QueueDeleted("other")
		close(crossed)
	})
	select { // before the wake-up is written: at once; else once it is
	case <-crossed:
	case <-time.After(time.Second):
	}
	h.release <- struct{}{} // not closed yet: the wake-up goes now
	require.Eventually(t, func() bool { ok, _ := woken(b, "orders/p1"); return ok }, 5*time.Second, 5*time.Millisecond,
		"the wake-up numbered first is taken")
	assert.Zero(t, testutil.ToFloat64(b.m.dropped.WithLabelValues("replay")), "nothing dropped as a replay")
}

// sendHold holds one datagram of a type in its sender's Config.Drop once
// armed, as a loaded machine holds a goroutine between numbering a
// datagram and writing it: held is signalled then, and the datagram goes
// when release is sent to or closed.
type sendHold struct {
	typ     Type
	armed   atomic.Bool
	held    chan struct{}
	release chan struct{}
}

func newSendHold(typ Type) *sendHold {
	return &sendHold{typ: typ, held: make(chan struct{}, 1), release: make(chan struct{})}
}

// drop is the sender's Config.Drop: it drops nothing.
func (h *sendHold) drop(t Type) bool {
	if t == h.typ && h.armed.CompareAndSwap(true, false) {
		h.held <- struct{}{}
		<-h.release
	}
	return false
}

// hold arms h, starts send on wg and returns once its datagram (what) is
// held.
func (h *sendHold) hold(t *testing.T, wg *sync.WaitGroup, send func(), what string) {
	t.Helper()
	h.armed.Store(true)
	wg.Go(send)
	select {
	case <-h.held:
	case <-time.After(5 * time.Second):
		t.Fatal(what + " was not sent")
	}
}
