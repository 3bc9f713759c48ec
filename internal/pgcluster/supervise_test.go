package pgcluster_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgcluster"
)

// fastSupervision restarts quickly so that the tests take seconds.
var fastSupervision = pgcluster.SuperviseConfig{Interval: 20 * time.Millisecond,
	BackoffMin: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond, MaxFailures: 3}

// supervise runs c.Supervise until the test ends and returns its result.
func supervise(t *testing.T, c *pgcluster.Cluster, cfg pgcluster.SuperviseConfig) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		done <- c.Supervise(ctx, cfg)
	}()
	t.Cleanup(func() {
		cancel()
		<-returned // or goleak complains; it returns at once when ctx ends
	})
	return done
}

// A postmaster killed with SIGKILL (which leaves a stale
// postmaster.pid) is restarted on the same port, so the URL works again
// and nothing committed is lost; Health says what happened, OnRestart is
// told, and Stop ends supervision without a restart.
func TestSupervise_RestartsAKilledPostmaster(t *testing.T) {
	t.Parallel()
	cfg := newConfig(t)
	c, err := pgcluster.Start(startCtx(t), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })
	exec(t, c.URL(), "CREATE TABLE kept (id int); INSERT INTO kept VALUES (1)")

	restarted := make(chan struct{}, 1)
	sc := fastSupervision
	sc.OnRestart = func() { restarted <- struct{}{} }
	done := supervise(t, c, sc)
	assert.Equal(t, pgcluster.Health{}, c.Health(), "nothing happened yet")

	pm := postmasterPID(t, cfg)
	require.NoError(t, syscall.Kill(pm, syscall.SIGKILL))
	killed := time.Now()
	select {
	case <-restarted:
	case err := <-done:
		t.Fatalf("Supervise returned %v instead of restarting", err)
	case <-time.After(10 * time.Second):
		t.Fatalf("not restarted within 10 s; health %+v", c.Health())
	}
	t.Logf("restarted %v after the kill", time.Since(killed))
	assert.Equal(t, pgcluster.Health{Restarts: 1}, c.Health())
	assert.NotEqual(t, pm, postmasterPID(t, cfg))
	assert.True(t, c.Owned(), "this process started the new postmaster")
	assert.Equal(t, 1, count(t, c.URL(), "kept"), "same URL, same data")

	require.NoError(t, c.Stop())
	select {
	case err := <-done:
		require.NoError(t, err, "Stop ends supervision")
	case <-time.After(10 * time.Second):
		t.Fatal("Supervise did not return after Stop")
	}
	assert.Equal(t, 1, c.Health().Restarts, "what Stop stopped stays stopped")
	_, err = os.Stat(filepath.Join(cfg.Dir, "pgdata", "postmaster.pid"))
	assert.ErrorIs(t, err, os.ErrNotExist, "postgres is down")
}

// When the postmaster cannot be started again (here the cluster's
// files are from an incompatible version), Supervise tries MaxFailures
// times with back-off and then returns an error that says why, so that
// herald exits and its own supervisor acts.
func TestSupervise_GivesUpWhenThePostmasterCannotStart(t *testing.T) {
	t.Parallel()
	cfg := newConfig(t)
	cfg.Settings = map[string]string{"fsync": "off"}
	c, err := pgcluster.Start(startCtx(t), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })
	done := supervise(t, c, fastSupervision)

	require.NoError(t, os.WriteFile(filepath.Join(cfg.Dir, "pgdata", "PG_VERSION"), []byte("1\n"), 0o600))
	require.NoError(t, syscall.Kill(postmasterPID(t, cfg), syscall.SIGKILL))
	killed := time.Now()
	select {
	case err := <-done:
		require.Error(t, err)
		assert.Contains(t, err.Error(), "giving up after 3 failed attempts in a row")
		assert.Contains(t, err.Error(), "database files are incompatible with server", "the server log says why")
	case <-time.After(30 * time.Second):
		t.Fatalf("Supervise did not give up; health %+v", c.Health())
	}
	// The waits were 50, 100 and 200 ms.
	assert.Greater(t, time.Since(killed), 350*time.Millisecond, "backed off between attempts")
	h := c.Health()
	assert.True(t, h.Restarting, "still down")
	assert.Equal(t, 0, h.Restarts)
	assert.Equal(t, 3, h.Failures)
	assert.Contains(t, h.LastError, "incompatible")
}

func TestSuperviseConfig_WithDefaults(t *testing.T) {
	d := pgcluster.SuperviseConfig{}.WithDefaults()
	assert.Equal(t, pgcluster.SuperviseConfig{Interval: 100 * time.Millisecond, BackoffMin: 200 * time.Millisecond,
		BackoffMax: 5 * time.Second, MaxFailures: 5, AttemptTimeout: time.Minute}, d)
	assert.Equal(t, time.Second, pgcluster.SuperviseConfig{BackoffMin: time.Second, BackoffMax: time.Millisecond}.WithDefaults().BackoffMax,
		"the cap is never below the first wait")
}

// Two handles on one Dir (two herald processes sharing a data dir)
// both supervise; after a kill exactly one postmaster comes back, on the
// same port, and both count the restart.
func TestSupervise_SharedDirRestartsOnePostmaster(t *testing.T) {
	t.Parallel()
	cfg := newConfig(t)
	cfg.Settings = map[string]string{"fsync": "off"}
	first, err := pgcluster.Start(startCtx(t), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = first.Stop() })
	second, err := pgcluster.Start(startCtx(t), cfg)
	require.NoError(t, err)
	require.False(t, second.Owned())
	restarted := make(chan string, 2)
	for name, c := range map[string]*pgcluster.Cluster{"first": first, "second": second} {
		sc := fastSupervision
		sc.OnRestart = func() { restarted <- name }
		supervise(t, c, sc)
	}
	require.NoError(t, syscall.Kill(postmasterPID(t, cfg), syscall.SIGKILL))
	for range 2 {
		select {
		case <-restarted:
		case <-time.After(10 * time.Second):
			t.Fatalf("not both back within 10 s: %+v, %+v", first.Health(), second.Health())
		}
	}
	assert.Equal(t, 1, first.Health().Restarts)
	assert.Equal(t, 1, second.Health().Restarts)
	exec(t, first.URL(), "SELECT 1")
	exec(t, second.URL(), "SELECT 1")
	assert.Equal(t, first.URL(), second.URL())
	// postgres's own lock (postmaster.pid) keeps a second postmaster off the
	// directory; what the two handles did is told by who owns the new one.
	assert.True(t, first.Owned(), "first started the original")
	t.Logf("restarted by the second handle too: %v", second.Owned())
}
