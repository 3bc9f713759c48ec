package gateway

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/heraldmq/herald/internal/httpapi"
)

// The connection cap (Config.MaxConnections): every HTTP connection the
// server accepts through Listener counts, whatever it carries (a WebSocket,
// an SSE stream, a long-poll, a plain request), from Accept to its Close,
// hijacked or not. Up to the cap a connection is admitted. Past it, it is
// taken only to be answered: a few at a time (refuseSlots), with a short
// deadline (refuseDeadline), answered by the handler (refuse) and closed;
// past those slots too, it is closed unanswered. Streams already open are
// never touched.
const (
	// refuseSlots bounds the connections past the cap held at once to
	// answer them: the descriptors they take are part of the reserve the
	// cap keeps below the open-file limit.
	refuseSlots = 64
	// refuseDeadline bounds how long a connection past the cap may take to
	// send its request and read the answer: its descriptor is borrowed.
	refuseDeadline = 5 * time.Second
)

// Reasons of herald_connections_refused_total.
const (
	refusedLimit    = "limit"    // past the connection cap: answered 503, SSE 200 + retry:
	refusedOverflow = "overflow" // past the cap with no slot to answer in: closed unanswered
	refusedWSMax    = "ws_max"   // past Config.MaxWSConnections: 503
	refusedSSEMax   = "sse_max"  // past Config.MaxSSEConnections: 200 + retry:
)

// conns counts the connections accepted through Listener.
type conns struct {
	max     int64        // the cap; 0: none
	open    atomic.Int64 // admitted connections open
	pastCap atomic.Int64 // connections past the cap being answered
	refused *prometheus.CounterVec
}

func newConns(max int, reg prometheus.Registerer) (*conns, error) {
	c := &conns{max: int64(max), refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "herald_connections_refused_total",
		Help: "Connections refused: past the connection cap (limit: answered 503, SSE 200 with retry:; overflow: closed " +
			"unanswered), past --ws-max-connections (ws_max) or --sse-max-connections (sse_max)."}, []string{"reason"})}
	for _, r := range []string{refusedLimit, refusedOverflow, refusedWSMax, refusedSSEMax} {
		c.refused.WithLabelValues(r) // every reason has a series from the start
	}
	for _, col := range []prometheus.Collector{c.refused,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "herald_connections",
			Help: "Open HTTP connections admitted under the connection cap (every transport)."},
			func() float64 { return float64(c.open.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "herald_connections_max",
			Help: "The connection cap (0: none)."},
			func() float64 { return float64(c.max) })} {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Listener wraps ln so that the connections accepted through it count
// against Config.MaxConnections; serve it with an http.Server whose
// ConnContext is the Server's. Accept errors are returned unchanged:
// http.Server waits and tries again after a temporary one (EMFILE and
// ENFILE are), so running out of descriptors never stops serving.
func (s *Server) Listener(ln net.Listener) net.Listener {
	return &limitListener{Listener: ln, c: s.conns}
}

// ConnContext is http.Server.ConnContext for the connections of Listener:
// it marks one past the cap, which the handler then only refuses.
func (s *Server) ConnContext(ctx context.Context, c net.Conn) context.Context {
	if lc, ok := c.(*limitedConn); ok && lc.pastCap {
		return context.WithValue(ctx, pastCapKey{}, true)
	}
	return ctx
}

// Connections reports the connections admitted and open, and the cap (0:
// none).
func (s *Server) Connections() (open, max int) {
	return int(s.conns.open.Load()), int(s.conns.max)
}

type pastCapKey struct{}

func isPastCap(ctx context.Context) bool {
	v, _ := ctx.Value(pastCapKey{}).(bool)
	return v
}

type limitListener struct {
	net.Listener
	c *conns
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		c := l.c
		if n := c.open.Add(1); c.max <= 0 || n <= c.max {
			return &limitedConn{Conn: conn, count: &c.open}, nil
		}
		c.open.Add(-1)
		if c.pastCap.Add(1) <= refuseSlots {
			_ = conn.SetDeadline(time.Now().Add(refuseDeadline))
			return &limitedConn{Conn: conn, count: &c.pastCap, pastCap: true}, nil
		}
		c.pastCap.Add(-1)
		c.refused.WithLabelValues(refusedOverflow).Inc()
		_ = conn.Close() // a client sees a network error and comes back, an EventSource too
	}
}

// limitedConn is an accepted connection that gives its place back when it
// closes, whoever closes it (the HTTP server, or a WebSocket or SSE stream
// that took it over).
type limitedConn struct {
	net.Conn
	count   *atomic.Int64
	pastCap bool // taken only to be refused
	once    sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.count.Add(-1) })
	return err
}

// servedPastCap reports whether r is answered even on a connection past the
// cap: the health probe and the scrape, so that an orchestrator sees a full
// instance alive rather than restarting it, and its count in /metrics.
func servedPastCap(r *http.Request) bool {
	return r.Method == http.MethodGet && (r.URL.Path == "/health" || r.URL.Path == "/metrics")
}

// refuse answers a request on a connection past the cap, and closes it: an
// SSE stream 200 with a retry: delay (EventSource gives up on any other
// status), anything else (a WebSocket upgrade before it happens included)
// 503 with Retry-After.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request) {
	s.conns.refused.WithLabelValues(refusedLimit).Inc()
	h := w.Header()
	setCORS(h)
	h.Set("Connection", "close")
	if strings.HasPrefix(r.URL.Path, "/api/v1/sse/") {
		s.metrics.sseRefused.Inc()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		retryLater(w)
		return
	}
	h.Set("Retry-After", "5")
	httpapi.WriteError(w, http.StatusServiceUnavailable, "too many connections; retry later or elsewhere")
}

// serveHTTP is the Server's handler: requests on a connection past the cap
// are refused, but for those servedPastCap lets through (and the connection
// then closes).
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if isPastCap(r.Context()) {
		if !servedPastCap(r) {
			s.refuse(w, r)
			return
		}
		w.Header().Set("Connection", "close")
	}
	s.mux.ServeHTTP(w, r)
}
