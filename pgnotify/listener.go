package pgnotify

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Waker is what notifications wake; *poller.Poller is one.
type Waker interface {
	// Wake marks one queue (and partition, when known) as possibly having work.
	Wake(source, queue, partition string)
	// WakeAll marks every queue with waiting consumers: used after
	// (re)connecting, since anything may have changed while not listening.
	WakeAll(source string)
}

// SourceNotify labels wake-ups from NOTIFY (herald_wakeups_total{source}).
const SourceNotify = "notify"

// Defaults of ListenerConfig fields.
const (
	// PingIntervalDefault: a LISTEN connection silent for 3 s is pinged
	// (one cheap query; at the next members beat in an instance, so every
	// 4 s when idle), so a dead or hung one is left within about 8 s (with
	// pingTimeout), and the wake-ups it carried resume after a failover
	// with the rest of Herald, not at a 30 s ping.
	PingIntervalDefault = 3 * time.Second
	BackoffMinDefault   = 100 * time.Millisecond
	BackoffMaxDefault   = 5 * time.Second
	// pingTimeout bounds the ping (and a Do job): a hung server fails it.
	pingTimeout = 3 * time.Second
	// usageEvery: a connection that jobs keep from being quiet (so never
	// pinged) has its NOTIFY queue usage read every usageEvery
	// PingIntervals (30 s by default), in the turn of a job.
	usageEvery = 10
)

// ListenerConfig configures a Listener. Exactly one of Pool and URL is set.
type ListenerConfig struct {
	// Pool lends the listener one connection, taken out of the pool for
	// good (hijacked) while it listens.
	Pool *pgxpool.Pool
	// URL, instead of Pool, opens a connection of its own: for setups where
	// the pool goes through a transaction-mode pooler, which cannot LISTEN.
	// Its search_path must name the same schema as the pool's.
	URL string
	// Waker receives the wake-ups. Required.
	Waker Waker
	// Self, when set, is this instance's NotifierConfig.Sender: its own
	// notifications are skipped.
	Self string
	// OnState, when set, is called when the cluster-wide switches may have
	// changed: on the notification their writer sends (StatePayload), and
	// after every (re)connect, since one may have been missed. Called on
	// the listener's goroutine; it must not block.
	OnState func()
	// PingInterval is how long the connection may be silent before it is
	// pinged, so that a dead one is noticed. Zero means
	// PingIntervalDefault.
	PingInterval time.Duration
	// NextPing, when set, says when a connection silent since t (plus
	// PingInterval) is pinged: the first of the instance's own instants at
	// or after t. The assembly gives the members beat's (internal/tick), so
	// that an idle instance wakes once for the beat and the ping, not once
	// for each. Nil pings at t, as does a NextPing answering a time
	// before t.
	NextPing func(t time.Time) time.Time
	// BackoffMin and BackoffMax bound the reconnect back-off (doubling,
	// ±10% jitter). Zero means the defaults.
	BackoffMin, BackoffMax time.Duration
	// Registerer receives the listener's metrics; nil registers nowhere.
	Registerer prometheus.Registerer
	// Logger; the zero value logs nothing.
	Logger zerolog.Logger
}

// Listener holds one LISTEN connection and turns notifications into
// wake-ups. After every (re)connect it wakes everything once (the backlog
// sweep), because notifications sent while it was not listening are lost.
type Listener struct {
	cfg ListenerConfig
	log zerolog.Logger

	reconnects prometheus.Counter
	received   prometheus.Counter
	usage      prometheus.Gauge
	connected  chan struct{} // closed on the first successful LISTEN

	mu        sync.Mutex
	listening bool               // a session listens: Do hands it jobs
	jobs      []*job             // waiting for the session's next turn
	interrupt context.CancelFunc // ends the session's current wait
}

// job is one Do call's work, answered on done.
type job struct {
	ctx  context.Context
	fn   func(context.Context, *pgx.Conn) error
	done chan error
}

// ErrNotListening answers Do while no connection listens.
var ErrNotListening = errors.New("pgnotify: the listener is not listening")

