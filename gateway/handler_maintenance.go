package gateway

// maintenanceRoutes registers the routes of maintenance modes: push and pop.
func (s *Server) maintenanceRoutes() {}
