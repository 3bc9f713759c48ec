package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// The maintenance switches: off until set, one row per key, the writer
// recorded, and a NOTIFY on the schema's channel with each change.
func TestStore_SystemFlags(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	st, err := s.SystemState(ctxT(t))
	require.NoError(t, err)
	assert.Equal(t, queue.SystemState{}, st, "off, never set")

	// Listen as an instance would, on a connection of the store's schema.
	conn, err := s.Pool().Acquire(ctxT(t))
	require.NoError(t, err)
	defer conn.Release()
	var schema string
	require.NoError(t, conn.QueryRow(ctxT(t), `SELECT current_schema()`).Scan(&schema))
	_, err = conn.Exec(ctxT(t), "LISTEN "+pgx.Identifier{"herald." + schema}.Sanitize())
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(context.Background(), "UNLISTEN *") }()

	before := time.Now()
	st, err = s.SetSystemFlag(ctxT(t), queue.StateMaintenance, true)
	require.NoError(t, err)
	assert.True(t, st.Maintenance)
	assert.False(t, st.PopMaintenance)
	assert.Equal(t, "test", st.UpdatedBy)
	assert.WithinDuration(t, before, st.UpdatedAt, time.Minute)
	wctx, cancel := context.WithTimeout(ctxT(t), 5*time.Second)
	defer cancel()
	n, err := conn.Conn().WaitForNotification(wctx)
	require.NoError(t, err)
	assert.Equal(t, queue.StateNotifyPayload, n.Payload)

	st, err = s.SetSystemFlag(ctxT(t), queue.StatePopMaintenance, true)
	require.NoError(t, err)
	assert.True(t, st.Maintenance && st.PopMaintenance)
	st, err = s.SetSystemFlag(ctxT(t), queue.StateMaintenance, false)
	require.NoError(t, err)
	assert.False(t, st.Maintenance)
	assert.True(t, st.PopMaintenance)
	again, err := s.SystemState(ctxT(t))
	require.NoError(t, err)
	assert.Equal(t, st, again)

	_, err = s.SetSystemFlag(ctxT(t), "something_else", true)
	assert.True(t, queue.IsInputError(err))
}
