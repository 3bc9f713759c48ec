package syncnet_test

import (
	"context"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/queue/queuetest"
	"github.com/heraldmq/herald/syncnet"
)

// The database is started only by the tests that ask for one.
func TestMain(m *testing.M) { pgtest.Main(m) }

// quietFor: how long nothing must happen for the poller to count as idle,
// well past a coalesced wake-up's window (syncnet.WakeWindowDefault) even
// when a loaded machine fires its timer late.
const quietFor = 50 * time.Millisecond

const e2eSecret = "ab0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcd"

// sum adds up every series of a counter or the sample counts of a
// histogram named name.
func sum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			switch {
			case m.GetCounter() != nil:
				total += m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				total += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return total
}

// The replay measured end to end: a consumer waits on a queue; an
// eavesdropper replays, for a second, the MESSAGE_AVAILABLE datagrams it
// captured before and after a peer's restart, alternately, to the
// instance's socket. Each accepted one used to cost a poll cycle (4,143
// pre-flights in 5 s); now none is accepted and the poller works for the
// two real ones only.
func TestReplay_MessageAvailableCostsNoPollCycles(t *testing.T) {
	// Capture a:1's datagrams across a restart.
	eve, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = eve.Close() })
	var captured [][]byte // hb, ma of the first session, then of the second
	for range 2 {
		a, err := syncnet.New(syncnet.Config{Bind: "127.0.0.1:0", Peers: []string{eve.LocalAddr().String()},
			Secret: e2eSecret, ServerID: "a:1", Waker: syncnet.WakerFunc(func(_, _, _ string) {}), Heartbeat: 50 * time.Millisecond})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = a.Run(ctx)
		}()
		session := a.Stats().Session[:15]
		next := func(typ syncnet.Type) []byte {
			buf := make([]byte, syncnet.MaxDatagram)
			require.NoError(t, eve.SetReadDeadline(time.Now().Add(5*time.Second)))
			for {
				k, _, err := eve.ReadFromUDP(buf)
				require.NoError(t, err, "capturing %v", typ)
				p, err := syncnet.Decode(buf[:k], []byte(e2eSecret))
				require.NoError(t, err)
				if p.Type == typ && p.Session == session {
					return append([]byte(nil), buf[:k]...)
				}
			}
		}
		hb := next(syncnet.Heartbeat)
		a.Notify("orders", "Default")
		captured = append(captured, hb, next(syncnet.MessageAvailable))
		cancel()
		<-done
		// A real restart takes far longer than the millisecond of the ts.
		for stopped := time.Now().UnixMilli(); time.Now().UnixMilli() <= stopped; {
			runtime.Gosched()
		}
	}

	// The victim: a poller with one waiting consumer, woken by syncnet only
	// (the sweep is a minute).
	store := queuetest.NewStore(t)
	preg := prometheus.NewRegistry()
	p, err := poller.New(poller.Config{Store: store, SweepMin: time.Minute, SweepMax: time.Minute, Registerer: preg})
	require.NoError(t, err)
	t.Cleanup(p.Start())
	w := p.Wait(poller.Intention{Target: queue.Target{Queue: "orders"}})
	t.Cleanup(func() { w.Cancel() })
	sreg := prometheus.NewRegistry()
	v, err := syncnet.New(syncnet.Config{Bind: "127.0.0.1:0", Secret: e2eSecret, ServerID: "v:1", Waker: p, Registerer: sreg})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = v.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	require.Eventually(t, func() bool { return p.Intentions() == 1 }, 5*time.Second, time.Millisecond)

	processed := func() float64 {
		return sum(t, sreg, "herald_syncnet_received_total") + sum(t, sreg, "herald_syncnet_dropped_total")
	}
	settle := func(want float64) {
		require.Eventually(t, func() bool { return processed() >= want }, 10*time.Second, time.Millisecond, "the node read them")
	}
	baseCycles := sum(t, preg, "herald_poll_cycles_total")
	for _, b := range captured { // what the mesh delivered
		want := processed() + 1
		_, err := eve.WriteToUDP(b, v.Addr())
		require.NoError(t, err)
		settle(want)
	}
	require.Eventually(t, func() bool { return sum(t, preg, "herald_poll_cycles_total") > baseCycles }, 5*time.Second,
		time.Millisecond, "the real MESSAGE_AVAILABLE woke the poller")
	require.Equal(t, 4.0, sum(t, sreg, "herald_syncnet_received_total"), "the real datagrams are accepted")
	// The second was coalesced into a wake-up at the end of its window:
	// let the poller finish what the real datagrams asked of it.
	require.Eventually(t, func() bool {
		before := sum(t, preg, "herald_poll_cycles_total")
		<-time.After(quietFor)
		return sum(t, preg, "herald_poll_cycles_total") == before
	}, 10*time.Second, time.Millisecond, "the poller is idle")

	cycles, preflights := sum(t, preg, "herald_poll_cycles_total"), sum(t, preg, "herald_preflight_duration_seconds")
	sent := 0
	for start := time.Now(); time.Since(start) < time.Second; sent += 2 {
		for _, b := range [][]byte{captured[1], captured[3]} {
			_, err := eve.WriteToUDP(b, v.Addr())
			require.NoError(t, err)
		}
		if sent%64 == 0 {
			runtime.Gosched()
		}
	}
	// The kernel may drop some of a burst: wait for what it delivered.
	require.Eventually(t, func() bool {
		before := processed()
		<-time.After(50 * time.Millisecond)
		return processed() == before
	}, 10*time.Second, time.Millisecond, "the node is done reading")
	<-time.After(quietFor) // a coalesced wake-up, if any, is due by then

	accepted := sum(t, sreg, "herald_syncnet_received_total") - 4
	dCycles := sum(t, preg, "herald_poll_cycles_total") - cycles
	dPre := sum(t, preg, "herald_preflight_duration_seconds") - preflights
	t.Logf("1 s of replay: %d datagrams sent, %v accepted, %v poll cycles, %v pre-flights, drops: stale_session %v, replay %v",
		sent, accepted, dCycles, dPre, dropped(t, sreg, "stale_session"), dropped(t, sreg, "replay"))
	assert.Zero(t, accepted, "no replayed datagram is accepted")
	assert.Zero(t, dCycles, "the replay costs the poller no work")
	assert.Zero(t, dPre, "nor the database")
}

func dropped(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "herald_syncnet_dropped_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && strings.EqualFold(l.GetValue(), reason) {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
