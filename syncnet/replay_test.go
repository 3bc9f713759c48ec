package syncnet

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Replayed datagrams: captured before and after a peer's restart and
// replayed without the secret, alternately, every one used to be accepted
// as "a restart"; each replayed MESSAGE_AVAILABLE woke the poller, and each
// replayed old-session datagram wiped the peer's presence. These tests
// keep them out.

const testSecret = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// capture is a UDP socket standing for an eavesdropper: the nodes under
// test list it as a peer, so it receives (and keeps) their datagrams.
type capture struct {
	conn *net.UDPConn
	ch   chan []byte
}

func newCapture(t *testing.T) *capture {
	t.Helper()
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	c := &capture{conn: conn, ch: make(chan []byte, 4096)}
	go func() {
		buf := make([]byte, MaxDatagram)
		for {
			k, _, err := conn.ReadFromUDP(buf)
			if err != nil {
				return
			}
			select {
			case c.ch <- append([]byte(nil), buf[:k]...):
			default:
			}
		}
	}()
	t.Cleanup(func() { _ = conn.Close() })
	return c
}

func (c *capture) addr() string { return c.conn.LocalAddr().String() }

// next waits for a datagram of type typ from session (the header's 15
// characters).
func (c *capture) next(t *testing.T, typ Type, session string) []byte {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case b := <-c.ch:
			p, err := Decode(b, []byte(testSecret))
			require.NoError(t, err)
			if p.Type == typ && p.Session == session {
				return b
			}
		case <-deadline:
			t.Fatalf("no %v from session %s captured", typ, session)
		}
	}
}

// runNode starts a node; stop (also run at cleanup) ends it.
// before, when set, adjusts the node before it runs.
func runNode(t *testing.T, cfg Config, before ...func(*Node)) (*testNode, func()) {
	t.Helper()
	w := newWakes()
	reg := prometheus.NewRegistry()
	if cfg.Bind == "" {
		cfg.Bind = "127.0.0.1:0"
	}
	if cfg.Secret == "" {
		cfg.Secret = testSecret
	}
	cfg.Waker, cfg.Registerer = w, reg
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat, cfg.DeadAfter, cfg.Announce = 50*time.Millisecond, 300*time.Millisecond, 100*time.Millisecond
	}
	nd, err := New(cfg)
	require.NoError(t, err)
	for _, f := range before {
		f(nd)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = nd.Run(ctx)
	}()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)
	return &testNode{Node: nd, reg: reg, wakes: w, stop: stop}, stop
}

// restartCapture runs a:1, captures its HEARTBEAT and a MESSAGE_AVAILABLE
// for queue/partition, stops it, and does the same for a:1 restarted (a new
// session): what an eavesdropper on the mesh holds.
func restartCapture(t *testing.T, queues [2]string) (hb, ma [2][]byte) {
	t.Helper()
	c := newCapture(t)
	for i := range 2 {
		a, stop := runNode(t, Config{Peers: []string{c.addr()}, ServerID: "a:1"})
		hb[i] = c.next(t, Heartbeat, a.session[:maxSession])
		a.Notify(queues[i], "p") // the eavesdropper is a peer of unknown presence: targeted
		ma[i] = c.next(t, MessageAvailable, a.session[:maxSession])
		stop()
		laterClock()
	}
	return hb, ma
}

// laterClock returns once the millisecond clock has moved on: a real
// restart takes far longer, and the restarted process's timestamps are
// then later than any its previous session signed.
func laterClock() {
	for stopped := nowMS(); nowMS() <= stopped; {
		runtime.Gosched()
	}
}

func received(nd *testNode) float64 {
	total := 0.0
	for t := range typeNames {
		total += testutil.ToFloat64(nd.m.received.WithLabelValues(t.String()))
	}
	return total
}

func dropped(nd *testNode, reason string) float64 {
	return testutil.ToFloat64(nd.m.dropped.WithLabelValues(reason))
}

var attacker = &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9}

