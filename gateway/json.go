package gateway

import (
	"net/http"

	"github.com/heraldmq/herald/internal/httpapi"
)

// The names the stream handlers (handler_sse.go, handler_ws.go, follow_*.go)
// use for httpapi's plumbing, and Server.fail, the one error adapter's
// Fail for a handler that answers its errors itself.

type badRequest = httpapi.Error

func writeJSON(w http.ResponseWriter, status int, v any) { httpapi.WriteJSON(w, status, v) }

func writeError(w http.ResponseWriter, status int, msg string) { httpapi.WriteError(w, status, msg) }

func badRequestf(format string, args ...any) error { return httpapi.BadRequestf(format, args...) }

func stringValue(raw []byte, key string) (string, bool, error) { return httpapi.StringValue(raw, key) }

// fail answers err (httpapi.Failer.Fail).
func (s *Server) fail(w http.ResponseWriter, err error) { s.failer.Fail(w, err) }
func boolParam(v, name string) (bool, error)            { return httpapi.BoolParam(v, name) }
func clampedParam(v, name string, lo, hi int) (int, error) {
	return httpapi.ClampedParam(v, name, lo, hi)
}
