package queue

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ParsePoolConfig parses a database URL (or key=value DSN) into a pool
// configuration tuned for the Store:
//
//   - plan_cache_mode=force_generic_plan: every hot statement takes its
//     variable parts as arrays, so one generic plan fits all calls. Left to
//     itself Postgres re-plans the push statement on every call (its custom
//     plans look cheaper), which measured 0.9 ms per single-item push against
//     0.23 ms with the generic plan.
//   - application_name=herald, unless the DSN sets one, so the
//     connections are recognisable in pg_stat_activity.
//   - a tracer counting every statement by operation (Store.QueryStats).
//   - search_path=herald, unless the DSN sets one: Herald's tables (and the
//     herald.push SQL function) live in their own schema.
//   - statement_timeout=30s and idle_in_transaction_session_timeout=60s,
//     unless the DSN sets them: no statement or forgotten transaction of
//     Herald's holds locks, or the xmin horizon, for long.
//   - jit=off, unless the DSN sets it: Herald's statements read a few rows
//     by index, but the planner's cost of some (a claim over a queue of
//     100,000 partitions: 128,000) passes jit_above_cost, and compiling them
//     took 125 ms of a 150 ms pop (a WebSocket drain fell from 6,000 to
//     500 msgs/s).
//   - a connect timeout of ConnectTimeoutDefault, unless the DSN sets
//     connect_timeout: without one a host that accepts TCP but never
//     answers (a frozen primary) holds every new connection for good, and
//     a multi-host URL never moves on to the next host.
//   - TCP keepalives after 5 s idle, every 2 s, 3 probes (and on Linux
//     TCP_USER_TIMEOUT 10 s): a connection to a host that vanished is
//     found dead in seconds, not after the kernel's two hours.
//   - a hung host is left at once (see hostTracker): once a connection
//     attempt to a host goes unanswered, new connections try the URL's
//     other hosts first until it answers again, and the connections to it
//     are dropped; a cancel request waits at most a second for its
//     acknowledgement (pgx: 15 s, holding the connection's pool slot).
//     The pool's BeforeConnect, PrepareConn, DialFunc and LookupFunc are
//     set for this.
func ParsePoolConfig(dsn string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parsing database URL: %w", err)
	}
	cfg.ConnConfig.Tracer = queryTracer{stats: &QueryStats{}}
	rp := cfg.ConnConfig.RuntimeParams
	if _, ok := rp["plan_cache_mode"]; !ok {
		rp["plan_cache_mode"] = "force_generic_plan"
	}
	if _, ok := rp["search_path"]; !ok {
		rp["search_path"] = SchemaDefault // Migrate creates it on first start
	}
	if _, ok := rp["application_name"]; !ok {
		rp["application_name"] = "herald"
	}
	if _, ok := rp["statement_timeout"]; !ok {
		rp["statement_timeout"] = "30s"
	}
	if _, ok := rp["idle_in_transaction_session_timeout"]; !ok {
		rp["idle_in_transaction_session_timeout"] = "60s"
	}
	if _, ok := rp["jit"]; !ok {
		rp["jit"] = "off"
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = ConnectTimeoutDefault
	}
	cfg.ShouldPing = shouldPing
	d := &net.Dialer{KeepAliveConfig: dialKeepAlive, Control: tcpUserTimeout(10 * time.Second)}
	newHostTracker().install(cfg, d.DialContext)
	return cfg, nil
}

// shouldPing is pgxpool's rule (ping a connection idle for a second or
// more before handing it out, so that the first statement after a
// database restart does not meet a dead connection), except for an
// acquire whose context says withoutPing.
func shouldPing(ctx context.Context, p pgxpool.ShouldPingParams) bool {
	return p.IdleDuration > time.Second && ctx.Value(noPingKey{}) == nil
}

type noPingKey struct{}

// withoutPing marks ctx so that the pool hands out a connection without
// pinging it first: for a periodic statement that is idempotent and sent
// again when it fails (BeatMember), whose ping would double its cost.
func withoutPing(ctx context.Context) context.Context {
	return context.WithValue(ctx, noPingKey{}, true)
}

// dialKeepAlive has the kernel probe a connection quiet for 5 s, every 2 s,
// and give it up after 3 unanswered: a database host gone without closing
// the socket is seen within about 11 s.
var dialKeepAlive = net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: 2 * time.Second, Count: 3}

// ConnectTimeoutDefault bounds one connection attempt (per host of a
// multi-host URL) when the URL sets no connect_timeout.
const ConnectTimeoutDefault = 5 * time.Second

// PoolOptions adjust NewPoolWith.
type PoolOptions struct {
	// MaxConns is the pool size; zero keeps pgx's default, max(4, CPUs).
	MaxConns int32
	// ConnectTimeout bounds a connection attempt when the URL sets no
	// connect_timeout (which wins). Zero means ConnectTimeoutDefault.
	ConnectTimeout time.Duration
}

// SchemaDefault is the schema Herald uses when the database URL names none.
const SchemaDefault = "herald"

// NewPool opens a pool per ParsePoolConfig with at most maxConns
// connections (zero keeps pgx's default, max(4, CPUs)) and checks that the
// database answers.
func NewPool(ctx context.Context, dsn string, maxConns int32) (*pgxpool.Pool, error) {
	return NewPoolWith(ctx, dsn, PoolOptions{MaxConns: maxConns})
}

// NewPoolWith is NewPool with options.
func NewPoolWith(ctx context.Context, dsn string, o PoolOptions) (*pgxpool.Pool, error) {
	cfg, err := ParsePoolConfig(dsn)
	if err != nil {
		return nil, err
	}
	if o.MaxConns > 0 {
		cfg.MaxConns = o.MaxConns
	}
	if o.ConnectTimeout > 0 && !dsnSets(dsn, "connect_timeout") {
		cfg.ConnConfig.ConnectTimeout = o.ConnectTimeout
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("opening database pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connecting to database: %w", err)
	}
	return pool, nil
}

// dsnSets reports whether a URL or key=value DSN names the parameter key.
func dsnSets(dsn, key string) bool {
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		return u.Query().Has(key)
	}
	for _, f := range strings.Fields(dsn) {
		if k, _, ok := strings.Cut(f, "="); ok && strings.TrimSpace(k) == key {
			return true
		}
	}
	return false
}
