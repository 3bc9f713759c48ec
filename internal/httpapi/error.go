package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/rs/zerolog"

	"github.com/heraldmq/herald/queue"
)

// Error is a client's mistake, answered with its status and text.
type Error struct {
	Status int
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

// Status is the error answered status with {"error": msg}.
func Status(status int, msg string) error { return &Error{Status: status, Msg: msg} }

// BadRequestf is a 400 with the formatted text.
func BadRequestf(format string, args ...any) error {
	return &Error{Status: http.StatusBadRequest, Msg: fmt.Sprintf(format, args...)}
}

// Forbiddenf is a 403 with why.
func Forbiddenf(format string, args ...any) error {
	return &Error{Status: http.StatusForbidden, Msg: fmt.Sprintf(format, args...)}
}

// RetryAfterUnavailable is the Retry-After (seconds) of a 503 answered
// because the database is unreachable (queue.IsUnavailable): a failover
// takes seconds, and a client that comes back sooner only adds load.
const RetryAfterUnavailable = 2

// ErrTextUnavailable is the error of that 503, on HTTP and in WebSocket
// error frames (code "unavailable").
const ErrTextUnavailable = "database unavailable: try again shortly"

// HandlerFunc is a handler that returns what went wrong instead of
// answering it: it ends with return err, or return BadRequestf(...), and
// Failer.Handler answers the error.
type HandlerFunc func(w http.ResponseWriter, r *http.Request) error

// Plain is h as a HandlerFunc: a handler that answers everything itself.
func Plain(h http.HandlerFunc) HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		h(w, r)
		return nil
	}
}

// Failer answers the errors of handlers, the one place where an error
// becomes a status.
type Failer struct {
	// Log receives the details of a fault the client is not told.
	Log zerolog.Logger
	// Outage logs the database's absence once per outage.
	Outage *queue.OutageLog
	// OnFault, when set, is called for each database fault answered (503
	// or 500): the analytics history counts them.
	OnFault func()
}

// Handler is h as an http.HandlerFunc: an error it returns is answered by Fail.
func (f *Failer) Handler(h HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			f.Fail(w, err)
		}
	}
}

// notFound are the store's answers that a thing named does not exist (or
// is hidden from the token, as the browse reads hide it): 404 with their
// text.
var notFound = []error{queue.ErrQueueNotFound, queue.ErrMessageNotFound}

// Fail answers an error: client mistakes 4xx with their message (a queue
// or message the store did not find 404); the
// database unreachable 503 with Retry-After (logged once per outage, see
// queue.OutageLog); anything else 500 with a generic text (the details go
// to the log).
func (f *Failer) Fail(w http.ResponseWriter, err error) {
	for _, nf := range notFound {
		if errors.Is(err, nf) {
			WriteError(w, http.StatusNotFound, nf.Error())
			return
		}
	}
	var e *Error
	switch {
	case errors.As(err, &e):
		WriteError(w, e.Status, e.Msg)
	case queue.IsInputError(err):
		WriteError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, queue.ErrForeign):
		WriteError(w, http.StatusForbidden, err.Error())
	case errors.Is(err, context.Canceled):
		// The client went away; nobody reads the answer.
		w.WriteHeader(499)
	case queue.IsUnavailable(err):
		f.fault()
		f.Outage.Fail(err, "request failed")
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfterUnavailable))
		WriteError(w, http.StatusServiceUnavailable, ErrTextUnavailable)
	default:
		// The details (SQL, driver errors) go to the log, not to the client.
		f.fault()
		f.Log.Error().Err(err).Msg("request failed")
		WriteError(w, http.StatusInternalServerError, "internal server error")
	}
}

func (f *Failer) fault() {
	if f.OnFault != nil {
		f.OnFault()
	}
}

// BadRequest is a 400 with msg.
func BadRequest(msg string) error { return &Error{Status: http.StatusBadRequest, Msg: msg} }
