package pgnotify_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/pgnotify"
	"github.com/heraldmq/herald/queue"
)

// crossLatency pushes 20 messages through a and long-polls them on b,
// returning the median push → delivery time.
func crossLatency(t *testing.T, a, b *instance, queue string) time.Duration {
	t.Helper()
	var lat []time.Duration
	for i := range 20 {
		got := b.longPoll(queue, 10*time.Second)
		start := time.Now()
		a.push(queue, fmt.Sprintf(`{"i":%d}`, i))
		ans := wait(t, got, 10*time.Second)
		require.Equal(t, http.StatusOK, ans.status, ans.body)
		assert.Contains(t, ans.body, fmt.Sprintf(`"data":{"i":%d}`, i))
		lat = append(lat, ans.at.Sub(start))
	}
	slices.Sort(lat)
	t.Logf("cross-instance push → delivery: p50 %v, max %v", lat[len(lat)/2], lat[len(lat)-1])
	return lat[len(lat)/2]
}

// A long-poll on instance B gets a message pushed through instance A within
// 50 ms (median of 20): A's notifier NOTIFYs, B's listener wakes its poller.
func TestNotify_CrossInstance(t *testing.T) {
	dsn := sharedDSN(t)
	a, b := newInstance(t, dsn), newInstance(t, dsn)
	assert.LessOrEqual(t, crossLatency(t, a, b, "xq"), 50*time.Millisecond)
}

// With syncnet instead of NOTIFY: A sends MESSAGE_AVAILABLE to B, which
// has the consumer, and B's poller wakes (median of 20 within 50 ms, the
// NOTIFY test's bound, under -race and a loaded CI; the benchmark gives the
// real figures).
func TestSyncnet_CrossInstance(t *testing.T) {
	dsn := sharedDSN(t)
	a, b := newInstanceMode(t, dsn, "syncnet"), newInstanceMode(t, dsn, "syncnet")
	link(a, b)
	assert.LessOrEqual(t, crossLatency(t, a, b, "sq"), 50*time.Millisecond)
}

// With 30% of syncnet's datagrams lost, every message pushed through A is
// consumed on B exactly once: a lost wake-up costs latency, never a message.
func TestSyncnet_LossyNetworkLosesNothing(t *testing.T) {
	dsn := sharedDSN(t)
	a, b := newInstanceMode(t, dsn, "syncnet-lossy"), newInstanceMode(t, dsn, "syncnet-lossy")
	link(a, b)
	var slow []time.Duration
	for _, d := range consumeOnce(t, a, b, "lossy", 100) {
		if d > 20*time.Millisecond {
			slow = append(slow, d)
		}
	}
	t.Logf("%d of 100 deliveries took over 20 ms (lost wake-ups, caught by re-checks): %v", len(slow), slow)
}

// A message enqueued with the push SQL function wakes waiting consumers.
func TestNotify_SQLFunction(t *testing.T) {
	dsn := sharedDSN(t)
	b := newInstance(t, dsn)
	got := b.longPoll("sqlq", 10*time.Second)
	start := time.Now()
	_, err := b.store.Pool().Exec(context.Background(), `SELECT push('sqlq', NULL, '{"from":"sql"}', NULL)`)
	require.NoError(t, err)
	ans := wait(t, got, 10*time.Second)
	require.Equal(t, http.StatusOK, ans.status, ans.body)
	assert.Contains(t, ans.body, `"data":{"from":"sql"}`)
	assert.Less(t, ans.at.Sub(start), time.Second, "woken by the function's NOTIFY, not the sweep (1 min)")
}

