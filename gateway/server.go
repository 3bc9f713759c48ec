package gateway

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/heraldmq/herald/admin"
	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/internal/httpapi"
	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/web"
)

// Defaults of Config fields.
const (
	// BodyLimitDefault is the largest request body accepted: 8 MiB lets a
	// producer push a batch of 1 MiB payloads.
	BodyLimitDefault = 8 << 20
	// PopTimeoutDefault is a long-poll's wait when the request names none (ms in the API).
	PopTimeoutDefault = 30 * time.Second
	// MaxWSConnectionsDefault bounds WebSocket connections per instance.
	MaxWSConnectionsDefault = 10000
	// MaxSSEConnectionsDefault bounds SSE streams per instance.
	MaxSSEConnectionsDefault = 10000
	// PopTimeoutMax bounds a long-poll's wait; larger timeouts are clamped.
	PopTimeoutMax = 5 * time.Minute
	// AutopilotBatchDefault is the batch of a pop that sends autopilot=true
	// and no batch (newer Queen clients leave the size to the server).
	AutopilotBatchDefault = 200
	// BodyReadTimeoutDefault bounds the reading of a request body: a
	// producer's batch arrives in far less, and a client that trickles its
	// body holds a connection and a goroutine no longer than this.
	BodyReadTimeoutDefault = 10 * time.Second
)

