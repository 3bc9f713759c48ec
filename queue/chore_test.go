package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/queue/queuetest"
)

// A chore runs once per interval whatever the instances: one that is not
// due is skipped on another instance as on the one that ran it.
func TestChore_RunsOncePerIntervalWhateverTheInstances(t *testing.T) {
	ctx := ctxT(t)
	dsn := pgtest.DSN(t)
	a, b := queuetest.NewStoreDSN(t, dsn), queuetest.NewStoreDSN(t, dsn)
	runs := 0
	fn := func(context.Context) { runs++ }
	ran, err := a.Chore(ctx, "c", time.Minute, fn)
	require.NoError(t, err)
	assert.True(t, ran, "due: it never ran")
	for _, s := range []struct {
		name string
		run  func() (bool, error)
	}{
		{"the other instance", func() (bool, error) { return b.Chore(ctx, "c", time.Minute, fn) }},
		{"the same instance", func() (bool, error) { return a.Chore(ctx, "c", time.Minute, fn) }},
	} {
		ran, err := s.run()
		require.NoError(t, err, s.name)
		assert.False(t, ran, "%s: it ran less than a minute ago", s.name)
	}
	assert.Equal(t, 1, runs)
}

// An instance to which a chore is not due asks one statement, outside any
// transaction, and takes no lock: an idle mesh's instances look every
// interval, and one of them runs it.
func TestChore_NotDueCostsOneStatement(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	ran, err := s.Chore(ctx, "c", time.Minute, func(context.Context) {})
	require.NoError(t, err)
	require.True(t, ran)
	stats := s.QueryStats()
	before := stats.Snapshot()
	ran, err = s.Chore(ctx, "c", time.Minute, func(context.Context) { t.Error("ran again") })
	require.NoError(t, err)
	assert.False(t, ran)
	assert.Equal(t, map[string]uint64{"chore_due": 1}, opsSince(stats, before))
}

// Retention is a chore of the instances together: its loop's round runs
// it on one instance once per interval, not on each; a run by hand
// (RunRetention) is always due, and counts as the interval's.
func TestRetention_RoundRunsOncePerIntervalWhateverTheInstances(t *testing.T) {
	ctx := ctxT(t)
	dsn := pgtest.DSN(t)
	a, b := queuetest.NewStoreDSN(t, dsn), queuetest.NewStoreDSN(t, dsn)
	_, ran, err := a.RetentionRound(ctx, time.Minute)
	require.NoError(t, err)
	assert.True(t, ran, "due: it never ran")
	_, ran, err = b.RetentionRound(ctx, time.Minute)
	require.NoError(t, err)
	assert.False(t, ran, "the other instance ran it less than a minute ago")

	exec(t, a, `UPDATE chores SET ran_at = now() - interval '2 minutes' WHERE name = 'retention'`)
	_, ran, err = b.RetentionRound(ctx, time.Minute)
	require.NoError(t, err)
	assert.True(t, ran, "due again a minute on")

	_, ran, err = a.RunRetention(ctx, 0)
	require.NoError(t, err)
	assert.True(t, ran, "by hand: always due")
	_, ran, err = b.RetentionRound(ctx, time.Minute)
	require.NoError(t, err)
	assert.False(t, ran, "the run by hand was this interval's")
}

// A chore's lock is the one earlier versions take (the advisory lock of
// hashtext('herald_chore:' || name || ':' || schema)), so that instances
// of both versions in one mesh never run a chore at once.
func TestChore_IsSkippedWhileAnEarlierVersionRunsIt(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	conn, err := s.Pool().Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	const key = `hashtext('herald_chore:' || 'c' || ':' || current_schema())`
	var got bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+key+`)`).Scan(&got))
	require.True(t, got)
	ran, err := s.Chore(ctx, "c", time.Minute, func(context.Context) { t.Error("ran while the lock was held") })
	require.NoError(t, err)
	assert.False(t, ran, "another instance holds the lock")
	_, err = conn.Exec(ctx, `SELECT pg_advisory_unlock(`+key+`)`)
	require.NoError(t, err)
	ran, err = s.Chore(ctx, "c", time.Minute, func(context.Context) {})
	require.NoError(t, err)
	assert.True(t, ran)
}

// A last run recorded ahead of the database's clock (the clock stepped
// back since) does not hold a chore off until the clock catches up: it is
// due, as it would be once an interval had passed.
func TestChore_ALastRunAheadOfTheClockDoesNotHoldItOff(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	ran, err := s.Chore(ctx, "c", time.Minute, func(context.Context) {})
	require.NoError(t, err)
	require.True(t, ran)
	exec(t, s, `UPDATE chores SET ran_at = now() + interval '1 hour' WHERE name = 'c'`)
	ran, err = s.Chore(ctx, "c", time.Minute, func(context.Context) {})
	require.NoError(t, err)
	assert.True(t, ran, "due: the clock went back")
	ran, err = s.Chore(ctx, "c", time.Minute, func(context.Context) { t.Error("ran again") })
	require.NoError(t, err)
	assert.False(t, ran, "that run is recorded at the clock's time")
}
