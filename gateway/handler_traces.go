package gateway

// traceRoutes registers the routes of traces: record and read notes attached to messages.
func (s *Server) traceRoutes() {}
