package gateway

// consumerGroupRoutes registers the routes of consumer groups: list, lagging, details, delete, subscription, seek.
func (s *Server) consumerGroupRoutes() {}
