//go:build reliability

package reliability

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/internal/server"
	"github.com/heraldmq/herald/internal/server/servertest"
	"github.com/heraldmq/herald/queue"
)

// pgbouncerIgnored are the startup parameters Herald sends (queue.ParsePoolConfig)
// that PgBouncer 1.18 does not forward: it refuses a client that sends them
// unless they are ignored. Their values are set on the role instead (see
// docs/failover.md).
const pgbouncerIgnored = "search_path,plan_cache_mode,statement_timeout,idle_in_transaction_session_timeout,jit"

// startPgBouncer runs PgBouncer in transaction mode on a free loopback
// port in front of database db on 127.0.0.1:pgPort, with trust
// authentication for role, and returns its port.
func startPgBouncer(t *testing.T, pgPort, db, role string) int {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin = "/usr/sbin/pgbouncer"
	}
	_, err = os.Stat(bin)
	require.NoError(t, err, "pgbouncer is missing: apt-get install -y pgbouncer")
	dir := postgresDir(t)
	port := freePort(t, "tcp")
	ini := fmt.Sprintf(`[databases]
herald = host=127.0.0.1 port=%s dbname=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s/users.txt
pool_mode = transaction
default_pool_size = 4
max_client_conn = 100
ignore_startup_parameters = %s
server_reset_query =
logfile = %s/pgbouncer.out
pidfile = %s/pgbouncer.pid
`, pgPort, db, port, dir, pgbouncerIgnored, dir, dir)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644))                        // #nosec G306 -- test config
	require.NoError(t, os.WriteFile(filepath.Join(dir, "users.txt"), []byte(fmt.Sprintf("%q \"\"\n", role)), 0o644)) // #nosec G306 -- test config
	startProcess(t, dir, "pgbouncer", bin, filepath.Join(dir, "pgbouncer.ini"))
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, fmt.Sprintf("postgres://%s@127.0.0.1:%d/herald?sslmode=disable&default_query_exec_mode=exec", role, port))
		if err != nil {
			return false
		}
		_ = c.Close(ctx)
		return true
	}, 20*time.Second, 50*time.Millisecond, "pgbouncer answers; its log:\n%s", tail(dir, "pgbouncer"))
	return port
}

// bouncerRole creates a login role that owns the test's schema, with the
// settings Herald would send at connection start set on the role instead,
// as docs/failover.md says to; it is dropped when the test ends.
func bouncerRole(t *testing.T, admin, db, schema string) string {
	t.Helper()
	role := "herald_" + strings.TrimPrefix(schema, "t_")
	ident, sch := pgx.Identifier{role}.Sanitize(), pgx.Identifier{schema}.Sanitize()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	require.NoError(t, err)
	defer func() { _ = conn.Close(ctx) }()
	for _, sql := range []string{
		"CREATE ROLE " + ident + " LOGIN REPLICATION", // REPLICATION: --wake logical
		"ALTER SCHEMA " + sch + " OWNER TO " + ident,
		"GRANT CREATE ON DATABASE " + pgx.Identifier{db}.Sanitize() + " TO " + ident, // the publication of --wake logical
		"ALTER ROLE " + ident + " SET search_path = " + sch,
		"ALTER ROLE " + ident + " SET plan_cache_mode = force_generic_plan",
		"ALTER ROLE " + ident + " SET statement_timeout = '30s'",
		"ALTER ROLE " + ident + " SET idle_in_transaction_session_timeout = '60s'",
		"ALTER ROLE " + ident + " SET jit = off",
	} {
		_, err := conn.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("dropping role %s: %v", role, err)
			return
		}
		defer func() { _ = conn.Close(ctx) }()
		// Sessions PgBouncer kept may still be closing.
		_, _ = conn.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role)
		for _, sql := range []string{"DROP OWNED BY " + ident + " CASCADE", "DROP ROLE " + ident} {
			if _, err := conn.Exec(ctx, sql); err != nil {
				t.Errorf("%s: %v", sql, err)
			}
		}
	})
	return role
}

// Herald works through PgBouncer in transaction mode as docs/failover.md
// sets it up: the pool in exec mode (no server-side prepared statements)
// through the pooler, LISTEN on the direct URL, startup settings on the
// role. Pushes (plain and in transactions) reach a WebSocket, an SSE and a
// long-poll consumer group, each acking (the long-poll one partly in
// transactions), every message once and in order per partition, while
// retention runs through the pooler again and again.
//
// With --wake logical the replication connection goes to the direct URL
// too (PgBouncer cannot replicate).
func TestPgBouncer_TransactionModeDeliversEverythingOnceInOrder(t *testing.T) {
	for _, wake := range []string{"notify", "logical"} {
		t.Run(wake, func(t *testing.T) { bouncedFlow(t, wake) })
	}
}

