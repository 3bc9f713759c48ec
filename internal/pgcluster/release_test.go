package pgcluster_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgcluster"
)

// The last user to release a shared cluster stops it, even when it did not
// start it: two servers on one private cluster, the starter leaves first.
func TestRelease_LastUserStops(t *testing.T) {
	cfg := newConfig(t)
	first, err := pgcluster.Start(startCtx(t), cfg)
	require.NoError(t, err)
	second, err := pgcluster.Start(startCtx(t), cfg)
	require.NoError(t, err)
	require.True(t, first.Owned())
	require.False(t, second.Owned())

	stopped, err := first.Release(startCtx(t))
	require.NoError(t, err)
	assert.False(t, stopped, "the second user still needs it")
	exec(t, second.URL(), "SELECT 1")

	stopped, err = second.Release(startCtx(t))
	require.NoError(t, err)
	assert.True(t, stopped)
	_, err = pgx.Connect(t.Context(), second.URL())
	assert.Error(t, err, "postgres is down")

	stopped, err = second.Release(startCtx(t))
	require.NoError(t, err)
	assert.False(t, stopped, "a second Release does nothing")
}
