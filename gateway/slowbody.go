package gateway

import (
	"errors"
	"io"
	"net/http"
	"os"
	"time"
)

// A request body must arrive within Config.BodyReadTimeout. The deadline is
// set on the connection for this request only (http.ResponseController), not
// as http.Server.ReadTimeout: requests without a body (long-polls, WebSocket
// upgrades, SSE streams) get none, and the deadline is lifted as soon as the
// body has been read, so it never cuts the handler's work afterwards.

// errSlowBody is what a handler reading the body sees at the deadline; its
// answer is then turned into 408 by the statusWriter.
type errSlowBody struct{ timeout time.Duration }

func (e errSlowBody) Error() string {
	return "request body not received within " + e.timeout.String()
}

// deadlineBody is a request body read under the body deadline.
type deadlineBody struct {
	io.ReadCloser
	s       *Server
	rc      *http.ResponseController
	sw      *statusWriter
	settled bool // read to its end or failed: the deadline is lifted or spent
}

// withBodyDeadline sets the body deadline on r's connection and replaces
// r.Body with one read under it; r without a body is left alone.
func (s *Server) withBodyDeadline(w http.ResponseWriter, sw *statusWriter, r *http.Request) {
	if r.Body == nil || r.Body == http.NoBody {
		return
	}
	rc := http.NewResponseController(w)
	if rc.SetReadDeadline(time.Now().Add(s.cfg.BodyReadTimeout)) != nil {
		return // a writer without a connection (tests' recorders): nothing to bound
	}
	r.Body = &deadlineBody{ReadCloser: r.Body, s: s, rc: rc, sw: sw}
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == nil || b.settled {
		return n, err
	}
	b.settled = true
	if errors.Is(err, os.ErrDeadlineExceeded) {
		b.s.metrics.slowBodies.Inc()
		b.sw.slowBody = true
		return n, errSlowBody{timeout: b.s.cfg.BodyReadTimeout}
	}
	// At its end net/http starts reading the connection in the background
	// to notice a client that leaves; a deadline left set would cancel the
	// request's context when it passes.
	_ = b.rc.SetReadDeadline(time.Time{})
	return n, err
}
