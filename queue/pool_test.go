package queue_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// A claim over a queue of 100,000 partitions is planned at a cost above
// jit_above_cost, and PostgreSQL compiled it on every call (125 ms of a
// 150 ms pop): Herald's connections run without JIT unless the DSN asks.
func TestPool_ConnectionsRunWithoutJIT(t *testing.T) {
	s := newStore(t)
	var jit string
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT current_setting('jit')`).Scan(&jit))
	assert.Equal(t, "off", jit)
	cfg, err := queue.ParsePoolConfig("postgres://u@localhost/db?jit=on")
	require.NoError(t, err)
	assert.Equal(t, "on", cfg.ConnConfig.RuntimeParams["jit"], "the DSN wins")
}