// Config configures a Server.
type Config struct {
	// Store runs the queue operations. Required.
	Store *queue.Store
	// BodyLimit is the largest request body in bytes; zero means
	// BodyLimitDefault. Larger bodies are answered 413.
	BodyLimit int64
	// BodyReadTimeout bounds the reading of a request body, counted from
	// the end of its headers; zero means BodyReadTimeoutDefault. A body not
	// received in time is answered 408, its connection closed and counted
	// (herald_http_slow_body_total). Requests without a body (long-polls,
	// WebSocket upgrades, SSE streams) have no such deadline.
	BodyReadTimeout time.Duration
	// Poller serves waiting long-polls (wait=true) and is woken by pushes
	// and acks. Required.
	Poller *poller.Poller
	// Notifier, when set, tells other instances about this instance's
	// pushes (pgnotify.Notifier). It must not block.
	Notifier interface{ Notify(queue, partition string) }
	// AllowedOrigins lists origins (scheme://host[:port], http or https)
	// besides the server's own whose pages may open a WebSocket and use the
	// auth cookie (auth/cookie.go); empty means the server's own origin
	// only: the scheme the request came over (X-Forwarded-Proto from a
	// proxy that ends TLS) and its Host. An upgrade from another origin is
	// answered 403; one without an Origin (a client that is not a browser)
	// is always allowed.
	AllowedOrigins []string
	// MaxConnections caps the HTTP connections accepted through Listener,
	// every transport together (WebSocket, SSE, long-poll, plain
	// requests); zero means no cap. Past it a request is refused at once
	// and its connection closed: 503 with Retry-After, an SSE stream 200
	// with a retry: delay; GET /health and /metrics are still answered.
	// Open connections are never touched. MaxWSConnections and
	// MaxSSEConnections above it are lowered to it (logged). The server
	// (internal/server) derives it from the open-file limit.
	MaxConnections int
	// MaxWSConnections caps open WebSocket connections; zero means
	// MaxWSConnectionsDefault. Beyond it an upgrade is answered 503.
	MaxWSConnections int
	// MaxSSEConnections caps open SSE streams; zero means
	// MaxSSEConnectionsDefault. Beyond it a stream is answered 200 with a
	// retry: delay and closed, so the browser tries again later.
	MaxSSEConnections int
	// SSEHeartbeat is the interval of SSE heartbeat comments; zero means
	// SSEHeartbeatDefault.
	SSEHeartbeat time.Duration
	// SSEResumeGrace is how long a closed SSE stream's unacknowledged
	// leases wait for its browser to resume; zero means
	// SSEResumeGraceDefault.
	SSEResumeGrace time.Duration
	// FollowStartTimeout bounds how long a WebSocket follow frame may look
	// for its start (a from=<time> walks the queue) on the connection's
	// reader, which reads nothing else meanwhile; past it the frame is
	// answered with a "timeout" error. Zero means FollowStartTimeoutDefault.
	FollowStartTimeout time.Duration
	// SSELeaseCheck is how often a stream with unacknowledged messages
	// looks in the database for acks posted to other instances and for
	// leases that expired, to get its credit back (acks posted to this
	// instance give it back at once); zero means SSELeaseCheckDefault.
	SSELeaseCheck time.Duration
	// WSLeaseCheck is how often a WebSocket connection with unacknowledged
	// deliveries looks up their leases, so that one whose lease expired
	// (the client never answered) or was acked elsewhere gives its credit
	// back. WebSocket acks come over the socket and give it back at once,
	// so this only catches the rest; zero means WSLeaseCheckDefault.
	WSLeaseCheck time.Duration
	// DrainWindow spreads the closing of WebSocket and SSE connections by
	// Drain over this long, so clients do not reconnect in one storm; zero
	// closes them all at once.
	DrainWindow time.Duration
	// FollowPresence, when set, is told when this instance gets its first
	// follower of a queue (true) and loses its last (false), so that other
	// instances wake it for that queue (syncnet's Node.SetLocal, which
	// counts these beside the poller's). Called on the follower's
	// goroutine with no lock held; it must not block.
	FollowPresence func(queue string, present bool) (news bool)
	// FollowBuffer is how many messages a follow stream may have waiting
	// to be written before it is closed as a slow consumer (4001; it
	// resumes by its last id); zero means FollowBufferDefault (1,024).
	FollowBuffer int
	// OnQueueDeleted, when set, is told after a queue is deleted (syncnet
	// tells the other instances). It must not block.
	OnQueueDeleted func(queue string)
	// OnQueueConfigured, when set, is told after a queue is configured
	// (syncnet broadcasts its settings).
	OnQueueConfigured func(info queue.QueueInfo)
	// BufferDir is the directory of this instance's push buffer
	// (spool.Dir): while push maintenance is on, pushes are appended there
	// instead of written to the database, and drained into it when it
	// ends. Empty means no buffer: a push during push maintenance is
	// answered 503.
	BufferDir string
	// BufferMaxBytes bounds the push buffer file; zero means
	// spool.MaxBytesDefault (256 MiB). A push that would pass it is
	// answered 503.
	BufferMaxBytes int64
	// MaintenanceRefresh is how often RunMaintenance reads the maintenance
	// switches again when nothing said they changed; zero means
	// MaintenanceRefreshDefault (5 s).
	MaintenanceRefresh time.Duration
	// OnMaintenance, when set, is told after this instance switched a
	// maintenance mode (pop: pop maintenance), so that the other instances
	// read the switches now (syncnet). It must not block.
	OnMaintenance func(pop, enabled bool)
	// SharedState, when set, is shown by /internal/api/shared-state/stats
	// (caches; syncnet's peers, presence and counters).
	SharedState func() any
	// ClusterFollowers, when set, adds the follow streams per queue of the
	// other instances to here (this one's) for the status route's
	// clusterFollowers; unset, that is this instance's alone.
	ClusterFollowers func(here map[string]int) map[string]int
	// Auth, when set, requires a bearer token on every endpoint but
	// /health and /metrics (and /metrics too with Metrics.Auth).
	Auth *auth.Auth
	// Version is reported by /health.
	Version string
	// Database, when set, reports on the private PostgreSQL this process
	// supervises: whether it is being restarted after it died, and how many
	// restarts there were. /health answers 503 with "database":"restarting"
	// during a restart, and includes the count either way.
	Database func() (restarting bool, restarts int)
	// Instance names this instance on the status endpoint (the demo page).
	Instance string
	// Registry receives the herald_* metrics and is served by /metrics; nil
	// means a new registry with the Go runtime and process metrics.
	Registry *prometheus.Registry
	// Metrics bounds the label values of the herald_* series and may guard
	// /metrics with a token (MetricsConfig).
	Metrics MetricsConfig
	// Logger; the zero value logs nothing.
	Logger zerolog.Logger
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.BodyLimit == 0 {
		c.BodyLimit = BodyLimitDefault
	}
	if c.BodyReadTimeout == 0 {
		c.BodyReadTimeout = BodyReadTimeoutDefault
	}
	if c.MaxWSConnections == 0 {
		c.MaxWSConnections = MaxWSConnectionsDefault
	}
	if c.MaxSSEConnections == 0 {
		c.MaxSSEConnections = MaxSSEConnectionsDefault
	}
	if c.SSEHeartbeat == 0 {
		c.SSEHeartbeat = SSEHeartbeatDefault
	}
	if c.SSEResumeGrace == 0 {
		c.SSEResumeGrace = SSEResumeGraceDefault
	}
	if c.FollowStartTimeout == 0 {
		c.FollowStartTimeout = FollowStartTimeoutDefault
	}
	if c.SSELeaseCheck == 0 {
		c.SSELeaseCheck = SSELeaseCheckDefault
	}
	if c.WSLeaseCheck == 0 {
		c.WSLeaseCheck = WSLeaseCheckDefault
	}
	if c.Version == "" {
		c.Version = "dev"
	}
	if c.MaintenanceRefresh == 0 {
		c.MaintenanceRefresh = MaintenanceRefreshDefault
	}
	if c.FollowBuffer == 0 {
		c.FollowBuffer = FollowBufferDefault
	}
	return c
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.Store == nil:
		return errors.New("gateway: Config.Store is required")
	case c.BodyLimit < 0:
		return errors.New("gateway: Config.BodyLimit must not be negative")
	case c.Poller == nil:
		return errors.New("gateway: Config.Poller is required")
	case c.MaxWSConnections < 0 || c.MaxSSEConnections < 0:
		return errors.New("gateway: Config.MaxWSConnections and MaxSSEConnections must not be negative")
	case c.MaxConnections < 0:
		return errors.New("gateway: Config.MaxConnections must not be negative")
	case c.SSEHeartbeat < 0 || c.SSEResumeGrace < 0 || c.SSELeaseCheck < 0 || c.WSLeaseCheck < 0 || c.DrainWindow < 0 || c.BodyReadTimeout < 0 ||
		c.MaintenanceRefresh < 0 || c.FollowStartTimeout < 0:
		return errors.New("gateway: Config durations must not be negative")
	case c.BufferMaxBytes < 0:
		return errors.New("gateway: Config.BufferMaxBytes must not be negative")
	case c.FollowBuffer < 0:
		return errors.New("gateway: Config.FollowBuffer must not be negative")
	}
	for _, o := range c.AllowedOrigins {
		if _, ok := auth.NormalOrigin(o); !ok {
			return fmt.Errorf("gateway: Config.AllowedOrigins: %q is not an origin: scheme://host[:port], http or https, with no path"+
				" (there is no wildcard: each origin whose pages may use the cookie is named)", o)
		}
	}
	return nil
}

