package gateway

// browseRoutes registers the routes of resources, messages and status reads.
func (s *Server) browseRoutes() {}
