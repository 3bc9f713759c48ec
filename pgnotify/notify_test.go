package pgnotify_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/internal/server/servertest"
	"github.com/heraldmq/herald/pgnotify"
	"github.com/heraldmq/herald/queue"
)

// A long-poll on instance B gets a message pushed through instance A: A's
// notifier NOTIFYs, B's listener wakes its poller.
func TestNotify_CrossInstance(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	a, b := servertest.Start(t, dsn, "notify"), servertest.Start(t, dsn, "notify")
	// Each of 20 within 10 s, where the sweep is a minute: woken, not swept
	// (cmd/herald-bench cluster measures how fast).
	servertest.CrossLatency(t, a, b, "xq")
}

// A message enqueued with the push SQL function wakes waiting consumers.
func TestNotify_SQLFunction(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	b := servertest.Start(t, dsn, "notify")
	got := b.LongPoll("sqlq", 10*time.Second)
	start := time.Now()
	_, err := b.Store().Pool().Exec(context.Background(), `SELECT push('sqlq', NULL, '{"from":"sql"}', NULL)`)
	require.NoError(t, err)
	ans := servertest.Wait(t, got, 10*time.Second)
	require.Equal(t, http.StatusOK, ans.Status, ans.Body)
	assert.Contains(t, ans.Body, `"data":{"from":"sql"}`)
	assert.Less(t, ans.At.Sub(start), time.Second, "woken by the function's NOTIFY, not the sweep (1 min)")
}

// 10,000 pushes to one queue in a burst cost a bounded number of NOTIFYs:
// at most one per window, plus the leading edge.
func TestNotify_BurstIsBounded(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	a := servertest.Start(t, dsn, "notify")
	start := time.Now()
	var wg sync.WaitGroup
	for g := range 10 {
		wg.Go(func() {
			for i := range 1000 {
				_, err := a.Store().Push(context.Background(), []queue.PushItem{{Queue: "burst", Payload: []byte(fmt.Sprintf(`{"g":%d,"i":%d}`, g, i))}})
				if !assert.NoError(t, err) {
					return
				}
				a.Notifier().Notify("burst", "Default")
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	// Wait for the trailing edge: no new NOTIFY for three windows.
	last, quiet := a.Notifier().Sent(), time.Now()
	require.Eventually(t, func() bool {
		if n := a.Notifier().Sent(); n != last {
			last, quiet = n, time.Now()
		}
		return last > 0 && time.Since(quiet) >= 3*20*time.Millisecond
	}, 5*time.Second, 5*time.Millisecond)
	bound := uint64(took/(20*time.Millisecond)) + 2
	t.Logf("10,000 pushes in %v: %d NOTIFYs (bound %d)", took, a.Notifier().Sent(), bound)
	assert.LessOrEqual(t, a.Notifier().Sent(), bound)
}

// The database restarts under two instances: messages pushed after it is
// back are all delivered across instances once the listener reconnects; a
// message pushed while it is down fails (the client retries) and is then
// delivered too.
func TestNotify_DatabaseRestart(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	a, b := servertest.Start(t, dsn, "notify"), servertest.Start(t, dsn, "notify")
	got := b.LongPoll("rq", 60*time.Second)
	a.Push("rq", `{"before":true}`)
	ans := servertest.Wait(t, got, 10*time.Second)
	require.Equal(t, http.StatusOK, ans.Status, ans.Body)

	waiting := b.LongPoll("rq", 60*time.Second)
	pgtest.Restart(t, func() {
		// While it is down, a push is refused: nothing is lost, the client
		// is told to retry (503 with Retry-After).
		res, err := http.Post(a.URL()+"/api/v1/push", "application/json",
			strings.NewReader(`{"items":[{"queue":"rq","payload":{"during":true}}]}`))
		require.NoError(t, err)
		_ = res.Body.Close()
		assert.Equal(t, http.StatusServiceUnavailable, res.StatusCode)
		assert.NotEmpty(t, res.Header.Get("Retry-After"))
	})
	// Retry the push until the pool reconnects, as a client would.
	require.Eventually(t, func() bool {
		res, err := http.Post(a.URL()+"/api/v1/push", "application/json",
			strings.NewReader(`{"items":[{"queue":"rq","transactionId":"during","payload":{"during":true}}]}`))
		if err != nil {
			return false
		}
		_ = res.Body.Close()
		return res.StatusCode == http.StatusCreated
	}, 30*time.Second, 100*time.Millisecond)
	ans = servertest.Wait(t, waiting, 30*time.Second)
	require.Equal(t, http.StatusOK, ans.Status, ans.Body)
	assert.Contains(t, ans.Body, `"during":true`)

	// After the outage, NOTIFY works again.
	for i := range 5 {
		got := b.LongPoll("rq", 10*time.Second)
		a.Push("rq", fmt.Sprintf(`{"after":%d}`, i))
		ans := servertest.Wait(t, got, 10*time.Second)
		require.Equal(t, http.StatusOK, ans.Status, ans.Body)
		assert.Contains(t, ans.Body, fmt.Sprintf(`"after":%d`, i))
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
	dsn := servertest.SharedDSN(t)
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

// sqlLog records the text of every statement a pool sends.
type sqlLog struct {
	mu  sync.Mutex
	sql []string
}

func (l *sqlLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sql = append(l.sql, d.SQL)
	return ctx
}

func (*sqlLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (*sqlLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (l *sqlLog) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sql = append(l.sql, d.SQL)
}

func (*sqlLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (l *sqlLog) since(n int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.sql[n:])
}

// A NOTIFY goes out as one statement in a transaction of its own that
// does not wait for its commit's flush: the statement turns
// synchronous_commit off for its transaction only, and no BEGIN, SET or
// COMMIT statement goes with it.
func TestNotifier_SendsOneStatementCommittedAsynchronously(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	log := &sqlLog{}
	cfg.ConnConfig.Tracer = log
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	channel, err := pgnotify.Channel(ctx, pool)
	require.NoError(t, err)

	listen, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = listen.Close(context.Background()) })
	_, err = listen.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize())
	require.NoError(t, err)

	n, err := pgnotify.NewNotifier(pgnotify.NotifierConfig{Pool: pool})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- n.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-done)
	})
	// The first send looks the channel up: let it, then count.
	n.Notify("warm", "")
	require.Eventually(t, func() bool { return n.Sent() == 1 }, 10*time.Second, time.Millisecond)
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = listen.WaitForNotification(waitCtx)
	require.NoError(t, err)

	mark := len(log.since(0))
	n.Notify("q", "p")
	require.Eventually(t, func() bool { return n.Sent() == 2 }, 10*time.Second, time.Millisecond)
	got, err := listen.WaitForNotification(waitCtx)
	require.NoError(t, err)
	assert.Equal(t, "q\np", got.Payload)
	sent := log.since(mark)
	require.Len(t, sent, 1, "one statement: %q", sent)
	assert.Contains(t, sent[0], "-- herald:notify")

	// Its transaction commits with synchronous_commit off; the setting
	// ends with it (the test cluster runs with it off: the session turns
	// it on first).
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "SET synchronous_commit = on")
	require.NoError(t, err)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, sent[0], channel, []string{"x"})
	require.NoError(t, err)
	var inside string
	require.NoError(t, tx.QueryRow(ctx, "SELECT current_setting('synchronous_commit')").Scan(&inside))
	require.NoError(t, tx.Commit(ctx))
	assert.Equal(t, "off", inside)
	var after string
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_setting('synchronous_commit')").Scan(&after))
	assert.Equal(t, "on", after, "local to the notifying transaction")
}

