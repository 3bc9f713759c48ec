package gateway

import "net/http"

// Mux is the ServeMux behind Handler (which refuses connections past the
// cap first), for the route tests.
func (s *Server) Mux() *http.ServeMux { return s.mux }
