package admin

import (
	"context"
	"errors"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/internal/history"
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
	// History is what this instance did, minute by minute, as the message
	// path recorded it: the analytics routes and GET /api/v1/status's
	// throughput and workers read it (analytics.go). Required.
	History *history.Minutes
	// Rates is the push and ack rates GET /api/v1/status/rates answers
	// with. Required.
	Rates *history.Rates
	// Instance names this instance in the analytics and rates answers;
	// empty: the machine's host name (the rates answer it empty).
	Instance string
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
	routes Routes
	Deps
}

// Register registers the admin routes on rt.
func Register(rt Routes, d Deps) error {
	fx := d.Effects
	if rt.Read == nil || rt.Handle == nil || d.Store == nil || d.Hide == nil ||
		fx.AfterGroupMoved == nil || fx.WakeQueue == nil || fx.AfterReplay == nil || fx.AfterPurge == nil || fx.AfterMessageDeleted == nil || d.Maintenance == nil || d.Visible == nil ||
		d.History == nil || d.Rates == nil {
		return errors.New("admin: Routes.Read, Routes.Handle, Deps.Store, Deps.Hide, Deps.Visible, every Deps.Effects func, Deps.Maintenance, Deps.History and Deps.Rates are required")
	}
	s := &service{routes: rt, Deps: d}
	s.dlqRoutes()           // dlq.go
	s.consumerGroupRoutes() // groups.go
	s.traceRoutes()         // traces.go
	s.maintenanceRoutes()   // maintenance.go
	s.browseRoutes()        // browse.go
	s.analyticsRoutes()     // analytics.go: the instance's history, the rates
	// The console's overview of what each group has not finished (admin).
	s.routes.Read("GET /api/v1/status/backlog", "status_backlog", auth.RoleAdmin, s.handleBacklog) // backlog.go
	return nil
}