// Server is Herald's HTTP API. It holds no queue state: every request goes to
// the Store.
type Server struct {
	cfg     Config
	store   *queue.Store
	log     zerolog.Logger
	metrics *metrics
	conns   *conns // the connection cap (conns.go)
	mux     *http.ServeMux
	reg     *prometheus.Registry
	poller  *poller.Poller
	notify  func(queue, partition string)
	outage  *queue.OutageLog // database failures, one line per outage
	failer  *httpapi.Failer  // handlers' errors to answers
	// allowedOrigins are Config.AllowedOrigins as browsers write them
	// (auth.NormalOrigin).
	allowedOrigins []string

	drainOnce sync.Once
	draining  chan struct{} // closed by Drain

	wsSessions sessionSet     // WebSocket sessions
	streamWG   sync.WaitGroup // the goroutines of open WebSocket and SSE connections
	stacks     *warmStacks    // goroutines for the streams' deep work (stacks.go)

	sseMu       sync.Mutex
	sseCount    int          // admitted event streams (admitSSE, sseDone)
	sseSessions sessionSet   // running SSE sessions, for Drain
	deliveries  deliveries   // unacknowledged deliveries of this instance's streams (effects.go)
	follows     *followHubs  // follow streams: a hub per followed queue (follow_hub.go)
	maint       *maintenance // the maintenance modes and the push buffer (maintenance.go)

	graceMu sync.Mutex
	grace   map[*time.Timer]func() // leases of closed SSE streams, released after the grace period
	// graceLeases counts those leases by id, until released (StreamLeases).
	graceLeases map[string]int
	graceWG     sync.WaitGroup
	chains      map[string]*sseChain // SSE streams by chain (sse_chain.go)
	streamSeq   uint64               // the number of the newest SSE stream
	closed      bool
}

