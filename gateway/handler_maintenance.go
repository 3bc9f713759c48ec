package gateway

import (
	"bytes"
	"fmt"
	"net/http"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/internal/httpapi"
	"github.com/heraldmq/herald/queue"
)

// maintenanceRoutes registers the routes of maintenance modes: push and pop.
func (s *Server) maintenanceRoutes() {
	s.read("GET /api/v1/system/maintenance", "maintenance", auth.RoleAdmin, s.handleMaintenanceGet)
	s.handle("POST /api/v1/system/maintenance", "maintenance_set", auth.RoleAdmin, s.handleMaintenanceSet)
	s.read("GET /api/v1/system/maintenance/pop", "pop_maintenance", auth.RoleAdmin, s.handlePopMaintenanceGet)
	s.handle("POST /api/v1/system/maintenance/pop", "pop_maintenance_set", auth.RoleAdmin, s.handlePopMaintenanceSet)
	// The reference server's name for the stats of the shared state.
	s.read("GET /api/v1/system/shared-state", "shared_state", auth.RoleAdmin, s.handleStats)
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

// currentMaintenance reads the switches from the database and applies
// them; when the database cannot be read, it answers with what this
// instance knows (and dbHealthy turns false).
func (s *Server) currentMaintenance(r *http.Request) queue.SystemState {
	if st, err := s.maint.load(r.Context(), "request"); err == nil {
		return st
	}
	return queue.SystemState{Maintenance: s.maint.push.Load(), PopMaintenance: s.maint.pop.Load()}
}

// bufferHealthy: this instance has a buffer and it accepts appends.
func (m *maintenance) bufferHealthy() bool { return m.spool != nil && m.stats().Healthy }

func (s *Server) handleMaintenanceGet(w http.ResponseWriter, r *http.Request) error {
	st := s.currentMaintenance(r)
	m := s.maint
	n := m.stats().Records
	httpapi.WriteJSON(w, http.StatusOK, maintenanceJSON{MaintenanceMode: st.Maintenance, PopMaintenanceMode: st.PopMaintenance,
		BufferedMessages: n, BufferHealthy: m.bufferHealthy(),
		BufferStats: bufferStatsJSON{PendingCount: n, FailedCount: int(m.droppedN.Load()), DBHealthy: m.dbHealthy.Load()}})
	return nil
}

func (s *Server) handlePopMaintenanceGet(w http.ResponseWriter, r *http.Request) error {
	st := s.currentMaintenance(r)
	httpapi.WriteJSON(w, http.StatusOK, popMaintenanceJSON{PopMaintenanceMode: st.PopMaintenance, Message: popMessage(st.PopMaintenance, false)})
	return nil
}

func (s *Server) handleMaintenanceSet(w http.ResponseWriter, r *http.Request) error {
	st, err := s.setMaintenance(r, queue.StateMaintenance)
	if err != nil {
		return err
	}
	m := s.maint
	n := m.stats().Records
	msg := "Maintenance mode enabled: pushes are written to each instance's disk buffer, not to the database, until it is disabled"
	if !st.Maintenance {
		msg = fmt.Sprintf("Maintenance mode disabled: every instance drains its push buffer into the database (%d messages wait on this one)", n)
	}
	httpapi.WriteJSON(w, http.StatusOK, maintenanceSetJSON{MaintenanceMode: st.Maintenance, BufferedMessages: n,
		BufferHealthy: m.bufferHealthy(), Message: msg})
	return nil
}

func (s *Server) handlePopMaintenanceSet(w http.ResponseWriter, r *http.Request) error {
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

// setMaintenance reads {"enabled": bool}, stores the switch, applies it
// here at once and tells the other instances (the transaction's NOTIFY,
// and Config.OnMaintenance: syncnet).
func (s *Server) setMaintenance(r *http.Request, key string) (queue.SystemState, error) {
	obj, err := httpapi.ReadObject(r)
	if err != nil {
		return queue.SystemState{}, err
	}
	raw := bytes.TrimSpace(obj["enabled"])
	if !bytes.Equal(raw, []byte("true")) && !bytes.Equal(raw, []byte("false")) {
		return queue.SystemState{}, httpapi.BadRequest("enabled (boolean) is required")
	}
	enabled := raw[0] == 't'
	st, err := s.store.SetSystemFlag(r.Context(), key, enabled)
	if err != nil {
		return queue.SystemState{}, err
	}
	s.maint.apply(st, "request")
	if s.cfg.OnMaintenance != nil {
		s.cfg.OnMaintenance(key == queue.StatePopMaintenance, enabled)
	}
	return st, nil
}
