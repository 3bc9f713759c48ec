package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/heraldmq/herald/internal/pgcluster"
)

// envURL names the environment variable that points tests at an existing
// database instead of a throwaway cluster.
const envURL = "TEST_DATABASE_URL"

var (
	running atomic.Bool // set by Run; DSN refuses to start a cluster nobody would stop

	once     sync.Once
	adminURL string
	startErr error

	mu      sync.Mutex // guards cluster and tmpDir, which Run reads after the tests
	cluster *pgcluster.Cluster
	tmpDir  string
)

// Run runs the tests and then stops the cluster (if one was started) and
// removes its directory. Call it from TestMain: os.Exit(pgtest.Run(m)).
func Run(m *testing.M) int {
	running.Store(true)
	code := m.Run()

	mu.Lock()
	c, dir := cluster, tmpDir
	mu.Unlock()
	var err error
	if c != nil {
		err = c.Stop()
	}
	if dir != "" {
		err = errors.Join(err, os.RemoveAll(dir))
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: cleaning up: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// AdminURL returns the URL of the test database itself, without a per-test
// search_path, starting the cluster on first use.
func AdminURL(t testing.TB) string {
	t.Helper()
	if !running.Load() {
		t.Fatalf("pgtest: call os.Exit(pgtest.Run(m)) from TestMain, so that the test cluster is stopped")
	}
	once.Do(func() { adminURL, startErr = start() })
	if startErr != nil {
		// Never skip: a missing database must fail loudly, or database
		// tests silently stop running.
		t.Fatalf("pgtest: no test database: %v", startErr)
	}
	return adminURL
}

// settings tune the throwaway cluster for speed over durability.
var settings = map[string]string{
	"fsync":              "off",
	"synchronous_commit": "off",
	"full_page_writes":   "off",
	"wal_level":          "logical",
	"max_connections":    "200",
	// With synchronous_commit off, WAL reaches disk (and so a logical
	// replication stream) only when the WAL writer wakes: every 10 ms rather
	// than the default 200 ms, or logical wake-ups would wait for it.
	"wal_writer_delay": "10ms",
}

// Restart stops the test cluster, runs down while it is stopped, and starts
// it again on the same port, so clients can reconnect to the same URL.
// Every connection breaks: tests that restart must not run in parallel with
// others of their binary. It fails the test under TEST_DATABASE_URL, whose
// server pgtest does not own.
func Restart(t testing.TB, down func()) {
	t.Helper()
	AdminURL(t)
	mu.Lock()
	defer mu.Unlock()
	if cluster == nil {
		t.Fatalf("pgtest: Restart needs the throwaway cluster, not %s", envURL)
	}
	u, err := url.Parse(cluster.URL())
	if err != nil {
		t.Fatalf("pgtest: parsing cluster URL: %v", err)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatalf("pgtest: cluster URL has no port: %v", err)
	}
	if err := cluster.Stop(); err != nil {
		t.Fatalf("pgtest: stopping the cluster: %v", err)
	}
	if down != nil {
		down()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Config{Dir: tmpDir, Port: port, Settings: settings})
	if err != nil {
		t.Fatalf("pgtest: restarting the cluster: %v", err)
	}
	cluster = c
}

// start returns TEST_DATABASE_URL or starts a cluster tuned for speed over
// durability in a fresh temp dir.
func start() (string, error) {
	if u := os.Getenv(envURL); u != "" {
		return u, nil
	}
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return "", fmt.Errorf("creating cluster directory: %w", err)
	}
	mu.Lock()
	tmpDir = dir
	mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Config{Dir: dir, Settings: settings})
	if err != nil {
		return "", fmt.Errorf("starting throwaway PostgreSQL (or set %s): %w", envURL, err)
	}
	mu.Lock()
	cluster = c
	mu.Unlock()
	return c.URL(), nil
}

// DSN creates a schema for this test, drops it (CASCADE) when the test ends,
// and returns a connection string whose search_path is that schema, so tests
// can share one database without seeing each other's tables.
func DSN(t testing.TB) string {
	t.Helper()
	admin := AdminURL(t)
	b := make([]byte, 8)
	_, _ = rand.Read(b) // never fails
	schema := "t_" + hex.EncodeToString(b)
	ident := pgx.Identifier{schema}.Sanitize()

	if err := execAdmin(admin, "CREATE SCHEMA "+ident); err != nil {
		t.Fatalf("pgtest: creating schema: %v", err)
	}
	t.Cleanup(func() {
		if err := execAdmin(admin, "DROP SCHEMA IF EXISTS "+ident+" CASCADE"); err != nil {
			t.Errorf("pgtest: dropping schema %s: %v", schema, err)
		}
	})
	return withSearchPath(admin, schema)
}

// Pool returns a pool on DSN(t), closed when the test ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), DSN(t))
	if err != nil {
		t.Fatalf("pgtest: creating pool: %v", err)
	}
	// Registered after DSN's cleanup, so it runs first: the schema is
	// dropped only once no pooled connection uses it.
	t.Cleanup(pool.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("pgtest: connecting pool: %v", err)
	}
	return pool
}

// execAdmin runs one statement on a short-lived connection. It uses its own
// context because cleanups run after the test's context is cancelled.
func execAdmin(dsn, sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }() // the statement has run or failed already
	_, err = conn.Exec(ctx, sql)
	return err
}

// withSearchPath adds search_path to a URL or keyword/value DSN; pgx sends
// unknown parameters to the server as runtime settings.
func withSearchPath(dsn, schema string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		if u, err := url.Parse(dsn); err == nil {
			q := u.Query()
			q.Set("search_path", schema)
			u.RawQuery = q.Encode()
			return u.String()
		}
	}
	return dsn + " search_path=" + schema
}

// Main is the whole TestMain of a package that uses the test database: it
// runs the tests with Run, then fails the binary if goroutines leaked
// (goleak), and exits. pgxpool's health-check goroutine ends a moment after
// Close, so it is ignored.
func Main(m *testing.M, opts ...goleak.Option) {
	code := Run(m)
	if code == 0 {
		opts = append(opts, goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