// New returns a Server.
func New(cfg Config) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	s := &Server{
		cfg:    cfg,
		store:  cfg.Store,
		log:    cfg.Logger.With().Str("component", "gateway").Logger(),
		mux:    http.NewServeMux(),
		reg:    reg,
		poller: cfg.Poller,
		notify: func(string, string) {},

		draining: make(chan struct{}),
		grace:    map[*time.Timer]func(){},
		stacks:   newWarmStacks(),

		graceLeases: map[string]int{},
		chains:      map[string]*sseChain{},
	}
	s.outage = &queue.OutageLog{Log: s.log}
	if cfg.Notifier != nil {
		s.notify = cfg.Notifier.Notify
	}
	if c := cfg.MaxConnections; c > 0 && (cfg.MaxWSConnections > c || cfg.MaxSSEConnections > c) {
		s.log.Info().Int("max_connections", c).Int("ws_max_connections", cfg.MaxWSConnections).
			Int("sse_max_connections", cfg.MaxSSEConnections).Msg("WebSocket and SSE caps lowered to the connection cap")
		s.cfg.MaxWSConnections, s.cfg.MaxSSEConnections = min(cfg.MaxWSConnections, c), min(cfg.MaxSSEConnections, c)
	}
	for _, o := range cfg.AllowedOrigins {
		n, _ := auth.NormalOrigin(o) // Validate checked them
		s.allowedOrigins = append(s.allowedOrigins, n)
	}
	m, err := newMetrics(reg, cfg.Store, cfg.Metrics)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	s.failer = &httpapi.Failer{Log: s.log, Outage: s.outage, OnFault: m.history.DBError}
	if s.conns, err = newConns(cfg.MaxConnections, reg); err != nil {
		return nil, err
	}
	if s.maint, err = newMaintenance(s); err != nil {
		return nil, err
	}
	if s.follows, err = newFollowHubs(s); err != nil {
		return nil, err
	}
	if err := s.routes(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) routes() error {
	s.handle("POST /api/v1/push", "push", auth.RoleReadWrite, s.handlePush)
	// A pop leases messages (and with autoAck consumes them): a GET, but a
	// change (auth/cookie.go). Routes registered with read change nothing.
	s.handle("GET /api/v1/pop/queue/{queue}", "pop", auth.RoleReadWrite, s.handlePop)
	s.handle("GET /api/v1/pop/queue/{queue}/partition/{partition}", "pop_partition", auth.RoleReadWrite, s.handlePop)
	s.handle("GET /api/v1/pop", "pop_namespace", auth.RoleReadWrite, s.handlePop)
	s.handle("POST /api/v1/ack", "ack", auth.RoleReadWrite, s.handleAck)
	s.handle("POST /api/v1/ack/batch", "ack_batch", auth.RoleReadWrite, s.handleAckBatch)
	s.handle("POST /api/v1/lease/{leaseId}/extend", "lease_extend", auth.RoleReadWrite, s.handleLeaseExtend)
	s.handle("POST /api/v1/transaction", "transaction", auth.RoleReadWrite, s.handleTransaction)
	s.handle("POST /api/v1/configure", "configure", auth.RoleReadWrite, s.handleConfigure)
	s.handle("DELETE /api/v1/resources/queues/{queue}", "delete_queue", auth.RoleAdmin, s.handleDeleteQueue)
	// Streams get no request metrics: they live for hours. The WebSocket
	// checks its token itself, to answer with a close code a browser sees.
	s.stream("GET /api/v1/ws", auth.RoleNone, s.handleWS)
	s.stream("GET /api/v1/sse/queue/{queue}", auth.RoleReadWrite, s.handleSSE)
	s.stream("GET /api/v1/sse/queue/{queue}/partition/{partition}", auth.RoleReadWrite, s.handleSSE)
	// Follow streams (follow_*.go): SSE, or a long-poll with after=/wait=.
	// They lease nothing and write nothing: read-only tokens may follow
	// what their rights let them consume.
	s.followRoute("GET /api/v1/follow/queue/{queue}", s.handleFollow)
	s.followRoute("GET /api/v1/follow/queue/{queue}/partition/{partition}", s.handleFollow)
	// Probes and scrapes stay open: orchestrators and Prometheus hold no
	// token. Metrics.Auth closes /metrics, which names queues, to all but
	// admins.
	s.read("GET /health", "health", auth.RoleNone, s.handleHealth)
	s.read("GET /metrics", "metrics", s.cfg.Metrics.role(), httpapi.Plain(promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}).ServeHTTP))
	s.read("GET /internal/api/shared-state/stats", "stats", auth.RoleAdmin, s.handleStats)
	// The demo page and the browser SDK (web/).
	page := web.Handler()
	s.read("GET /{$}", "index", auth.RoleNone, httpapi.Plain(page.ServeHTTP))
	for _, name := range web.Names() {
		if name != "index.html" {
			s.read("GET /"+name, "web", auth.RoleNone, httpapi.Plain(page.ServeHTTP))
		}
	}
	// The operator console (web/console/): static files like the demo
	// page's; every API call it makes carries the admin token pasted into it.
	s.read("GET /console", "console", auth.RoleNone, httpapi.Plain(page.ServeHTTP))
	s.read("GET /console/", "console", auth.RoleNone, httpapi.Plain(page.ServeHTTP))
	// Every queue's name and lag, every instance: not for a tenant's token.
	s.read("GET /internal/api/status", "status", auth.RoleAdmin, s.handleStatus)
	// The reference server's name for the stats of the shared state.
	s.read("GET /api/v1/system/shared-state", "shared_state", auth.RoleAdmin, s.handleStats)
	s.handle("OPTIONS /", "options", auth.RoleNone, func(w http.ResponseWriter, _ *http.Request) error {
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
	s.handle("/", "not_found", auth.RoleNone, func(_ http.ResponseWriter, r *http.Request) error {
		return httpapi.Status(http.StatusNotFound, "no route for "+r.Method+" "+r.URL.Path)
	})
	// Administration (admin/): browsing, consumer groups, the DLQ, traces,
	// maintenance, the backlog overview, and the analytics and rates of
	// what this instance recorded as it served (internal/history).
	return admin.Register(admin.Routes{Read: s.read, Handle: s.handle}, admin.Deps{Store: s.store, Hide: s.hide, Visible: s.visible,
		Effects: admin.Effects{AfterGroupMoved: s.afterGroupMoved, WakeQueue: s.wakeQueue, AfterReplay: s.afterReplay, AfterPurge: s.afterPurge,
			AfterMessageDeleted: s.afterMessageDeleted},
		Maintenance: s.maint, History: s.metrics.history, Rates: s.metrics.rates, Instance: s.cfg.Instance})
}

// Drain starts a graceful shutdown: nothing new is leased to streams,
// waiting long-polls answer 204 now (so an http.Server Shutdown does not
// wait for their timeouts), and WebSocket and SSE connections are closed at
// random points of Config.DrainWindow with codes that tell their clients to
// reconnect (elsewhere); each gives its leases back as it closes. From
// then on a WebSocket upgrade or a long-poll is refused with 503 and
// Retry-After, and an SSE stream is answered 200 with a retry: (any other
// status makes EventSource give up); other requests (acks, pushes) are
// still served until the HTTP server stops. WaitStreams waits for the
// streams; EndStreams ends those left. Safe to call more than once.
func (s *Server) Drain() {
	s.drainOnce.Do(func() {
		close(s.draining)
		// WebSockets are hijacked: http.Server.Shutdown does not see them.
		for _, ss := range append(s.wsSessions.list(), s.sseSessions.list()...) {
			go ss.drain(s.spread())
		}
		s.drainFollows()
	})
}

// EndStreams closes at once, with the drain's close code, every WebSocket
// and SSE stream still open: the drain window and its grace are over (a
// stream whose client stopped reading can wait out a write deadline). Each
// gives its leases back as it does when drained.
func (s *Server) EndStreams() {
	open := append(s.wsSessions.list(), s.sseSessions.list()...)
	var wg sync.WaitGroup
	for _, ss := range open {
		wg.Go(func() { ss.close(&disconnectShutdown) })
	}
	wg.Wait()
}

// refuseDraining answers a request for something that would wait here (a
// WebSocket upgrade, a long-poll) while the instance drains: 503 and
// Retry-After, so the client goes to another instance. The HTTP server
// closes the connection after it (it is shutting down).
func refuseDraining(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	httpapi.WriteError(w, http.StatusServiceUnavailable, "server shutting down; retry on another instance")
}

// spread is a random delay within the drain window.
func (s *Server) spread() time.Duration {
	if s.cfg.DrainWindow <= 0 {
		return 0
	}
	return rand.N(s.cfg.DrainWindow) // #nosec G404 -- spreading, not a secret
}

// WaitStreams waits until every WebSocket and SSE stream has ended (after
// Drain) or ctx ends.
func (s *Server) WaitStreams(ctx context.Context) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for s.Streams() > 0 {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Streams reports the open WebSocket connections and SSE streams.
func (s *Server) Streams() int {
	n := s.wsSessions.len()
	s.sseMu.Lock()
	n += s.sseCount
	s.sseMu.Unlock()
	return n
}

func (s *Server) isDraining() bool {
	select {
	case <-s.draining:
		return true
	default:
		return false
	}
}

// Handler returns the HTTP handler with CORS, body limit, metrics and logs,
// and the refusals of connections past the cap (see Listener).
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serveHTTP) }

