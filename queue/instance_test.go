package queue_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/queue/queuetest"
)

// The leases clients pop are owned by "<instance id>#pop": an instance id
// ending so would give back, at its start, the leases another instance's
// clients hold. It is refused, naming the field.
func TestConfig_InstanceIDEndingInThePopOwnerIsRefused(t *testing.T) {
	err := queue.Config{Pool: &pgxpool.Pool{}, InstanceID: "a#pop"}.Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Config.InstanceID")
	assert.NoError(t, queue.Config{Pool: &pgxpool.Pool{}, InstanceID: "a#popper"}.Validate())
}

// The instance id's lock lives on a connection of its own: when that
// connection is lost (here its backend is terminated, as a restart of
// PostgreSQL would), the lock is taken again within seconds, on a new
// backend, and a second instance with the same id is refused again.
func TestInstanceLock_IsTakenAgainWhenItsConnectionIsLost(t *testing.T) {
	s := newStore(t)
	l, err := s.LockInstance(ctxT(t), "")
	require.NoError(t, err)
	defer func() { assert.NoError(t, l.Close(context.Background())) }()
	require.True(t, l.Held())
	first := l.BackendPID()
	require.NotZero(t, first)

	exec(t, s, "SELECT pg_terminate_backend($1)", int32(first))
	require.Eventually(t, func() bool { return l.BackendPID() != first && l.Held() }, 15*time.Second, 50*time.Millisecond,
		"the lock is taken again on a new backend within 15 s")
	var locks int
	require.NoError(t, s.Pool().QueryRow(ctxT(t),
		"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = $1", int32(l.BackendPID())).Scan(&locks))
	assert.Equal(t, 1, locks, "the new backend holds the advisory lock")
	twin, err := s.LockInstance(ctxT(t), "")
	if twin != nil {
		_ = twin.Close(context.Background())
	}
	assert.True(t, errors.Is(err, queue.ErrInstanceInUse), "a twin is refused again: %v", err)
}

// A held lock costs nothing while it is idle: its connection is not
// pinged on a timer (each wake-up of an idle process, and of its backend,
// costs more CPU than the ping; a mesh of a hundred idle instances paid it
// a hundred times a second). Its loss is seen when its socket reports it,
// as the test above shows. The backend's state_change moves with any
// statement it runs.
func TestInstanceLock_HeldIdleSendsTheDatabaseNothing(t *testing.T) {
	s := newStore(t)
	l, err := s.LockInstance(ctxT(t), "")
	require.NoError(t, err)
	defer func() { assert.NoError(t, l.Close(context.Background())) }()
	stateChange := func() (at time.Time) {
		t.Helper()
		require.NoError(t, s.Pool().QueryRow(ctxT(t),
			"SELECT state_change FROM pg_stat_activity WHERE pid = $1", int32(l.BackendPID())).Scan(&at))
		return at
	}
	before := stateChange()
	// Read on the test's goroutine (not assert.Never's: its last read may
	// still run, on a context the test's end cancels, once it returned).
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for end := time.After(3 * queue.InstanceLockRetry); ; {
		select {
		case <-tick.C:
			require.True(t, before.Equal(stateChange()), "the lock's backend ran a statement while the lock was held idle")
			continue
		case <-end:
		}
		break
	}
	assert.True(t, l.Held())
}

// With nothing sent on the lock's connection, a database host that died
// without closing the socket is seen by the kernel's keepalive probes: the
// socket is probed after 5 s of quiet, every 2 s, and given up after 3
// unanswered (about 11 s; the server gives up on its side after 25 s, so
// the instance knows its lock is gone before a twin could take the id).
func TestInstanceLock_ItsSocketIsProbedSoADeadHostIsSeenWithinSeconds(t *testing.T) {
	for _, tc := range []struct {
		name   string
		direct bool
	}{
		{"a connection of the pool's", false},
		{"a direct connection (the pool goes through a pooler)", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsn := pgtest.DSN(t) // a schema of its own: the lock's key
			s, url := queuetest.NewStoreDSN(t, dsn), ""
			if tc.direct {
				url = dsn
			}
			l, err := s.LockInstance(ctxT(t), url)
			require.NoError(t, err)
			defer func() { assert.NoError(t, l.Close(context.Background())) }()
			on, idle, interval, count, err := l.LockSocketKeepAlive()
			require.NoError(t, err)
			assert.True(t, on, "SO_KEEPALIVE")
			assert.Equal(t, []int{5, 2, 3}, []int{idle, interval, count}, "idle s, interval s, probes")
		})
	}
}

// The lock, lost with its connection, is taken again: on the same
// database (its backend terminated) nothing more happens; on a database
// whose postmaster started at another time (here made to look so: a
// promoted standby, a restarted server) OnDatabaseChanged's func is called,
// once.
func TestInstanceLock_TellsWhenTakenAgainOnAnotherDatabase(t *testing.T) {
	s := newStore(t)
	l, err := s.LockInstance(ctxT(t), "")
	require.NoError(t, err)
	defer func() { assert.NoError(t, l.Close(context.Background())) }()
	var changed atomic.Int32
	l.OnDatabaseChanged(func() { changed.Add(1) })
	retake := func() {
		t.Helper()
		first := l.BackendPID()
		exec(t, s, "SELECT pg_terminate_backend($1)", int32(first))
		require.Eventually(t, func() bool { return l.BackendPID() != first && l.Held() }, 15*time.Second,
			50*time.Millisecond, "the lock was not taken again within 15 s")
	}
	retake()
	assert.Zero(t, changed.Load(), "taken again on the same database")
	l.SetDatabaseStarted("2000-01-01 00:00:00+00")
	retake()
	assert.Eventually(t, func() bool { return changed.Load() > 0 }, 5*time.Second, 10*time.Millisecond, "told")
	assert.Equal(t, int32(1), changed.Load(), "taken again on another database")
}
