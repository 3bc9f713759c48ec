package servertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/internal/server"
	"github.com/heraldmq/herald/pgnotify"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/syncnet"
)

// Instance is one running Herald.
type Instance struct {
	*server.Server
	T    testing.TB
	stop func()
}

// Stop stops the instance and waits until it has (as at the end of the
// test; calling it again does nothing).
func (in *Instance) Stop() { in.stop() }

// SharedDSN is one migrated schema for several instances.
func SharedDSN(t testing.TB) string {
	t.Helper()
	dsn := pgtest.DSN(t)
	pool, err := queue.NewPool(context.Background(), dsn, 0)
	require.NoError(t, err)
	defer pool.Close()
	_, err = queue.Migrate(context.Background(), pool)
	require.NoError(t, err)
	return dsn
}

// Modes of Start: the wake source under test.
//
//	notify    NOTIFY between instances (pgnotify.Notifier and Listener)
//	logical   the replication stream
//	syncnet   the UDP mesh only (Link the instances)
//	poll      the adaptive sweep only
//	none      this instance's own pushes only
//
// and syncnet with faults: "syncnet-lossy" (30% of datagrams lost),
// "syncnet-noregister", "-noderegister", "-noconfig", "-norelease",
// "-noacquire" (datagrams of that type from this instance never arrive).
// Except in poll mode and with faults that only the sweep repairs, the
// poller's sweep is a minute, so only wake-ups explain a prompt delivery.
func Start(t testing.TB, dsn, mode string, adjust ...func(*server.Config)) *Instance {
	t.Helper()
	in := &Instance{T: t}
	cfg := server.Config{Addr: "127.0.0.1:0", DatabaseURL: dsn, SweepMin: time.Minute, SweepMax: time.Minute,
		Registry: prometheus.NewRegistry()}
	cfg.Adjust.Store = func(c *queue.Config) { c.PartitionCleanupAfter = time.Hour }
	lossy := mode == "syncnet-lossy"
	muted := map[string][]syncnet.Type{
		// Presence muted: its pulled sets too (members compare digests).
		"syncnet-noregister":   {syncnet.ConsumerRegistered, syncnet.PresenceSet},
		"syncnet-noderegister": {syncnet.ConsumerDeregistered, syncnet.PresenceSet},
		"syncnet-noconfig":     {syncnet.QueueConfigSet, syncnet.QueueConfigDelete},
		"syncnet-norelease":    {syncnet.LeaseHintReleased},
		"syncnet-noacquire":    {syncnet.LeaseHintAcquired},
	}[mode]
	presenceMuted := strings.HasSuffix(mode, "register")
	if mode == "poll" || lossy || presenceMuted {
		// What is lost is found by the sweep (the default, adaptive one).
		cfg.SweepMin, cfg.SweepMax = 0, 0
	}
	switch {
	case mode == "poll":
		cfg.Wake = server.WakePoll
	case mode == "none":
		cfg.Wake = server.WakeLocal
	case mode == "notify" || mode == "logical":
		cfg.Wake = mode
		cfg.Adjust.Listener = func(c *pgnotify.ListenerConfig) {
			c.PingInterval, c.BackoffMin, c.BackoffMax = time.Second, 50*time.Millisecond, 500*time.Millisecond
		}
		cfg.Adjust.Logical = func(c *pgnotify.LogicalConfig) {
			c.BackoffMin, c.BackoffMax = 50*time.Millisecond, 500*time.Millisecond
		}
	case strings.HasPrefix(mode, "syncnet"):
		cfg.Wake, cfg.Syncnet = server.WakeLocal, true
		cfg.SyncSecret, cfg.ServerID = strings.Repeat("ab", 32), queue.NewID()[24:]
		cfg.Adjust.Syncnet = func(c *syncnet.Config) {
			c.Heartbeat, c.Announce = 100*time.Millisecond, 200*time.Millisecond
			if muted != nil {
				c.Drop = func(t syncnet.Type) bool { return slices.Contains(muted, t) }
			}
			if presenceMuted {
				// Stale presence lasts 3 announce intervals: long enough to see.
				c.Announce = time.Second
			}
			if lossy {
				var mu sync.Mutex
				rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7)) // #nosec G404 -- test randomness
				c.Drop = func(syncnet.Type) bool {
					mu.Lock()
					defer mu.Unlock()
					return rng.Float64() < 0.3
				}
			}
		}
	default:
		t.Fatalf("servertest: unknown mode %q", mode)
	}
	for _, a := range adjust {
		a(&cfg)
	}
	srv, err := server.New(context.Background(), cfg)
	require.NoError(t, err)
	in.Server = srv
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	var once sync.Once
	in.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("instance %s stopped: %v", srv.Instance(), err)
			}
		})
	}
	t.Cleanup(in.stop)
	select {
	case <-srv.Ready():
	case err := <-done:
		t.Fatalf("instance stopped while starting: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatalf("%s wake source did not start", mode)
	}
	return in
}

// Link makes syncnet instances seeds of each other. Instances on one
// schema find each other through the members table anyway; Link makes it
// at once, and tests the seeds' path.
func Link(ins ...*Instance) {
	for _, a := range ins {
		var peers []string
		for _, b := range ins {
			if a != b {
				peers = append(peers, b.Node().Addr().String())
			}
		}
		a.Node().SetPeers(peers)
	}
}