// handle registers h under pattern with the per-request middleware; route is
// the metrics label (fixed strings, never ids) and need the least role a
// token must carry when auth is on. The route changes state, as far as the
// cookie rule is concerned (auth/cookie.go): a token in the cookie alone
// needs X-Herald-CSRF. A GET that changes nothing is registered with read.
func (s *Server) handle(pattern, route string, need auth.Role, h httpapi.HandlerFunc) {
	s.mux.Handle(pattern, s.instrument(route, need, auth.Changes, h))
}

// read registers a GET route with no side effect: the cookie alone may
// authorize it from an allowed origin. A GET that leases or consumes (a
// pop) is no read: it is registered with handle.
func (s *Server) read(pattern, route string, need auth.Role, h httpapi.HandlerFunc) {
	s.mux.Handle(pattern, s.instrument(route, need, auth.Reads, h))
}

// stream registers a long-lived GET endpoint: CORS and auth, no request
// metrics. An event stream opened with the cookie alone must come from an
// allowed origin and be asked for as one (Accept: text/event-stream: an
// EventSource, not a link). The WebSocket checks its token itself.
func (s *Server) stream(pattern string, need auth.Role, h httpapi.HandlerFunc) {
	s.longLived(pattern, need, auth.Streams, h)
}

// followRoute registers a follow route: an SSE stream or a long-poll (after=,
// wait=) that leases and writes nothing, so the cookie alone may open it
// from an allowed origin as it may a read, whatever its Accept.
func (s *Server) followRoute(pattern string, h httpapi.HandlerFunc) {
	s.longLived(pattern, auth.RoleReadOnly, auth.Reads, h)
}