func bouncedFlow(t *testing.T, wake string) {
	admin := pgtest.AdminURL(t)
	u, err := url.Parse(pgtest.DSN(t))
	require.NoError(t, err)
	schema, db := u.Query().Get("search_path"), strings.TrimPrefix(u.Path, "/")
	role := bouncerRole(t, admin, db, schema)
	port := startPgBouncer(t, u.Port(), db, role)
	pooled := fmt.Sprintf("postgres://%s@127.0.0.1:%d/herald?sslmode=disable&default_query_exec_mode=exec", role, port)
	direct := fmt.Sprintf("postgres://%s@127.0.0.1:%s/%s?sslmode=disable", role, u.Port(), db)

	in := servertest.Start(t, pooled, wake, func(c *server.Config) {
		c.ListenDatabaseURL = direct
		c.SweepMin, c.SweepMax = 0, 0 // the default sweep, as an operator runs it
		c.Adjust.Listener, c.Adjust.Logical = nil, nil
		c.Logger = zerolog.New(os.Stderr).Level(zerolog.WarnLevel)
	})
	base := func() string { return in.URL() }
	code, body := in.Call(http.MethodPost, "/api/v1/configure",
		`{"queue":"bounced","options":{"retentionEnabled":true,"completedRetentionSeconds":1}}`)
	require.Equal(t, http.StatusOK, code, body)

	f := newFlow("bounced", 4, "ws", "sse", "lp")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { f.wsConsume(ctx, base, "ws") })
	wg.Go(func() { f.sseConsume(ctx, base, "sse") })
	wg.Go(func() { f.longPollConsume(ctx, base, "lp", true) })
	// Every group is subscribed once it has acked message 0.
	require.True(t, f.push(ctx, base(), 0, false))
	left := f.waitDrained(20 * time.Second)
	require.Empty(t, left, "the first message reaches every consumer group")

	// Retention through the pooler, as another instance's would run,
	// over and over while the flow goes on.
	rpool, err := queue.NewPool(ctx, pooled, 2)
	require.NoError(t, err)
	defer rpool.Close()
	store, err := queue.New(queue.Config{Pool: rpool, InstanceID: "retention"})
	require.NoError(t, err)
	adminConn, err := pgx.Connect(ctx, admin)
	require.NoError(t, err)
	defer func() { _ = adminConn.Close(context.Background()) }()
	var runs, deleted int64
	leaked := map[string]bool{}
	retentionDone := make(chan error, 1)
	rctx, stopRetention := context.WithCancel(ctx)
	go func() {
		defer close(retentionDone)
		for rctx.Err() == nil {
			del, ran, err := store.RunRetention(rctx, 0)
			if err != nil && rctx.Err() == nil {
				retentionDone <- err
				return
			}
			if ran {
				runs++
			}
			for _, d := range del {
				deleted += d.N
			}
			// A retention lock held by a session outside any
			// transaction outlived its run: behind a transaction-mode
			// pooler its unlock went to another server session.
			var holders []string
			rows, err := adminConn.Query(rctx, `SELECT a.pid::text || ' ' || coalesce(a.state, '')
				FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
				WHERE l.locktype = 'advisory' AND l.granted AND a.usename = $1 AND a.state = 'idle'
				  AND a.application_name <> $2`, role, queue.InstanceLockApplication) // that one is held for the instance's life, on the direct URL
			if err == nil {
				holders, err = pgx.CollectRows(rows, pgx.RowTo[string])
			}
			if err != nil && rctx.Err() == nil {
				retentionDone <- fmt.Errorf("reading pg_locks: %w", err)
				return
			}
			for _, h := range holders {
				leaked[h] = true
			}
			sleep(rctx, 20*time.Millisecond)
		}
	}()

	const total = 600
	f.produce(ctx, base, 1, total+1, 5*time.Millisecond, true)
	left = f.waitDrained(30 * time.Second)
	stopRetention()
	require.NoError(t, <-retentionDone, "a retention run through the pooler")
	// No lock of a past run keeps this one from running.
	_, ran, err := store.RunRetention(ctx, 0)
	require.NoError(t, err)
	assert.True(t, ran, "retention runs after the others ended")
	cancel()
	wg.Wait()

	f.mu.Lock()
	assert.Len(t, f.pushed, total+1, "every push answered 201 (failures: %v)", f.failWhy)
	f.mu.Unlock()
	for _, g := range []string{"ws", "sse", "lp"} {
		assert.Empty(t, left[g], "group %s acked every message", g)
		dups, disorder := f.verdict(g)
		assert.Empty(t, dups, "group %s acked none twice", g)
		assert.Empty(t, disorder, "group %s acked in push order per partition", g)
	}
	assert.Empty(t, leaked, "sessions left holding an advisory lock outside a transaction")
	assert.Positive(t, runs, "retention ran")
	assert.Positive(t, deleted, "retention deleted completed messages")
	t.Logf("pgbouncer (wake %s): %d messages, 3 groups, %d retention runs deleted %d", wake, total+1, runs, deleted)
}
