package pgcluster_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/heraldmq/herald/internal/pgcluster"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newConfig returns a Config for a fresh directory. It does not use
// t.TempDir: that directory's parent is root-only, which Start rightly
// rejects when it has to run postgres as another user.
func newConfig(t *testing.T) pgcluster.Config {
	t.Helper()
	dir, err := os.MkdirTemp("", "pgcluster-test-")
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, os.RemoveAll(dir)) })
	return pgcluster.Config{Dir: dir, Logger: zerolog.New(zerolog.NewTestWriter(t))}
}

// startCtx bounds Start in tests; the cluster itself outlives it.
func startCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func exec(t *testing.T, url, sql string) {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.Background()) }()
	_, err = conn.Exec(t.Context(), sql)
	require.NoError(t, err)
}

func count(t *testing.T, url, table string) int {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.Background()) }()
	var n int
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT count(*) FROM "+table).Scan(&n))
	return n
}

func postmasterPID(t *testing.T, cfg pgcluster.Config) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(cfg.Dir, "pgdata", "postmaster.pid"))
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	require.NoError(t, err)
	return pid
}

func TestBinDir(t *testing.T) {
	dir, err := pgcluster.BinDir()
	require.NoError(t, err)
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		assert.FileExists(t, filepath.Join(dir, name))
	}
}

func TestStartRequiresDir(t *testing.T) {
	_, err := pgcluster.Start(t.Context(), pgcluster.Config{})
	require.ErrorContains(t, err, "Dir is required")
}

func TestStartStopRestart(t *testing.T) {
	t.Parallel()
	cfg := newConfig(t)
	ctx := startCtx(t)

	c, err := pgcluster.Start(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, c.Stop()) })
	assert.True(t, c.Owned())
	assert.Contains(t, c.URL(), "/herald?sslmode=disable")
	exec(t, c.URL(), "SELECT 1")
	exec(t, c.URL(), "CREATE TABLE kept (id int); INSERT INTO kept VALUES (1)")
	pgVersion, err := os.Stat(filepath.Join(cfg.Dir, "pgdata", "PG_VERSION"))
	require.NoError(t, err)

	t.Run("second start reuses the running postmaster", func(t *testing.T) {
		c2, err := pgcluster.Start(ctx, cfg)
		require.NoError(t, err)
		assert.False(t, c2.Owned())
		assert.Equal(t, c.URL(), c2.URL())
		exec(t, c2.URL(), "SELECT 1")
		require.NoError(t, c2.Stop()) // not owned: must leave the server up
		exec(t, c.URL(), "SELECT 1")
	})

	require.NoError(t, c.Stop())
	require.NoError(t, c.Stop(), "second Stop")
	conn, err := pgx.Connect(t.Context(), c.URL())
	if err == nil {
		_ = conn.Close(context.Background())
	}
	require.Error(t, err, "server still accepts connections after Stop")

	t.Run("failed start reports the server log", func(t *testing.T) {
		bad := cfg
		bad.Settings = map[string]string{"shared_buffers": "plenty"}
		_, err := pgcluster.Start(ctx, bad)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "starting postgres")
		assert.Contains(t, err.Error(), `invalid value for parameter "shared_buffers"`)
	})

	c3, err := pgcluster.Start(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, c3.Stop()) })
	assert.True(t, c3.Owned())
	assert.Equal(t, 1, count(t, c3.URL(), "kept"), "data lost across restart")
	after, err := os.Stat(filepath.Join(cfg.Dir, "pgdata", "PG_VERSION"))
	require.NoError(t, err)
	assert.Equal(t, pgVersion.ModTime(), after.ModTime(), "initdb ran again")
}

func TestStalePostmasterPID(t *testing.T) {
	t.Parallel()
	cfg := newConfig(t)
	// A directory too deep for a Unix socket path: the cluster must fall
	// back to TCP only.
	require.NoError(t, os.Chmod(cfg.Dir, 0o755)) // postgres must reach the nested Dir
	cfg.Dir = filepath.Join(cfg.Dir, strings.Repeat("d", 100))
	cfg.Settings = map[string]string{"fsync": "off"}
	ctx := startCtx(t)

	c, err := pgcluster.Start(ctx, cfg)
	require.NoError(t, err)
	exec(t, c.URL(), "CREATE TABLE survivor (id int); INSERT INTO survivor VALUES (1)")

	t.Run("postmaster killed", func(t *testing.T) {
		// Freeze a backend so that it outlives its postmaster, as children
		// briefly do after a crash: Start must wait for it, not start a
		// second set of processes on the same files.
		conn, err := pgx.Connect(t.Context(), c.URL())
		require.NoError(t, err)
		backend := int(conn.PgConn().PID())
		require.NoError(t, syscall.Kill(backend, syscall.SIGSTOP))
		t.Cleanup(func() { _ = syscall.Kill(backend, syscall.SIGCONT) }) // never leave it frozen
		// SIGKILL gives postgres no chance to remove postmaster.pid.
		require.NoError(t, syscall.Kill(postmasterPID(t, cfg), syscall.SIGKILL))

		short, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err = pgcluster.Start(short, cfg)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Contains(t, err.Error(), "of a dead postmaster still work in")

		require.NoError(t, syscall.Kill(backend, syscall.SIGCONT)) // it notices the dead postmaster and exits
		_ = conn.Close(context.Background())
		c2, err := pgcluster.Start(ctx, cfg)
		require.NoError(t, err)
		assert.True(t, c2.Owned())
		assert.Equal(t, 1, count(t, c2.URL(), "survivor"))
		require.NoError(t, c2.Stop())
	})

	t.Run("PID recycled by another process", func(t *testing.T) {
		pidFile := filepath.Join(cfg.Dir, "pgdata", "postmaster.pid")
		fake := fmt.Sprintf("%d\n%s\n0\n5432\n\n\n\n", os.Getpid(), filepath.Dir(pidFile))
		require.NoError(t, os.WriteFile(pidFile, []byte(fake), 0o600))
		c3, err := pgcluster.Start(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, c3.Stop()) })
		assert.True(t, c3.Owned())
		assert.Equal(t, 1, count(t, c3.URL(), "survivor"))
	})
}

func TestConcurrentFirstStart(t *testing.T) {
	t.Parallel()
	cfg := newConfig(t)
	ctx := startCtx(t)

	type result struct {
		c   *pgcluster.Cluster
		err error
	}
	results := make(chan result, 2) // buffered: a failed require must not strand a sender
	for range 2 {
		go func() {
			c, err := pgcluster.Start(ctx, cfg)
			results <- result{c, err}
		}()
	}
	var owned int
	for range 2 {
		r := <-results
		require.NoError(t, r.err)
		t.Cleanup(func() { assert.NoError(t, r.c.Stop()) })
		exec(t, r.c.URL(), "SELECT 1")
		if r.c.Owned() {
			owned++
		}
	}
	assert.Equal(t, 1, owned, "exactly one Start must own the postmaster")
}
