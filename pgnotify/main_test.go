package pgnotify_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/gateway"
	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/internal/shared"
	"github.com/heraldmq/herald/pgnotify"
	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/syncnet"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// instance is one Herald: pool, store, poller, notifier, listener and HTTP
// gateway, on a schema it may share with other instances.
type instance struct {
	t        testing.TB
	store    *queue.Store
	poller   *poller.Poller
	notifier *pgnotify.Notifier
	listener *pgnotify.Listener
	logical  *pgnotify.Logical
	node     *syncnet.Node
	configs  *queue.ConfigSnapshot
	ts       *httptest.Server
}

// sharedDSN is one migrated schema for several instances.
func sharedDSN(t testing.TB) string {
	t.Helper()
	dsn := pgtest.DSN(t)
	pool, err := queue.NewPool(context.Background(), dsn, 0)
	require.NoError(t, err)
	defer pool.Close()
	_, err = queue.Migrate(context.Background(), pool)
	require.NoError(t, err)
	return dsn
}

// newInstance starts an instance in notify mode. The poller's sweep is a
// minute, so only wake-ups explain a prompt delivery.
func newInstance(t testing.TB, dsn string) *instance { return newInstanceMode(t, dsn, "notify") }

// newInstanceMode starts an instance whose wake source is "notify"
// (Notifier + Listener), "logical" (the replication stream), "syncnet" (the
// UDP mesh; link the instances), "poll" (the poller's sweep only) or "none".
func newInstanceMode(t testing.TB, dsn, mode string) *instance {
	t.Helper()
	pool, err := queue.NewPool(context.Background(), dsn, 0)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	configs := shared.NewConfigCache()
	in := &instance{t: t, configs: configs}
	store, err := queue.New(queue.Config{Pool: pool, Configs: configs, PartitionCleanupAfter: time.Hour,
		OnPartitionDeleted: func(q, p string) {
			if in.node != nil {
				in.node.PartitionDeleted(q, p)
			}
		}})
	require.NoError(t, err)
	in.store = store
	pc := poller.Config{Store: store, SweepMin: time.Minute, SweepMax: time.Minute}
	if mode == "poll" {
		pc = poller.Config{Store: store, Mode: poller.WakePoll} // the default adaptive sweep does everything
	}
	lossy := mode == "syncnet-lossy" // 30% of datagrams lost; the default sweep as the safety net
	// Stale shared state: datagrams of these types from this instance never
	// arrive, so its peers believe it has no consumers (or still has), keep
	// a queue's old settings, or a wrong lease hint.
	muted := map[string][]syncnet.Type{
		"syncnet-noregister":   {syncnet.ConsumerRegistered},
		"syncnet-noderegister": {syncnet.ConsumerDeregistered},
		"syncnet-noconfig":     {syncnet.QueueConfigSet, syncnet.QueueConfigDelete},
		"syncnet-norelease":    {syncnet.LeaseHintReleased},
		"syncnet-noacquire":    {syncnet.LeaseHintAcquired},
	}[mode]
	presenceMuted := strings.HasSuffix(mode, "register")
	if lossy || presenceMuted {
		// What is lost is found by the sweep (the default, adaptive one).
		pc = poller.Config{Store: store}
	}
	if lossy || muted != nil {
		mode = "syncnet"
	}
	gcfg := gateway.Config{Store: store}
	var runs []func(context.Context) error
	var ready <-chan struct{}
	if mode == "syncnet" {
		scfg := syncnet.Config{Bind: "127.0.0.1:0", Secret: strings.Repeat("ab", 32), ServerID: queue.NewID()[24:],
			Waker:     syncnet.WakerFunc(func(source, q, p string) { in.poller.Wake(source, q, p) }),
			Heartbeat: 100 * time.Millisecond, Announce: 200 * time.Millisecond}
		shared.Hook(&scfg, store)
		if muted != nil {
			scfg.Drop = func(t syncnet.Type) bool { return slices.Contains(muted, t) }
		}
		if presenceMuted {
			// Stale presence lasts 3 announce intervals: long enough to see.
			scfg.Announce = time.Second
		}
		if lossy {
			var mu sync.Mutex
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7)) // #nosec G404 -- test randomness
			scfg.Drop = func(syncnet.Type) bool {
				mu.Lock()
				defer mu.Unlock()
				return rng.Float64() < 0.3
			}
		}
		in.node, err = syncnet.New(scfg)
		require.NoError(t, err)
		pc.OnPresence = in.node.SetLocal
		pc.Hints = in.node
		gcfg.Notifier = in.node
		gcfg.OnQueueConfigured = shared.Announce(in.node)
		gcfg.OnQueueDeleted = in.node.QueueDeleted
		runs = append(runs, in.node.Run)
	}
	p, err := poller.New(pc)
	require.NoError(t, err)
	in.poller = p
	gcfg.Poller = p
	switch mode {
	case "notify":
		self := queue.NewID() // as cmd/herald wires it: each instance skips its own NOTIFYs
		in.notifier, err = pgnotify.NewNotifier(pgnotify.NotifierConfig{Pool: pool, Sender: self, Registerer: prometheus.NewRegistry()})
		require.NoError(t, err)
		in.listener, err = pgnotify.NewListener(pgnotify.ListenerConfig{Pool: pool, Waker: p, Self: self, PingInterval: time.Second,
			BackoffMin: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond})
		require.NoError(t, err)
		gcfg.Notifier = in.notifier
		runs = append(runs, in.notifier.Run, in.listener.Run)
		ready = in.listener.Connected()
	case "logical":
		in.logical, err = pgnotify.NewLogical(pgnotify.LogicalConfig{Pool: pool, Tables: store, Waker: p,
			BackoffMin: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond})
		require.NoError(t, err)
		require.NoError(t, in.logical.Check(context.Background()))
		runs = append(runs, in.logical.Run)
		ready = in.logical.Ready()
	}
	gw, err := gateway.New(gcfg)
	require.NoError(t, err)
	in.ts = httptest.NewServer(gw.Handler())

	t.Cleanup(p.Start())
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, run := range runs {
		wg.Go(func() { _ = run(ctx) })
	}
	t.Cleanup(func() {
		in.ts.Close()
		cancel()
		wg.Wait()
	})
	if ready != nil {
		select {
		case <-ready:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s wake source did not start", mode)
		}
	}
	return in
}