// Push pushes one message with a JSON payload to queue.
func (in *Instance) Push(queue, payload string) {
	in.T.Helper()
	res, err := http.Post(in.URL()+"/api/v1/push", "application/json",
		strings.NewReader(fmt.Sprintf(`{"items":[{"queue":%q,"payload":%s}]}`, queue, payload)))
	require.NoError(in.T, err)
	_ = res.Body.Close()
	require.Equal(in.T, http.StatusCreated, res.StatusCode)
}

// Call sends one request and returns status and body.
func (in *Instance) Call(method, path, body string) (int, string) {
	in.T.Helper()
	req, err := http.NewRequest(method, in.URL()+path, strings.NewReader(body))
	require.NoError(in.T, err)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	require.NoError(in.T, err)
	defer func() { _ = res.Body.Close() }()
	b, err := io.ReadAll(res.Body)
	require.NoError(in.T, err)
	return res.StatusCode, string(b)
}

// Answer is a response that arrived in the background.
type Answer struct {
	Status int
	Body   string
	At     time.Time
}

// Get sends GET path in the background; the answer arrives on the channel.
// The request is cancelled when the test ends, before the instance stops
// (which waits for open requests).
func (in *Instance) Get(path string) <-chan Answer {
	out := make(chan Answer, 1)
	ctx, cancel := context.WithCancel(context.Background())
	in.T.Cleanup(cancel)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, in.URL()+path, nil)
		if err != nil {
			out <- Answer{Status: -1, Body: err.Error(), At: time.Now()}
			return
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- Answer{Status: -1, Body: err.Error(), At: time.Now()}
			return
		}
		b, _ := io.ReadAll(res.Body)
		_ = res.Body.Close()
		out <- Answer{Status: res.StatusCode, Body: string(b), At: time.Now()}
	}()
	return out
}

// Waiting sends a long-poll GET and returns once the poller holds it.
func (in *Instance) Waiting(path string) <-chan Answer {
	in.T.Helper()
	before := in.Poller().Intentions()
	out := in.Get(path)
	var early Answer
	ok := WaitFor(10*time.Second, func() bool {
		select {
		case early = <-out:
			return true
		default:
			return false
		}
	}, func() bool { return in.Poller().Intentions() > before })
	switch {
	case early.At != (time.Time{}):
		in.T.Fatalf("long-poll answered before it was seen waiting: %d %s", early.Status, early.Body)
	case !ok:
		_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
		in.T.Fatal("long-poll never registered")
	}
	return out
}

// LongPoll starts a waiting pop on queue (autoAck) and returns once it is
// registered.
func (in *Instance) LongPoll(queue string, timeout time.Duration) <-chan Answer {
	in.T.Helper()
	return in.Waiting(fmt.Sprintf("/api/v1/pop/queue/%s?wait=true&timeout=%d&autoAck=true", queue, timeout.Milliseconds()))
}

// Wait returns the answer of ch, failing the test after ceiling.
func Wait(t testing.TB, ch <-chan Answer, ceiling time.Duration) Answer {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(ceiling):
		t.Fatalf("no answer within %v", ceiling)
		return Answer{}
	}
}

// WaitFor checks cond every millisecond until it holds (true), stop holds
// or ceiling passes (false). stop may be nil.
func WaitFor(ceiling time.Duration, stop, cond func() bool) bool {
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

// CrossLatency pushes 20 messages through a and long-polls them on b,
// returning the median push → delivery time.
func CrossLatency(t testing.TB, a, b *Instance, queue string) time.Duration {
	t.Helper()
	var lat []time.Duration
	for i := range 20 {
		got := b.LongPoll(queue, 10*time.Second)
		start := time.Now()
		a.Push(queue, fmt.Sprintf(`{"i":%d}`, i))
		ans := Wait(t, got, 10*time.Second)
		require.Equal(t, http.StatusOK, ans.Status, ans.Body)
		assert.Contains(t, ans.Body, fmt.Sprintf(`"data":{"i":%d}`, i))
		lat = append(lat, ans.At.Sub(start))
	}
	slices.Sort(lat)
	t.Logf("cross-instance push → delivery: p50 %v, max %v", lat[len(lat)/2], lat[len(lat)-1])
	return lat[len(lat)/2]
}

// ConsumeOnce long-polls queue on b once per push through a, checks that
// each of n messages arrives exactly once, and returns each push → delivery
// time.
func ConsumeOnce(t testing.TB, a, b *Instance, queue string, n int) []time.Duration {
	t.Helper()
	seen := map[int]int{}
	var lat []time.Duration
	for i := range n {
		got := b.LongPoll(queue, 20*time.Second)
		start := time.Now()
		a.Push(queue, fmt.Sprintf(`{"i":%d}`, i))
		ans := Wait(t, got, 25*time.Second)
		lat = append(lat, ans.At.Sub(start))
		require.Equal(t, http.StatusOK, ans.Status, ans.Body)
		var pop struct {
			Messages []struct {
				Data struct {
					I int `json:"i"`
				} `json:"data"`
			} `json:"messages"`
		}
		require.NoError(t, json.Unmarshal([]byte(ans.Body), &pop))
		for _, m := range pop.Messages {
			seen[m.Data.I]++
		}
	}
	for i := range n {
		assert.Equal(t, 1, seen[i], "message %d", i)
	}
	return lat
}
