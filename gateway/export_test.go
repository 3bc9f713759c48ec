package gateway

import (
	"net/http"
	"sync"
	"testing"
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

// LatestStreamDeadline records, until the test ends, the write deadlines
// the taken-over SSE streams' connections get (tests that do not run in
// parallel); latest is the furthest.
func LatestStreamDeadline(t testing.TB) (latest func() time.Time) {
	var mu sync.Mutex
	var last time.Time
	f := func(dl time.Time) {
		mu.Lock()
		defer mu.Unlock()
		if dl.After(last) {
			last = dl
		}
	}
	streamDeadlineHook.Store(&f)
	t.Cleanup(func() { streamDeadlineHook.Store(nil) })
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return last
	}
}

// OnHubSweep calls f, until the test ends, after each read of a follow hub
// that ends its reading, with the wait armed before its next read (the
// sweep, when idle). f runs with the hub's mutex held: it must not block
// or call the server.
func OnHubSweep(t testing.TB, f func(queue string, next time.Duration)) {
	hubSweepHook.Store(&f)
	t.Cleanup(func() { hubSweepHook.Store(nil) })
}

// FollowSweepMax is the longest wait of an idle hub's sweep.
const FollowSweepMax = followSweepMax

// OnLeaseCheckRead calls f, until the test ends, in a session's lease
// check after each read of the leases and before it judges the
// deliveries by it.
func OnLeaseCheckRead(t testing.TB, f func()) {
	leaseCheckRead.Store(&f)
	t.Cleanup(func() { leaseCheckRead.Store(nil) })
}

// OnLeaseCheckDone calls f, until the test ends, after each lease check
// of a session.
func OnLeaseCheckDone(t testing.TB, f func()) {
	leaseCheckDone.Store(&f)
	t.Cleanup(func() { leaseCheckDone.Store(nil) })
}