// link makes syncnet instances peers of each other.
func link(ins ...*instance) {
	for _, a := range ins {
		var peers []string
		for _, b := range ins {
			if a != b {
				peers = append(peers, b.node.Addr().String())
			}
		}
		a.node.SetPeers(peers)
	}
}

func (in *instance) push(queue, payload string) {
	in.t.Helper()
	res, err := http.Post(in.ts.URL+"/api/v1/push", "application/json",
		strings.NewReader(fmt.Sprintf(`{"items":[{"queue":%q,"payload":%s}]}`, queue, payload)))
	require.NoError(in.t, err)
	_ = res.Body.Close()
	require.Equal(in.t, http.StatusCreated, res.StatusCode)
}

type answer struct {
	status int
	body   string
	at     time.Time
}

// get sends GET path in the background; the answer arrives on the channel.
// The request is cancelled when the test ends, before the server closes
// (which waits for open requests).
func (in *instance) get(path string) <-chan answer {
	out := make(chan answer, 1)
	ctx, cancel := context.WithCancel(context.Background())
	in.t.Cleanup(cancel)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, in.ts.URL+path, nil)
		if err != nil {
			out <- answer{status: -1, body: err.Error(), at: time.Now()}
			return
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- answer{status: -1, body: err.Error(), at: time.Now()}
			return
		}
		b, _ := io.ReadAll(res.Body)
		_ = res.Body.Close()
		out <- answer{status: res.StatusCode, body: string(b), at: time.Now()}
	}()
	return out
}

// longPoll starts a waiting pop on queue and returns once it is registered.
func (in *instance) longPoll(queue string, timeout time.Duration) <-chan answer {
	in.t.Helper()
	before := in.poller.Intentions()
	out := in.get(fmt.Sprintf("/api/v1/pop/queue/%s?wait=true&timeout=%d&autoAck=true", queue, timeout.Milliseconds()))
	var early answer
	ok := waitFor(10*time.Second, func() bool {
		select {
		case early = <-out:
			return true
		default:
			return false
		}
	}, func() bool { return in.poller.Intentions() > before })
	switch {
	case early.at != (time.Time{}):
		in.t.Fatalf("long-poll answered before it was seen waiting: %d %s", early.status, early.body)
	case !ok:
		_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
		in.t.Fatal("long-poll never registered")
	}
	return out
}

func wait(t testing.TB, ch <-chan answer, ceiling time.Duration) answer {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(ceiling):
		t.Fatalf("no answer within %v", ceiling)
		return answer{}
	}
}

func stringsReader(s string) io.Reader { return strings.NewReader(s) }

// waitFor checks cond every millisecond until it holds (true), stop holds
// or ceiling passes (false). stop may be nil.
func waitFor(ceiling time.Duration, stop, cond func() bool) bool {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.After(ceiling)
	for !cond() {
		if stop != nil && stop() {
			return false
		}
		select {
		case <-deadline:
			return false
		case <-tick.C:
		}
	}
	return true
}