// NewListener returns a Listener; nothing happens until Run.
func NewListener(cfg ListenerConfig) (*Listener, error) {
	switch {
	case cfg.Waker == nil:
		return nil, errors.New("pgnotify: ListenerConfig.Waker is required")
	case (cfg.Pool == nil) == (cfg.URL == ""):
		return nil, errors.New("pgnotify: set exactly one of ListenerConfig.Pool and ListenerConfig.URL")
	}
	cfg.PingInterval = cmp.Or(cfg.PingInterval, PingIntervalDefault)
	cfg.BackoffMin, cfg.BackoffMax = backoffOrDefaults(cfg.BackoffMin, cfg.BackoffMax)
	l := &Listener{cfg: cfg, log: cfg.Logger.With().Str("component", "listener").Logger(), connected: make(chan struct{}),
		reconnects: counter("herald_listen_reconnects_total", "Times the LISTEN connection was re-established after a failure."),
		received:   counter("herald_notifications_received_total", "Herald notifications received on the LISTEN connection."),
		usage: prometheus.NewGauge(prometheus.GaugeOpts{Name: "herald_notification_queue_usage",
			Help: "pg_notification_queue_usage(): the fraction of the server's NOTIFY queue in use."}),
	}
	if err := register(cfg.Registerer, l.reconnects, l.received, l.usage); err != nil {
		return nil, err
	}
	return l, nil
}

// Connected is closed once the listener has listened for the first time.
func (l *Listener) Connected() <-chan struct{} { return l.connected }

// Run listens until ctx ends, reconnecting with back-off after failures.
func (l *Listener) Run(ctx context.Context) error {
	reconnecting(ctx, l.cfg.BackoffMin, l.cfg.BackoffMax, l.reconnects, l.log, l.connected, l.session)
	return nil
}

// session connects, listens (calling up), sweeps the backlog and waits for
// notifications until the connection fails or ctx ends.
func (l *Listener) session(ctx context.Context, up func()) (listened bool, err error) {
	conn, err := l.connect(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var schema string
	if err := conn.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return false, fmt.Errorf("reading the current schema: %w", err)
	}
	if _, err := conn.Exec(ctx, listenSQL(channelPrefix+schema)); err != nil {
		return false, fmt.Errorf("listening: %w", err)
	}
	l.setListening(true) // before up: Do works once Connected says so
	defer l.setListening(false)
	up()
	// Anything may have changed while we were not listening.
	l.cfg.Waker.WakeAll(SourceNotify)
	if l.cfg.OnState != nil {
		l.cfg.OnState()
	}
	l.log.Info().Str("channel", channelPrefix+schema).Msg("listening")
	heard := time.Now() // the connection's last sign of life
	read := heard       // the NOTIFY queue usage's last read
	for {
		wctx, cancel := context.WithDeadline(ctx, l.pingAt(heard))
		if jobs := l.takeJobs(cancel); len(jobs) > 0 {
			cancel()
			if err := l.runJobs(ctx, conn, jobs); err != nil {
				return true, err
			}
			heard = time.Now() // the jobs' answers are signs of life
			if time.Since(read) >= usageEvery*l.cfg.PingInterval {
				// Never quiet: the usage is read with the jobs.
				if err := l.ping(ctx, conn); err != nil {
					return true, err
				}
				read = time.Now()
			}
			continue
		}
		n, err := conn.WaitForNotification(wctx)
		l.waited()
		cancel()
		if err == nil {
			heard = time.Now()
		}
		switch {
		case err == nil && n.Payload == StatePayload:
			if l.cfg.OnState != nil {
				l.cfg.OnState()
			}
		case err == nil:
			queue, parts, sender, ok := parsePayload(n.Payload)
			if !ok || (sender != "" && sender == l.cfg.Self) {
				continue
			}
			l.received.Inc()
			if len(parts) == 0 {
				l.cfg.Waker.Wake(SourceNotify, queue, "")
			}
			for _, p := range parts {
				l.cfg.Waker.Wake(SourceNotify, queue, p)
			}
		case ctx.Err() != nil:
			return true, nil
		case errors.Is(err, context.Canceled):
			// Interrupted by Do: the next turn runs its job.
		case errors.Is(err, context.DeadlineExceeded) || pgconnTimeout(err):
			// Quiet: check the connection, and read the NOTIFY queue usage.
			if err := l.ping(ctx, conn); err != nil {
				return true, err
			}
			heard, read = time.Now(), time.Now()
		default:
			return true, fmt.Errorf("waiting for notifications: %w", err)
		}
	}
}