// pingLog records when the listener's pings start.
type pingLog struct {
	mu sync.Mutex
	at []time.Time
}

func (l *pingLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "pg_notification_queue_usage") {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.at = append(l.at, time.Now())
	}
	return ctx
}

func (*pingLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (l *pingLog) pings() []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.at)
}

// pingLogged is a pool of the shared database whose connections' pings
// log records.
func pingLogged(t *testing.T) (*pgxpool.Pool, *pingLog) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(servertest.SharedDSN(t))
	require.NoError(t, err)
	log := &pingLog{}
	cfg.ConnConfig.Tracer = log
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, log
}

// A quiet LISTEN connection is pinged only at the instants NextPing gives
// (the instance's members beat's, so that an idle instance wakes once for
// both), once it has been quiet for PingInterval: never twice between two
// instants, however short PingInterval is.
func TestListener_PingsAQuietConnectionOnlyAtTheInstantsItIsGiven(t *testing.T) {
	pool, log := pingLogged(t)

	const every = 400 * time.Millisecond
	anchor := time.Now()
	instant := func(t time.Time) time.Time { // the first instant at or after t
		k := (t.Sub(anchor) + every - 1) / every
		return anchor.Add(k * every)
	}
	l, err := pgnotify.NewListener(pgnotify.ListenerConfig{Pool: pool, Waker: &recordingWaker{},
		PingInterval: 50 * time.Millisecond, NextPing: instant})
	require.NoError(t, err)
	stop := runListener(t, l)
	require.Eventually(t, func() bool { return len(log.pings()) >= 4 }, time.Minute, 10*time.Millisecond,
		"a quiet connection is pinged")
	stop()

	// Between two instants, one ping at most: a ping delayed past its
	// instant waits PingInterval, and then for the next instant.
	seen := map[time.Duration]bool{}
	for _, at := range log.pings() {
		slot := at.Sub(anchor) / every
		assert.False(t, seen[slot], "two pings between the instants %v and %v after the anchor", slot*every, (slot+1)*every)
		seen[slot] = true
	}
}