// 10,000 pushes to one queue in a burst cost a bounded number of NOTIFYs:
// at most one per window, plus the leading edge.
func TestNotify_BurstIsBounded(t *testing.T) {
	dsn := sharedDSN(t)
	a := newInstance(t, dsn)
	start := time.Now()
	var wg sync.WaitGroup
	for g := range 10 {
		wg.Go(func() {
			for i := range 1000 {
				_, err := a.store.Push(context.Background(), []queue.PushItem{{Queue: "burst", Payload: []byte(fmt.Sprintf(`{"g":%d,"i":%d}`, g, i))}})
				if !assert.NoError(t, err) {
					return
				}
				a.notifier.Notify("burst", "Default")
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	// Wait for the trailing edge: no new NOTIFY for three windows.
	last, quiet := a.notifier.Sent(), time.Now()
	require.Eventually(t, func() bool {
		if n := a.notifier.Sent(); n != last {
			last, quiet = n, time.Now()
		}
		return last > 0 && time.Since(quiet) >= 3*20*time.Millisecond
	}, 5*time.Second, 5*time.Millisecond)
	bound := uint64(took/(20*time.Millisecond)) + 2
	t.Logf("10,000 pushes in %v: %d NOTIFYs (bound %d)", took, a.notifier.Sent(), bound)
	assert.LessOrEqual(t, a.notifier.Sent(), bound)
}

// The database restarts under two instances: messages pushed after it is
// back are all delivered across instances once the listener reconnects; a
// message pushed while it is down fails (the client retries) and is then
// delivered too.
func TestNotify_DatabaseRestart(t *testing.T) {
	dsn := sharedDSN(t)
	a, b := newInstance(t, dsn), newInstance(t, dsn)
	got := b.longPoll("rq", 60*time.Second)
	a.push("rq", `{"before":true}`)
	ans := wait(t, got, 10*time.Second)
	require.Equal(t, http.StatusOK, ans.status, ans.body)

	waiting := b.longPoll("rq", 60*time.Second)
	pgtest.Restart(t, func() {
		// While it is down, a push is refused: nothing is lost, the client
		// is told to retry.
		res, err := http.Post(a.ts.URL+"/api/v1/push", "application/json",
			stringsReader(`{"items":[{"queue":"rq","payload":{"during":true}}]}`))
		require.NoError(t, err)
		_ = res.Body.Close()
		assert.Equal(t, http.StatusInternalServerError, res.StatusCode)
	})
	// Retry the push until the pool reconnects, as a client would.
	require.Eventually(t, func() bool {
		res, err := http.Post(a.ts.URL+"/api/v1/push", "application/json",
			stringsReader(`{"items":[{"queue":"rq","transactionId":"during","payload":{"during":true}}]}`))
		if err != nil {
			return false
		}
		_ = res.Body.Close()
		return res.StatusCode == http.StatusCreated
	}, 30*time.Second, 100*time.Millisecond)
	ans = wait(t, waiting, 30*time.Second)
	require.Equal(t, http.StatusOK, ans.status, ans.body)
	assert.Contains(t, ans.body, `"during":true`)

	// After the outage, NOTIFY works again.
	for i := range 5 {
		got := b.longPoll("rq", 10*time.Second)
		a.push("rq", fmt.Sprintf(`{"after":%d}`, i))
		ans := wait(t, got, 10*time.Second)
		require.Equal(t, http.StatusOK, ans.status, ans.body)
		assert.Contains(t, ans.body, fmt.Sprintf(`"after":%d`, i))
	}
}

// recordingWaker records wake-ups for tests.
type recordingWaker struct {
	mu    sync.Mutex
	wakes []string
	all   int
}

func (r *recordingWaker) Wake(_, q, p string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.wakes = append(r.wakes, q+"/"+p)
}

func (r *recordingWaker) WakeAll(string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all++
}

func (r *recordingWaker) seen() ([]string, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.wakes), r.all
}

// With --listen-database-url the listener opens its own connection; it
// sweeps once when it connects, decodes queue and partitions, ignores
// foreign payloads on the channel and its own instance's notifications.
func TestListener_OwnURL(t *testing.T) {
	dsn := sharedDSN(t)
	w := &recordingWaker{}
	l, err := pgnotify.NewListener(pgnotify.ListenerConfig{URL: dsn, Waker: w, Self: "me"})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = l.Run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	<-l.Connected()
	pool, err := queue.NewPool(context.Background(), dsn, 0)
	require.NoError(t, err)
	defer pool.Close()
	channel, err := pgnotify.Channel(context.Background(), pool)
	require.NoError(t, err)
	// Its own notifications (sender line "me") are skipped; others' are not.
	for _, p := range []string{"mine\np9\n\x01me", "q1\np1\np2\n\x01other", "", "q2"} {
		_, err := pool.Exec(context.Background(), `SELECT pg_notify($1, $2)`, channel, p)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { got, _ := w.seen(); return len(got) == 3 }, 5*time.Second, 5*time.Millisecond)
	got, all := w.seen()
	assert.Equal(t, []string{"q1/p1", "q1/p2", "q2/"}, got)
	assert.Equal(t, 1, all, "one backlog sweep on connect")

	_, err = pgnotify.NewListener(pgnotify.ListenerConfig{URL: dsn, Pool: pool, Waker: w})
	assert.Error(t, err, "exactly one of Pool and URL")
}

// consumeOnce long-polls queue on b once per push through a, checks that
// each of n messages arrives exactly once, and returns each push → delivery
// time.
func consumeOnce(t *testing.T, a, b *instance, queue string, n int) []time.Duration {
	t.Helper()
	seen := map[int]int{}
	var lat []time.Duration
	for i := range n {
		got := b.longPoll(queue, 20*time.Second)
		start := time.Now()
		a.push(queue, fmt.Sprintf(`{"i":%d}`, i))
		ans := wait(t, got, 25*time.Second)
		lat = append(lat, ans.at.Sub(start))
		require.Equal(t, http.StatusOK, ans.status, ans.body)
		var pop struct {
			Messages []struct {
				Data struct {
					I int `json:"i"`
				} `json:"data"`
			} `json:"messages"`
		}
		require.NoError(t, json.Unmarshal([]byte(ans.body), &pop))
		for _, m := range pop.Messages {
			seen[m.Data.I]++
		}
	}
	for i := range n {
		assert.Equal(t, 1, seen[i], "message %d", i)
	}
	return lat
}

// Stale presence, one way: A believes B has no consumers (B's
// announcements are lost), so A sends B nothing. B still consumes every
// message exactly once: its own checks find them.
func TestSyncnet_StalePresenceAbsent(t *testing.T) {
	dsn := sharedDSN(t)
	// A in the same mode for the same timings; it has no consumers to announce.
	a, b := newInstanceMode(t, dsn, "syncnet-noregister"), newInstanceMode(t, dsn, "syncnet-noregister")
	link(a, b)
	_ = b.longPoll("stale-a", time.Second) // B has a consumer, and says so in vain
	require.Eventually(t, func() bool {
		has, known := a.node.HasSubscribers("stale-a")
		return known && !has
	}, 10*time.Second, 20*time.Millisecond, "A's view: presence known, nobody consumes stale-a")
	consumeOnce(t, a, b, "stale-a", 20)
}

// Stale presence, the other way: A believes B still has a consumer (B's
// DEREGISTERED is lost), so A wakes B for nothing. Nothing is lost or
// doubled: the message waits for the next consumer.
func TestSyncnet_StalePresencePresent(t *testing.T) {
	dsn := sharedDSN(t)
	// A in the same mode for the same timings (presence it hears lasts 3 s).
	a, b := newInstanceMode(t, dsn, "syncnet-noderegister"), newInstanceMode(t, dsn, "syncnet-noderegister")
	link(a, b)
	consumeOnce(t, a, b, "stale-p", 1) // B had a consumer; it left, unannounced
	require.Eventually(t, func() bool {
		has, known := a.node.HasSubscribers("stale-p")
		return known && has
	}, 10*time.Second, 20*time.Millisecond, "A still believes B consumes stale-p")
	a.push("stale-p", `{"i":1}`) // B is woken with nobody waiting
	status, body := b.call(http.MethodGet, "/api/v1/pop/queue/stale-p?autoAck=true", "")
	require.Equal(t, http.StatusOK, status, body)
	assert.Contains(t, body, `"data":{"i":1}`)
	ans := wait(t, b.longPoll("stale-p", 300*time.Millisecond), 5*time.Second)
	assert.Equal(t, http.StatusNoContent, ans.status, "delivered once")
}