// Do runs fn on the LISTEN connection between two waits for
// notifications, and answers its error. A job that answers proves the
// connection alive as a ping does: a connection given one more often than
// PingInterval is never pinged. A job is bounded by the ping's timeout; one
// that fails other than by a statement's error (a lost connection, a hung
// server) ends the connection, which is made again as after any failure.
// While no connection listens, Do answers ErrNotListening at once: the
// caller sends the work on a connection of its own.
func (l *Listener) Do(ctx context.Context, fn func(context.Context, *pgx.Conn) error) error {
	j := &job{ctx: ctx, fn: fn, done: make(chan error, 1)}
	l.mu.Lock()
	if !l.listening {
		l.mu.Unlock()
		return ErrNotListening
	}
	l.jobs = append(l.jobs, j)
	if l.interrupt != nil {
		l.interrupt()
		l.interrupt = nil
	}
	l.mu.Unlock()
	// Answered soon whatever ctx does: the wait is interrupted, a job
	// whose ctx ended is answered without running, and a running one is
	// bounded (and ended with ctx). Never before fn has returned.
	return <-j.done
}

// setListening opens or closes the listener to jobs; the jobs left when
// it closes are answered ErrNotListening.
func (l *Listener) setListening(on bool) {
	l.mu.Lock()
	l.listening = on
	left := l.jobs
	if !on {
		l.jobs, l.interrupt = nil, nil
	}
	l.mu.Unlock()
	if !on {
		for _, j := range left {
			j.done <- ErrNotListening
		}
	}
}

// takeJobs takes the waiting jobs; when there are none it leaves
// interrupt (the coming wait's end) to be called by the next Do.
func (l *Listener) takeJobs(interrupt context.CancelFunc) []*job {
	l.mu.Lock()
	defer l.mu.Unlock()
	jobs := l.jobs
	l.jobs, l.interrupt = nil, nil
	if len(jobs) == 0 {
		l.interrupt = interrupt
	}
	return jobs
}

// waited says the wait Do may interrupt has ended.
func (l *Listener) waited() {
	l.mu.Lock()
	l.interrupt = nil
	l.mu.Unlock()
}

// runJobs runs jobs on conn in turn. A failure other than a statement's
// error ends the session (its error); the jobs not run yet are answered
// ErrNotListening.
func (l *Listener) runJobs(ctx context.Context, conn *pgx.Conn, jobs []*job) error {
	for i, j := range jobs {
		if err := j.ctx.Err(); err != nil {
			j.done <- err
			continue
		}
		jctx, cancel := context.WithTimeout(ctx, pingTimeout)
		stop := context.AfterFunc(j.ctx, cancel)
		err := j.fn(jctx, conn)
		stop()
		cancel()
		j.done <- err
		var pgErr *pgconn.PgError
		if err != nil && (!errors.As(err, &pgErr) || conn.IsClosed()) {
			for _, left := range jobs[i+1:] {
				left.done <- ErrNotListening
			}
			return fmt.Errorf("a job on the LISTEN connection: %w", err)
		}
	}
	return nil
}

// ping checks the connection and reads the NOTIFY queue usage.
func (l *Listener) ping(ctx context.Context, conn *pgx.Conn) error {
	var usage float64
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := conn.QueryRow(pctx, `SELECT pg_notification_queue_usage()`).Scan(&usage); err != nil {
		return fmt.Errorf("pinging the LISTEN connection: %w", err)
	}
	l.usage.Set(usage)
	return nil
}

// pingAt is when a connection silent since heard is pinged: PingInterval
// later, at the next of NextPing's instants when it is set. Never sooner:
// a NextPing answering an earlier time would have the listener ping in a
// loop, one query after another.
func (l *Listener) pingAt(heard time.Time) time.Time {
	at := heard.Add(l.cfg.PingInterval)
	if l.cfg.NextPing != nil {
		if next := l.cfg.NextPing(at); next.After(at) {
			at = next
		}
	}
	return at
}

func (l *Listener) connect(ctx context.Context) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if l.cfg.URL != "" {
		conn, err := pgx.Connect(cctx, l.cfg.URL)
		if err != nil {
			return nil, fmt.Errorf("connecting the listener: %w", err)
		}
		return conn, nil
	}
	c, err := l.cfg.Pool.Acquire(cctx)
	if err != nil {
		return nil, fmt.Errorf("taking a connection for the listener: %w", err)
	}
	return c.Hijack(), nil
}

// pgconnTimeout reports a wait that ended by its deadline.
func pgconnTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

// jitter spreads d by ±10%.
func jitter(d time.Duration) time.Duration {
	spread := int64(d) / 10
	if spread <= 0 {
		return d
	}
	return d + time.Duration(rand.Int64N(2*spread+1)-spread) // #nosec G404 -- jitter, not security
}
