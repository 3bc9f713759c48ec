package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"

	"github.com/heraldmq/herald/queue"
)

// One place turns a handler's error into its answer: a client's mistake
// with its own status and text, the database's faults counted and hidden.
func TestHandler_ErrorsAreAnsweredByKind(t *testing.T) {
	for _, c := range []struct {
		name   string
		err    error
		status int
		text   string // the {"error": ...} answered, "" for no body
		faults int
	}{
		{"bad request", BadRequest("items array is required"), http.StatusBadRequest, "items array is required", 0},
		{"forbidden, wrapped", fmt.Errorf("checking: %w", Forbiddenf("not %s", "q")), http.StatusForbidden, "not q", 0},
		{"any status", Status(http.StatusNotFound, "Consumer group not found"), http.StatusNotFound, "Consumer group not found", 0},
		{"a queue not found, wrapped", fmt.Errorf("browsing: %w", queue.ErrQueueNotFound), http.StatusNotFound, "Queue not found", 0},
		{"a message not found", queue.ErrMessageNotFound, http.StatusNotFound, "Message not found", 0},
		{"the client went away", fmt.Errorf("popping: %w", context.Canceled), 499, "", 0},
		{"the database away", fmt.Errorf("pushing: %w", &pgconn.PgError{Code: "57P01"}), http.StatusServiceUnavailable, ErrTextUnavailable, 1},
		{"anything else", errors.New("SELECT failed: secret detail"), http.StatusInternalServerError, "internal server error", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			faults := 0
			f := &Failer{Log: zerolog.Nop(), Outage: &queue.OutageLog{Log: zerolog.Nop()}, OnFault: func() { faults++ }}
			w := httptest.NewRecorder()
			f.Handler(func(http.ResponseWriter, *http.Request) error { return c.err })(w, httptest.NewRequest("GET", "/", nil))
			if w.Code != c.status {
				t.Errorf("status %d, want %d", w.Code, c.status)
			}
			var body struct{ Error string }
			if c.text != "" {
				if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || body.Error != c.text {
					t.Errorf("body %q (%v), want error %q", w.Body.String(), err, c.text)
				}
			}
			if faults != c.faults {
				t.Errorf("%d faults counted, want %d", faults, c.faults)
			}
		})
	}
}

// A handler that answers and returns nil is left alone.
func TestHandler_NilErrorLeavesTheAnswer(t *testing.T) {
	f := &Failer{Log: zerolog.Nop(), Outage: &queue.OutageLog{Log: zerolog.Nop()}}
	w := httptest.NewRecorder()
	f.Handler(func(w http.ResponseWriter, _ *http.Request) error {
		WriteJSON(w, http.StatusCreated, map[string]string{"a": "<b>"})
		return nil
	})(w, httptest.NewRequest("GET", "/", nil))
	if w.Code != http.StatusCreated || w.Body.String() != `{"a":"<b>"}` {
		t.Errorf("got %d %q, want 201 {\"a\":\"<b>\"} (no HTML escaping)", w.Code, w.Body.String())
	}
}
