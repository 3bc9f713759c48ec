package admin

import (
	"bytes"
	"context"
	"fmt"
	"net/http"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/internal/httpapi"
	"github.com/heraldmq/herald/queue"
)

// maintenanceRoutes registers the routes of maintenance modes: push and pop.
func (s *service) maintenanceRoutes() {
	s.routes.Read("GET /api/v1/system/maintenance", "maintenance", auth.RoleAdmin, s.handleMaintenanceGet)
	s.routes.Handle("POST /api/v1/system/maintenance", "maintenance_set", auth.RoleAdmin, s.handleMaintenanceSet)
	s.routes.Read("GET /api/v1/system/maintenance/pop", "pop_maintenance", auth.RoleAdmin, s.handlePopMaintenanceGet)
	s.routes.Handle("POST /api/v1/system/maintenance/pop", "pop_maintenance_set", auth.RoleAdmin, s.handlePopMaintenanceSet)
}

// maintenanceJSON is GET /api/v1/system/maintenance, in the reference
// server's key order.
type maintenanceJSON struct {
	MaintenanceMode    bool            `json:"maintenanceMode"`
	PopMaintenanceMode bool            `json:"popMaintenanceMode"`
	BufferedMessages   int             `json:"bufferedMessages"`
	BufferHealthy      bool            `json:"bufferHealthy"`
	BufferStats        bufferStatsJSON `json:"bufferStats"`
}

type bufferStatsJSON struct {
	PendingCount int             `json:"pendingCount"`
	FailedCount  int             `json:"failedCount"`
	DBHealthy    bool            `json:"dbHealthy"`
	FailedFiles  failedFilesJSON `json:"failedFiles"`
}

// failedFilesJSON: the reference server's files of pushes that failed
// while the database was down. Herald has none (a push then fails with
// 500 and the client retries), so every count is zero.
type failedFilesJSON struct {
	Count         int     `json:"count"`
	TotalBytes    int64   `json:"totalBytes"`
	TotalMB       float64 `json:"totalMB"`
	FailoverCount int     `json:"failoverCount"`
	Qos0Count     int     `json:"qos0Count"`
}

type maintenanceSetJSON struct {
	MaintenanceMode  bool   `json:"maintenanceMode"`
	BufferedMessages int    `json:"bufferedMessages"`
	BufferHealthy    bool   `json:"bufferHealthy"`
	Message          string `json:"message"`
}

type popMaintenanceJSON struct {
	PopMaintenanceMode bool   `json:"popMaintenanceMode"`
	Message            string `json:"message"`
}

func (s *service) handleMaintenanceGet(w http.ResponseWriter, r *http.Request) error {
	st := s.Maintenance.Current(r.Context())
	b := s.Maintenance.Buffer()
	httpapi.WriteJSON(w, http.StatusOK, maintenanceJSON{MaintenanceMode: st.Maintenance, PopMaintenanceMode: st.PopMaintenance,
		BufferedMessages: b.Records, BufferHealthy: b.Healthy,
		BufferStats: bufferStatsJSON{PendingCount: b.Records, FailedCount: b.Dropped, DBHealthy: b.DBHealthy}})
	return nil
}

func (s *service) handlePopMaintenanceGet(w http.ResponseWriter, r *http.Request) error {
	st := s.Maintenance.Current(r.Context())
	httpapi.WriteJSON(w, http.StatusOK, popMaintenanceJSON{PopMaintenanceMode: st.PopMaintenance, Message: popMessage(st.PopMaintenance, false)})
	return nil
}

func (s *service) handleMaintenanceSet(w http.ResponseWriter, r *http.Request) error {
	st, err := s.setMaintenance(r, queue.StateMaintenance)
	if err != nil {
		return err
	}
	b := s.Maintenance.Buffer()
	n := b.Records
	msg := "Maintenance mode enabled: pushes are written to each instance's disk buffer, not to the database, until it is disabled"
	if !st.Maintenance {
		msg = fmt.Sprintf("Maintenance mode disabled: every instance drains its push buffer into the database (%d messages wait on this one)", n)
	}
	httpapi.WriteJSON(w, http.StatusOK, maintenanceSetJSON{MaintenanceMode: st.Maintenance, BufferedMessages: n,
		BufferHealthy: b.Healthy, Message: msg})
	return nil
}

func (s *service) handlePopMaintenanceSet(w http.ResponseWriter, r *http.Request) error {
	st, err := s.setMaintenance(r, queue.StatePopMaintenance)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, popMaintenanceJSON{PopMaintenanceMode: st.PopMaintenance, Message: popMessage(st.PopMaintenance, true)})
	return nil
}

func popMessage(on, switched bool) string {
	switch {
	case on && switched:
		return "Pop maintenance mode enabled: pops answer 204 and subscriptions receive nothing until it is disabled"
	case switched:
		return "Pop maintenance mode disabled: pops and subscriptions resume"
	case on:
		return "Pop maintenance mode is on: pops answer 204 and subscriptions receive nothing"
	}
	return "Pop maintenance mode is off"
}

// setMaintenance reads {"enabled": bool} and sets the switch
// (Maintenance.Set: stored, applied here at once, told to the other
// instances).
func (s *service) setMaintenance(r *http.Request, key string) (queue.SystemState, error) {
	obj, err := httpapi.ReadObject(r)
	if err != nil {
		return queue.SystemState{}, err
	}
	raw := bytes.TrimSpace(obj["enabled"])
	if !bytes.Equal(raw, []byte("true")) && !bytes.Equal(raw, []byte("false")) {
		return queue.SystemState{}, httpapi.BadRequest("enabled (boolean) is required")
	}
	enabled := raw[0] == 't'
	return s.Maintenance.Set(r.Context(), key, enabled)
}

// Maintenance is the maintenance modes' switches and this instance's push
// buffer, as the message path keeps them (gateway/maintenance.go).
type Maintenance interface {
	// Current reads the switches from the database and applies them; when
	// the database cannot be read, it answers what this instance knows.
	Current(ctx context.Context) queue.SystemState
	// Set stores a switch (queue.StateMaintenance, queue.StatePopMaintenance),
	// applies it here at once and tells the other instances.
	Set(ctx context.Context, key string, enabled bool) (queue.SystemState, error)
	// Buffer reports this instance's push buffer.
	Buffer() BufferState
}

// BufferState is this instance's push buffer.
type BufferState struct {
	Records   int  // messages waiting in it
	Healthy   bool // there is a buffer and it accepts appends
	Dropped   int  // messages the drain could never store
	DBHealthy bool // the last read of the switches or drain reached the database
}