// Datagrams of a session older than the newest seen are dropped for good,
// and a datagram whose signed ts is outside the freshness window is
// dropped: 0 of 400 replays get through (100 of 100 did before sessions were strict).
func TestReplay_DatagramsAcrossARestartAreDropped(t *testing.T) {
	hb, ma := restartCapture(t, [2]string{"q1", "q2"})

	v, _ := runNode(t, Config{ServerID: "v:1"})
	for _, b := range [][]byte{hb[0], ma[0], hb[1], ma[1]} { // as the mesh delivered them
		v.handle(b, attacker.AddrPort())
	}
	require.Equal(t, []string{"q1/p", "q2/p"}, v.wakes.got, "the real datagrams are accepted, the restart too")

	before := received(v)
	for range 100 {
		for _, b := range [][]byte{ma[0], ma[1], hb[0], hb[1]} {
			v.handle(b, attacker.AddrPort())
		}
	}
	accepted := received(v) - before
	t.Logf("replays accepted: %v of 400", accepted)
	assert.Zero(t, accepted, "no replay is accepted")
	assert.Equal(t, 2, v.wakes.count(), "no replay wakes anything")
	assert.Equal(t, 200.0, dropped(v, "stale_session"), "the session before the restart is retired")
	assert.Equal(t, 200.0, dropped(v, "replay"), "the current session's datagrams were seen")
	assert.Equal(t, uint64(200), v.Stats().Counters["dropped:stale_session"])

	// A node that never heard of a:1 refuses its datagrams once they are
	// older (or newer) than the freshness window, whichever session.
	for _, skew := range []time.Duration{FreshnessDefault + time.Second, -FreshnessDefault - time.Second} {
		late, _ := runNode(t, Config{ServerID: "late:1"}, func(n *Node) {
			n.now = func() time.Time { return time.Now().Add(skew) }
		})
		for _, b := range [][]byte{hb[0], ma[0], hb[1], ma[1]} {
			late.handle(b, attacker.AddrPort())
		}
		assert.Zero(t, received(late), "skew %v", skew)
		assert.Empty(t, late.wakes.got, "skew %v", skew)
		assert.Equal(t, 4.0, dropped(late, "stale_timestamp"), "skew %v", skew)
	}
}