// A NextPing that answers an instant before the one it is asked about (a
// time in the past) does not make the listener ping in a loop: a quiet
// connection is pinged PingInterval after its last sign of life at the
// soonest, whatever NextPing says.
func TestListener_PingsNoSoonerThanPingIntervalWhateverNextPingSays(t *testing.T) {
	pool, log := pingLogged(t)

	const interval = 100 * time.Millisecond
	l, err := pgnotify.NewListener(pgnotify.ListenerConfig{Pool: pool, Waker: &recordingWaker{},
		PingInterval: interval, NextPing: func(time.Time) time.Time { return time.Time{} }})
	require.NoError(t, err)
	stop := runListener(t, l)
	require.Eventually(t, func() bool { return len(log.pings()) >= 4 }, time.Minute, 10*time.Millisecond,
		"a quiet connection is pinged")
	stop()

	pings := log.pings()
	for i := 1; i < len(pings); i++ {
		assert.GreaterOrEqual(t, pings[i].Sub(pings[i-1]), interval, "ping %d of %d", i, len(pings))
	}
}

// execJob is a Do job that runs sql.
func execJob(sql string) func(context.Context, *pgx.Conn) error {
	return func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, sql)
		return err
	}
}

// listening runs a listener of the shared database, waking w, until the
// test ends; its pool and the channel it listens on come with it.
func listening(t *testing.T) (l *pgnotify.Listener, pool *pgxpool.Pool, w *recordingWaker, channel string) {
	t.Helper()
	pool, _ = pingLogged(t)
	w = &recordingWaker{}
	l, err := pgnotify.NewListener(pgnotify.ListenerConfig{Pool: pool, Waker: w})
	require.NoError(t, err)
	runListener(t, l)
	channel, err = pgnotify.Channel(context.Background(), pool)
	require.NoError(t, err)
	return l, pool, w, channel
}

// runListener runs l until the returned stop is called (or the test ends),
// once it has listened.
func runListener(t *testing.T, l *pgnotify.Listener) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = l.Run(ctx)
	}()
	stop = func() {
		cancel()
		<-done
	}
	t.Cleanup(stop)
	<-l.Connected()
	return stop
}

// A job given to Do runs on the LISTEN connection itself, between two
// waits, and the connection listens on after it: the instance's members
// beat goes there, so that one backend wakes for it and the liveness check.
func TestListener_DoRunsTheJobOnTheListeningConnection(t *testing.T) {
	ctx := context.Background()
	l, pool, w, channel := listening(t)

	var channels []string
	require.NoError(t, l.Do(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		rows, err := conn.Query(ctx, `SELECT pg_listening_channels()`)
		if err != nil {
			return err
		}
		channels, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	}))
	assert.Equal(t, []string{channel}, channels, "the job's connection is the one that listens")

	_, err := pool.Exec(ctx, `SELECT pg_notify($1, 'after-the-job')`, channel)
	require.NoError(t, err)
	require.Eventually(t, func() bool { got, _ := w.seen(); return slices.Contains(got, "after-the-job/") },
		10*time.Second, 5*time.Millisecond, "it listens on after the job")
}

// A job proves the connection alive as a ping does: a connection given
// jobs more often than PingInterval is never pinged.
func TestListener_AConnectionGivenJobsIsNotPinged(t *testing.T) {
	ctx := context.Background()
	pool, log := pingLogged(t)
	const interval = 2 * time.Second
	l, err := pgnotify.NewListener(pgnotify.ListenerConfig{Pool: pool, Waker: &recordingWaker{}, PingInterval: interval})
	require.NoError(t, err)
	runListener(t, l)

	jobs := 0
	every := time.NewTicker(20 * time.Millisecond)
	defer every.Stop()
	for start := time.Now(); time.Since(start) < 2*interval+interval/2; <-every.C {
		require.NoError(t, l.Do(ctx, execJob(`SELECT 1`)))
		jobs++
	}
	assert.Empty(t, log.pings(), "pinged although %d jobs ran on it", jobs)
}

