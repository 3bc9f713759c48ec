package gateway_test

import (
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/gateway"
)

// While the supervised private PostgreSQL is being restarted,
// /health says so (503, "restarting", the count) without waiting on a ping;
// once it serves again /health is 200 and still counts the restart.
func TestHealth_ReportsDatabaseRestart(t *testing.T) {
	t.Parallel()
	var restarting atomic.Bool
	var restarts atomic.Int64
	e := newEnv(t, func(c *gateway.Config) {
		c.Version = "1.2.3-test"
		c.Database = func() (bool, int) { return restarting.Load(), int(restarts.Load()) }
	})
	r := e.get("/health")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.JSONEq(t, `{"database":"connected","server":"Herald","status":"healthy","version":"1.2.3-test","restarts":0,"connections":1,"maxConnections":0}`, string(r.body))

	restarting.Store(true)
	r = e.get("/health")
	require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r)
	assert.JSONEq(t, `{"database":"restarting","status":"unhealthy","version":"1.2.3-test","restarts":0,"connections":1,"maxConnections":0}`, string(r.body))

	restarting.Store(false)
	restarts.Store(1)
	r = e.get("/health")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.JSONEq(t, `{"database":"connected","server":"Herald","status":"healthy","version":"1.2.3-test","restarts":1,"connections":1,"maxConnections":0}`, string(r.body))
}