// However often a MESSAGE_AVAILABLE is replayed, and however fast a peer
// sends them, a partition gets at most one wake-up per WakeWindow, and a
// queue at most wakeNamedMax at once (the rest coalesced into one at the
// window's end, which names each partition, up to wakeNamedMax, or the
// whole queue).
func TestReplay_MessageAvailableWakesOncePerWindow(t *testing.T) {
	window := WakeWindowDefault
	// quiet reports whether no further wake-up arrives for several windows
	// (a bounded wait for an absence: there is no event to wait on).
	quiet := func(w *wakes) bool {
		n := w.count()
		<-time.After(5 * window)
		return w.count() == n
	}

	t.Run("replayed across a restart", func(t *testing.T) {
		hb, ma := restartCapture(t, [2]string{"orders", "orders"})
		v, _ := runNode(t, Config{ServerID: "v:1"})
		for _, b := range [][]byte{hb[0], ma[0], hb[1], ma[1]} {
			v.handle(b, attacker.AddrPort())
		}
		for range 1000 {
			v.handle(ma[0], attacker.AddrPort())
			v.handle(ma[1], attacker.AddrPort())
		}
		// The second real datagram came within the window of the first:
		// its wake-up is the coalesced one at the window's end.
		require.Eventually(t, func() bool { return v.wakes.count() >= 2 }, 5*time.Second, time.Millisecond)
		assert.True(t, quiet(v.wakes))
		t.Logf("wake-ups from 2 datagrams replayed 1000 times each: %d", v.wakes.count())
		assert.Equal(t, 2, v.wakes.count(), "one per real datagram, none per replay")
	})

	t.Run("a burst from a peer", func(t *testing.T) {
		v, _ := runNode(t, Config{ServerID: "v:1"})
		const burst = 500
		ts := nowMS()
		dgram := func(seq uint64, queue, partition string) []byte {
			b, err := Encode(Header{Type: MessageAvailable, SenderID: "b:1", Session: "b-session", Sequence: seq},
				mustMarshal(t, MessageAvailablePayload{Partition: partition, Queue: queue, TS: ts}), []byte(testSecret))
			require.NoError(t, err)
			return b
		}
		// At least burst datagrams, over at least 6 windows.
		start, sent := time.Now(), 0
		for ; sent < burst || time.Since(start) < 6*window; sent++ {
			v.handle(dgram(uint64(sent+1), "orders", fmt.Sprintf("p%d", sent)), attacker.AddrPort())
		}
		// The last datagram of the burst, and where the wake-ups stood
		// before it: one after that mark must cover it.
		v.wakes.mu.Lock()
		mark := len(v.wakes.got)
		v.wakes.mu.Unlock()
		v.handle(dgram(uint64(sent+1), "orders", "plast"), attacker.AddrPort())
		sent++
		v.handle(dgram(uint64(sent+1), "other", "x"), attacker.AddrPort())
		elapsed := time.Since(start)
		ordersWakes := func() int {
			v.wakes.mu.Lock()
			defer v.wakes.mu.Unlock()
			n := 0
			for _, w := range v.wakes.got {
				if strings.HasPrefix(w, "orders/") {
					n++
				}
			}
			return n
		}
		// At most wakeNamedMax partitions at once and one merged wake-up
		// per window the burst spanned, and the one at the end of the last
		// window (which may fire before or after other/x is handled).
		bound := (int(elapsed/window) + 2) * (wakeNamedMax + 1)
		ordersSince := func(mark int) []string {
			v.wakes.mu.Lock()
			defer v.wakes.mu.Unlock()
			var out []string
			for _, w := range v.wakes.got[mark:] {
				if strings.HasPrefix(w, "orders/") {
					out = append(out, w)
				}
			}
			return out
		}
		v.wakes.mu.Lock()
		assert.Contains(t, v.wakes.got, "other/x", "another queue is not held back")
		v.wakes.mu.Unlock()
		// A wake-up of the queue comes after the last datagram and covers
		// it: the whole queue when the window merged more than
		// wakeNamedMax partitions, its partition when it went through at
		// once or the window merged fewer (a stalled sender on a loaded
		// machine); others merged earlier may come after it.
		require.Eventually(t, func() bool { return quiet(v.wakes) }, 5*time.Second, time.Millisecond, "wake-ups stop")
		trailing := ordersSince(mark)
		assert.True(t, slices.Contains(trailing, "orders/") || slices.Contains(trailing, "orders/plast"),
			"a wake-up after the last datagram covers it: %v", trailing)
		total := ordersWakes()
		passes := int(v.Node.wakes.passes.Load()) - 1 // other/x
		t.Logf("%d datagrams in %v: %d wake-ups of the queue in %d passes (bound %d)", sent, elapsed, total, passes, bound)
		assert.LessOrEqual(t, passes, bound, "at most wakeNamedMax partitions and one merged wake-up per window")
		assert.LessOrEqual(t, total, passes*wakeNamedMax, "a merged wake-up names at most wakeNamedMax partitions")
		assert.Less(t, passes, sent, "datagrams are coalesced")
		assert.Equal(t, "orders/p0", v.wakes.got[0], "the first wakes at once")
	})

	t.Run("a burst naming one partition", func(t *testing.T) {
		v, _ := runNode(t, Config{ServerID: "v:1"})
		ts := nowMS()
		start, sent := time.Now(), 0
		for ; sent < 500 || time.Since(start) < 6*window; sent++ {
			b, err := Encode(Header{Type: MessageAvailable, SenderID: "b:1", Session: "b-session", Sequence: uint64(sent + 1)},
				mustMarshal(t, MessageAvailablePayload{Partition: "p", Queue: "orders", TS: ts}), []byte(testSecret))
			require.NoError(t, err)
			v.handle(b, attacker.AddrPort())
		}
		elapsed := time.Since(start)
		require.Eventually(t, func() bool { return quiet(v.wakes) }, 5*time.Second, time.Millisecond, "wake-ups stop")
		passes := int(v.Node.wakes.passes.Load())
		t.Logf("%d datagrams in %v: %d wake-ups", sent, elapsed, passes)
		assert.LessOrEqual(t, passes, int(elapsed/window)+2, "at most one wake-up of the partition per window")
		assert.Less(t, passes, sent/10, "datagrams are coalesced")
		v.wakes.mu.Lock()
		defer v.wakes.mu.Unlock()
		assert.Equal(t, "orders/p", v.wakes.got[len(v.wakes.got)-1], "the trailing one names the partition")
	})

	t.Run("reference server captures", func(t *testing.T) {
		gs := loadGolden(t)
		find := func(typ Type, seq uint64) []byte {
			for _, g := range gs {
				if Type(g.Header.Type) == typ && g.Header.Sequence == seq {
					b, err := hex.DecodeString(g.Hex)
					require.NoError(t, err)
					return b
				}
			}
			t.Fatalf("no captured %v with sequence %d", typ, seq)
			return nil
		}
		// As if it were the day of the capture (the first heartbeat's ts).
		v, _ := runNode(t, Config{ServerID: "v:1", Secret: gs[0].Secret}, func(n *Node) {
			n.now = func() time.Time { return time.UnixMilli(1795312126318 + 5000) }
		})
		hb1, hb9 := find(Heartbeat, 1), find(Heartbeat, 9)
		ma11, ma14, del := find(MessageAvailable, 11), find(MessageAvailable, 14), find(QueueConfigDelete, 16)
		for _, b := range [][]byte{hb1, hb9, ma11, ma14, del} {
			v.handle(b, attacker.AddrPort())
		}
		assert.Equal(t, 5.0, received(v), "the reference server's datagrams are accepted")
		for range 1000 {
			for _, b := range [][]byte{hb1, hb9, ma11, ma14, del} {
				v.handle(b, attacker.AddrPort())
			}
		}
		assert.Equal(t, 5000.0, dropped(v, "replay"))
		require.Eventually(t, func() bool { return v.wakes.count() >= 2 }, 5*time.Second, time.Millisecond)
		assert.True(t, quiet(v.wakes))
		assert.Equal(t, []string{"udp-golden-q1/Default", "udp-golden-q1/p-7"}, v.wakes.got)
	})
}

