package queue_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// The done-prefix step locked every row with a non-empty
// done and no live lease, and waited for each: one row an ack held stalled
// the step even when it had nothing to move there (its done offsets do not
// follow its cursor). It now locks only rows whose cursor's next offset is
// done; the row held here has none and is not waited for.
func TestRetention_DonePrefixWaitsOnlyForRowsItMoves(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	keys := groupKeys(t, s, "q", 3, "a")
	exec(t, s, `UPDATE consumers SET done = '{2}'`) // offset 1 pending: nothing to move
	exec(t, s, `UPDATE consumers c SET done = '{1,2}' WHERE `+keys[2])
	hold, err := s.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = hold.Rollback(context.Background()) }()
	_, err = hold.Exec(ctx, `SELECT 1 FROM consumers c WHERE `+keys[0]+` FOR UPDATE`) // an ack's
	require.NoError(t, err)

	conn, err := s.Pool().Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	// The step must not wait at all: a lock timeout turns a wait into an
	// error instead of a hang.
	_, err = conn.Exec(ctx, `SET lock_timeout = '2s'`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, queue.DonePrefixSQL)
	_, rerr := conn.Exec(context.Background(), `RESET lock_timeout`)
	require.NoError(t, rerr)
	require.NoError(t, err, "the done-prefix step waited for a row it has nothing to move on")
	var cursor int64
	var done []int64
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT cursor, done FROM consumers c WHERE `+keys[2]).Scan(&cursor, &done))
	require.EqualValues(t, 2, cursor, "the row with a done prefix moved")
	require.Empty(t, done)
}
