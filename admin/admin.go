package admin

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/internal/httpapi"
	"github.com/heraldmq/herald/queue"
)

// Routes registers a route the way the gateway registers its own (CORS,
// the body limit and deadline, the token at the door, request metrics,
// the error adapter); route is the metrics label, need the least role.
type Routes struct {
	// Read registers a GET that changes nothing: the cookie alone may
	// authorize it from an allowed origin (auth.Reads).
	Read func(pattern, route string, need auth.Role, h httpapi.HandlerFunc)
	// Handle registers a route that changes something (auth.Changes).
	Handle func(pattern, route string, need auth.Role, h httpapi.HandlerFunc)
}

// Deps is what the admin routes take from the server they are part of.
type Deps struct {
	// Store answers every read and act. Required.
	Store *queue.Store
	// Hide returns id, a partition's id, or an id that names nothing when
	// it names a partition the rights may not consume, so that the store
	// answers for it as for an unknown one (gateway/authorize.go says why).
	// Rights nil: id. Required.
	Hide func(ctx context.Context, r *auth.Rights, id string) (string, error)
	// Visible returns the names of the partitions among ids that exist and
	// that the rights may consume (every one that exists, rights nil),
	// keyed in lower case. Required.
	Visible func(ctx context.Context, r *auth.Rights, ids []string) (map[string]queue.PartitionName, error)
	// Effects is what follows an act on the message path. Required.
	Effects Effects
	// Maintenance is the maintenance modes and the push buffer. Required.
	Maintenance Maintenance
	// Series is what GET /api/v1/status charts from the instance's
	// history: throughput buckets (newest first) between from and to and
	// the workers of the last 2 minutes, for queue ("" for all) within the
	// request's rights. Nil: both empty.
	Series func(r *http.Request, from, to time.Time, bucketMinutes int, queue string) (throughput, workers []any)
}

// Effects is what the message path does after an admin act: releases,
// wake-ups and counts (gateway/effects.go). None may block.
type Effects struct {
	// AfterGroupMoved follows a group's deletion or seek: the leases it
	// ended are released and their queues woken, here and elsewhere.
	AfterGroupMoved func(released []queue.ReleasedLease)
	// WakeQueue wakes whoever waits on a queue, here and elsewhere.
	WakeQueue func(queue string)
	// AfterReplay counts a DLQ replay, releases the leases it settled and
	// wakes the partitions that have a message again.
	AfterReplay func(*queue.DLQActResult)
	// AfterPurge counts a DLQ purge.
	AfterPurge func(*queue.DLQActResult)
	// AfterMessageDeleted follows the deletion of one message: the
	// streams holding it get their credit back, the leases it ended are
	// released and their waiters woken.
	AfterMessageDeleted func(res *queue.DeleteResult, partitionID, transactionID string)
}

// service is the admin routes' handlers and what they use.
type service struct {
	routes  Routes
	store   *queue.Store
	hide    func(ctx context.Context, r *auth.Rights, id string) (string, error)
	visible func(ctx context.Context, r *auth.Rights, ids []string) (map[string]queue.PartitionName, error)
	fx      Effects
	maint   Maintenance
	series  func(r *http.Request, from, to time.Time, bucketMinutes int, queue string) (throughput, workers []any)
}

// Register registers the admin routes on rt.
func Register(rt Routes, d Deps) error {
	fx := d.Effects
	if rt.Read == nil || rt.Handle == nil || d.Store == nil || d.Hide == nil ||
		fx.AfterGroupMoved == nil || fx.WakeQueue == nil || fx.AfterReplay == nil || fx.AfterPurge == nil || fx.AfterMessageDeleted == nil || d.Maintenance == nil || d.Visible == nil {
		return errors.New("admin: Routes.Read, Routes.Handle, Deps.Store, Deps.Hide, Deps.Visible, every Deps.Effects func and Deps.Maintenance are required")
	}
	s := &service{routes: rt, store: d.Store, hide: d.Hide, visible: d.Visible, fx: fx, maint: d.Maintenance, series: d.Series}
	s.dlqRoutes()           // dlq.go
	s.consumerGroupRoutes() // groups.go
	s.traceRoutes()         // traces.go
	s.maintenanceRoutes()   // maintenance.go
	s.browseRoutes()        // browse.go
	// The console's overview of what each group has not finished (admin).
	s.routes.Read("GET /api/v1/status/backlog", "status_backlog", auth.RoleAdmin, s.handleBacklog) // backlog.go
	return nil
}