// longLived registers a long-lived route: its handler answers what fails
// before the stream starts by returning it (the one error adapter,
// httpapi.Failer), and returns nil once the stream has started or ended.
func (s *Server) longLived(pattern string, need auth.Role, mark auth.Effect, handler httpapi.HandlerFunc) {
	h := s.failer.Handler(handler)
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		setCORS(w.Header())
		w.Header().Set("Access-Control-Allow-Headers", "Content-Type, Authorization, Last-Event-ID, "+auth.CSRFHeader)
		r, ok := s.authorize(w, r, need, mark)
		if !ok {
			return
		}
		h(w, r)
	})
}

func setCORS(hdr http.Header) {
	hdr.Set("Access-Control-Allow-Origin", "*")
	hdr.Set("Access-Control-Allow-Methods", "GET, POST, PUT, DELETE, OPTIONS")
	// No Access-Control-Allow-Credentials, ever: a page of another origin
	// cannot send the CSRF header with the user's cookie (auth/cookie.go).
	hdr.Set("Access-Control-Allow-Headers", "Content-Type, Authorization, "+auth.CSRFHeader)
	hdr.Set("Access-Control-Max-Age", "86400")
}

func (s *Server) instrument(route string, need auth.Role, eff auth.Effect, handler httpapi.HandlerFunc) http.Handler {
	h := s.failer.Handler(handler)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		setCORS(w.Header())
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		s.withBodyDeadline(w, sw, r)
		r.Body = http.MaxBytesReader(w, r.Body, s.cfg.BodyLimit)
		if r, ok := s.authorize(sw, r, need, eff); ok {
			h(sw, r)
		}
		d := time.Since(start)
		s.metrics.observeRequest(route, r.Method, sw.status, d)
		ev := s.log.Debug()
		switch {
		case sw.status == http.StatusServiceUnavailable:
			// Refused while the database is away (fail logs the outage
			// once) or for a limit: not one error line per request.
		case sw.status >= 500:
			ev = s.log.Error()
		case route != "health" && route != "metrics":
			s.outage.OK() // the database answered (an atomic load when it was not away)
		}
		ev.Str("method", r.Method).Str("path", r.URL.Path).Str("route", route).
			Int("status", sw.status).Dur("duration", d).Msg("request")
	})
}

// statusWriter remembers the status code for metrics and logs.
type statusWriter struct {
	http.ResponseWriter
	status   int
	wrote    bool
	slowBody bool // the body missed its deadline: whatever the handler answers is a 408
}

func (w *statusWriter) WriteHeader(code int) {
	if w.slowBody {
		code = http.StatusRequestTimeout
		w.Header().Set("Connection", "close") // the rest of the body is not waited for
	}
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (flush, deadlines).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