// Do answers ErrNotListening at once while no connection listens (before
// the listener has listened, after it stopped): its caller sends the work
// on a connection of its own.
func TestListener_DoWithoutAListeningConnectionIsRefused(t *testing.T) {
	ctx := context.Background()
	pool, _ := pingLogged(t)
	l, err := pgnotify.NewListener(pgnotify.ListenerConfig{Pool: pool, Waker: &recordingWaker{}})
	require.NoError(t, err)
	ran := false
	job := func(context.Context, *pgx.Conn) error { ran = true; return nil }
	require.ErrorIs(t, l.Do(ctx, job), pgnotify.ErrNotListening, "before Run")

	stop := runListener(t, l)
	require.NoError(t, l.Do(ctx, job))
	require.True(t, ran)
	stop()
	ran = false
	require.ErrorIs(t, l.Do(ctx, job), pgnotify.ErrNotListening, "after Run")
	assert.False(t, ran)
}

// A job's statement error leaves the connection listening; a job that
// loses the connection (or hangs past the ping's timeout) ends it: the
// listener connects again and sweeps, as after any failure, and the job's
// caller has its error.
func TestListener_AJobThatLosesTheConnectionReconnects(t *testing.T) {
	ctx := context.Background()
	pool, _ := pingLogged(t)
	w := &recordingWaker{}
	l, err := pgnotify.NewListener(pgnotify.ListenerConfig{Pool: pool, Waker: w,
		BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
	require.NoError(t, err)
	runListener(t, l)
	require.Error(t, l.Do(ctx, execJob(`SELECT 1/0`)))
	require.NoError(t, l.Do(ctx, execJob(`SELECT 1`)))
	_, sweeps := w.seen()
	assert.Equal(t, 1, sweeps, "a statement's error keeps the connection")

	require.Error(t, l.Do(ctx, execJob(`SELECT pg_terminate_backend(pg_backend_pid())`)))
	require.Eventually(t, func() bool { _, sweeps := w.seen(); return sweeps == 2 }, 10*time.Second, 5*time.Millisecond,
		"connected again, and swept")
	require.Eventually(t, func() bool { return l.Do(ctx, execJob(`SELECT 1`)) == nil }, 10*time.Second, 5*time.Millisecond)

	start := time.Now()
	require.Error(t, l.Do(ctx, execJob(`SELECT pg_sleep(60)`)), "a hung job is given up")
	assert.Less(t, time.Since(start), 30*time.Second)
	require.Eventually(t, func() bool { _, sweeps := w.seen(); return sweeps == 3 }, 30*time.Second, 5*time.Millisecond,
		"connected again after the hung job")
}

// A connection that jobs keep from being quiet (never pinged for its
// liveness) still has its NOTIFY queue usage read, every ten
// PingIntervals, in the turn of a job.
func TestListener_AConnectionGivenJobsHasItsNotifyQueueUsageReadEveryTenPingIntervals(t *testing.T) {
	ctx := context.Background()
	pool, log := pingLogged(t)
	const interval = 300 * time.Millisecond
	l, err := pgnotify.NewListener(pgnotify.ListenerConfig{Pool: pool, Waker: &recordingWaker{}, PingInterval: interval})
	require.NoError(t, err)
	runListener(t, l)

	every := time.NewTicker(20 * time.Millisecond)
	defer every.Stop()
	for start := time.Now(); len(log.pings()) < 2; <-every.C {
		require.Less(t, time.Since(start), time.Minute, "the usage is never read")
		require.NoError(t, l.Do(ctx, execJob(`SELECT 1`)))
	}
	pings := log.pings()
	for i := 1; i < len(pings); i++ {
		assert.GreaterOrEqual(t, pings[i].Sub(pings[i-1]), 10*interval, "usage read %d of %d", i, len(pings))
	}
}

// Jobs interrupting the wait for notifications (at any point of it, a
// notification's read included) lose none: each is heard once, whether
// it came during the wait or during a job.
func TestListener_JobsInterruptingTheWaitLoseNoNotification(t *testing.T) {
	ctx := context.Background()
	l, pool, w, channel := listening(t)

	const sent = 400
	done := make(chan error, 1)
	go func() {
		for i := range sent {
			if _, err := pool.Exec(ctx, `SELECT pg_notify($1, $2)`, channel, fmt.Sprintf("n%d", i)); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	jobs := 0
	for sending := true; sending; jobs++ {
		select {
		case err := <-done:
			require.NoError(t, err)
			sending = false
		default:
		}
		require.NoError(t, l.Do(ctx, execJob(`SELECT 1`)))
	}
	require.Eventually(t, func() bool { got, _ := w.seen(); return len(got) >= sent }, 10*time.Second, 5*time.Millisecond)
	got, sweeps := w.seen()
	want := make([]string, sent)
	for i := range want {
		want[i] = fmt.Sprintf("n%d/", i)
	}
	assert.Equal(t, want, got, "every notification once, in order, across %d jobs", jobs)
	assert.Equal(t, 1, sweeps, "the connection was never made again")
}
