package pgnotify

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
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
	// pingTimeout bounds the ping: a hung server fails it.
	pingTimeout = 3 * time.Second
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
}

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
	up()
	// Anything may have changed while we were not listening.
	l.cfg.Waker.WakeAll(SourceNotify)
	if l.cfg.OnState != nil {
		l.cfg.OnState()
	}
	l.log.Info().Str("channel", channelPrefix+schema).Msg("listening")
	heard := time.Now() // the connection's last sign of life
	for {
		wctx, cancel := context.WithDeadline(ctx, l.pingAt(heard))
		n, err := conn.WaitForNotification(wctx)
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
		case errors.Is(err, context.DeadlineExceeded) || pgconnTimeout(err):
			// Quiet: check the connection, and read the NOTIFY queue usage.
			var usage float64
			pctx, cancel := context.WithTimeout(ctx, pingTimeout)
			err := conn.QueryRow(pctx, `SELECT pg_notification_queue_usage()`).Scan(&usage)
			cancel()
			if err != nil {
				return true, fmt.Errorf("pinging the LISTEN connection: %w", err)
			}
			heard = time.Now()
			l.usage.Set(usage)
		default:
			return true, fmt.Errorf("waiting for notifications: %w", err)
		}
	}
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
