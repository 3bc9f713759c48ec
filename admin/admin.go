package admin

import (
	"context"
	"errors"

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
}

// service is the admin routes' handlers and what they use.
type service struct {
	routes Routes
	store  *queue.Store
	hide   func(ctx context.Context, r *auth.Rights, id string) (string, error)
}

// Register registers the admin routes on rt.
func Register(rt Routes, d Deps) error {
	if rt.Read == nil || rt.Handle == nil || d.Store == nil || d.Hide == nil {
		return errors.New("admin: Routes.Read, Routes.Handle, Deps.Store and Deps.Hide are required")
	}
	s := &service{routes: rt, store: d.Store, hide: d.Hide}
	s.traceRoutes() // traces.go
	// The console's overview of what each group has not finished (admin).
	s.routes.Read("GET /api/v1/status/backlog", "status_backlog", auth.RoleAdmin, s.handleBacklog) // backlog.go
	return nil
}