// A replayed datagram of the session before a peer's restart leaves what
// the peer announced since (its presence, how long it has been known) as it
// was.
func TestReplay_StaleSessionKeepsPresence(t *testing.T) {
	c := newCapture(t)
	v, _ := runNode(t, Config{ServerID: "v:1"})
	a1, stop := runNode(t, Config{Peers: []string{v.Addr().String(), c.addr()}, ServerID: "a:1"})
	bind := a1.Addr().String()
	v.SetPeers([]string{bind})
	a1.SetLocal("orders", true)
	old := [][]byte{c.next(t, Heartbeat, a1.session[:maxSession]), c.next(t, ConsumerRegistered, a1.session[:maxSession])}
	stop()
	laterClock()

	a2, _ := runNode(t, Config{Bind: bind, Peers: []string{v.Addr().String()}, ServerID: "a:1"})
	a2.SetLocal("invoices", true)
	require.Eventually(t, func() bool {
		has, known := v.HasSubscribers("invoices")
		v.mu.Lock()
		defer v.mu.Unlock()
		st := v.byID["a:1"]
		return has && known && st != nil && st.session == a2.session[:maxSession]
	}, 15*time.Second, 5*time.Millisecond, "v knows the restarted a:1 and its consumers")

	before := dropped(v, "stale_session")
	for _, b := range old {
		v.handle(b, attacker.AddrPort())
		has, known := v.HasSubscribers("invoices")
		assert.True(t, has, "presence kept")
		assert.True(t, known, "presence still known")
		has, _ = v.HasSubscribers("orders")
		assert.False(t, has, "the old session's consumers are not brought back")
	}
	assert.Equal(t, 2.0, dropped(v, "stale_session")-before)
	v.mu.Lock()
	assert.Equal(t, a2.session[:maxSession], v.byID["a:1"].session)
	v.mu.Unlock()
}

// A peer adopts a session only from a datagram with a signed ts, so a node
// greets with a heartbeat the peers it learns of and the peers it hears
// (re)start: news without a ts (here QUEUE_CONFIG_DELETE) reaches them at
// once, not after the next heartbeat (a minute away here).
func TestSession_NewPeersAdoptItAtOnce(t *testing.T) {
	deleted := make(chan string, 4)
	onDeleted := func(q string) { deleted <- q }
	expect := func(q string) {
		t.Helper()
		select {
		case got := <-deleted:
			assert.Equal(t, q, got)
		case <-time.After(5 * time.Second):
			t.Fatalf("QUEUE_CONFIG_DELETE %s did not arrive", q)
		}
	}
	a, _ := runNode(t, Config{ServerID: "a:1", Heartbeat: time.Minute, DeadAfter: 5 * time.Minute, Announce: time.Minute})
	b, stopB := runNode(t, Config{ServerID: "b:1", OnQueueDeleted: onDeleted})
	bind := b.Addr().String()
	require.Eventually(t, func() bool { return a.sent.Load() == 0 && a.beaten.Load() }, 5*time.Second, time.Millisecond,
		"a sent its first heartbeat, to nobody")
	b.SetPeers([]string{a.Addr().String()})
	a.SetPeers([]string{bind}) // linked after both started
	a.QueueDeleted("x")
	expect("x")

	stopB()
	laterClock()
	b2, _ := runNode(t, Config{Bind: bind, ServerID: "b:1", Peers: []string{a.Addr().String()}, OnQueueDeleted: onDeleted})
	require.Eventually(t, func() bool {
		b2.mu.Lock()
		defer b2.mu.Unlock()
		return b2.byID["a:1"] != nil
	}, 5*time.Second, time.Millisecond, "the restarted b knows a's session without waiting for a's heartbeat")
	a.QueueDeleted("y")
	expect("y")
	assert.Zero(t, dropped(b2, "unknown_session")+dropped(b, "unknown_session"))
}
