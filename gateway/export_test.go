package gateway

import (
	"net/http"
	"time"

	"github.com/heraldmq/herald/queue"
)

// Mux is the ServeMux behind Handler (which refuses connections past the
// cap first), for the route tests.
func (s *Server) Mux() *http.ServeMux { return s.mux }

// SetSSEWriteTimeout sets the SSE write timeout until the returned restore
// (tests that do not run in parallel).
func SetSSEWriteTimeout(d time.Duration) (restore func()) {
	old := sseWriteTimeout
	sseWriteTimeout = d
	return func() { sseWriteTimeout = old }
}

// ApplyMaintenance applies a read of the maintenance switches as a
// periodic refresh would.
func (s *Server) ApplyMaintenance(st queue.SystemState) { s.maint.apply(st, "periodic") }
