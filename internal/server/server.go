package server

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/heraldmq/herald/gateway"
	"github.com/heraldmq/herald/internal/tick"
	"github.com/heraldmq/herald/pgnotify"
	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/syncnet"
)

// Server is one assembled Herald instance. New builds it (database up and
// migrated, every component constructed, nothing running); Run runs it
// until its context ends and then stops it; Close releases what New
// acquired when Run is never called.
type Server struct {
	cfg      Config
	log      zerolog.Logger
	ln       net.Listener
	db       *database
	sup      *supervisor
	instance string
	reg      *prometheus.Registry

	configs *queue.ConfigSnapshot
	store   *queue.Store
	lock    *queue.InstanceLock // the instance id's, held for the instance's life
	// wakeOthers tells the other instances (NOTIFY, syncnet) that a
	// partition has work; nil when there is no one to tell.
	wakeOthers interface{ Notify(queue, partition string) }
	node       *syncnet.Node
	poller     *poller.Poller
	gw         *gateway.Server
	notifier   *pgnotify.Notifier
	listener   *pgnotify.Listener
	logical    *pgnotify.Logical
	mesh       *mesh
	meshKick   chan struct{} // the mesh's kick, made before the node that kicks it
	// reconcileKick asks for a reconciliation of the leases (reconcile.go).
	reconcileKick chan struct{}

	// runners are the long-lived loops Run starts (each returns when its
	// context ends); wakeReady fires once the database wake source
	// listens (nil: nothing to wait for).
	runners   []runner
	wakeReady <-chan struct{}
	// hygiene is what the hygiene loop reports each sample to.
	hygiene func(*queue.Hygiene)
	ready   chan struct{}

	ran       atomic.Bool // Run started: it stops what New built
	closeOnce sync.Once
	closeErr  error
}

type runner struct {
	name string
	run  func(context.Context) error
}

// New assembles an instance; see the package doc for the order. On error
// everything acquired so far is released.
func New(ctx context.Context, cfg Config) (_ *Server, err error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, ln: cfg.Listener, ready: make(chan struct{}), meshKick: make(chan struct{}, 1)}
	defer func() {
		if err != nil {
			_ = s.Close()
		}
	}()
	// Before the private PostgreSQL starts, so that it inherits the
	// raised limit.
	openFiles, err := raiseOpenFileLimit(s.log)
	if err != nil {
		return nil, err
	}
	if s.ln == nil {
		if s.ln, err = net.Listen("tcp", cfg.Addr); err != nil {
			return nil, fmt.Errorf("listening on %s: %w", cfg.Addr, err)
		}
	}
	if s.db, err = openDatabase(ctx, &cfg, s.log); err != nil {
		return nil, err
	}
	// Restarts the private PostgreSQL if it dies; stopped before the pool
	// closes and the cluster is released.
	s.sup = supervise(s.db.cluster, s.db.pool, s.log)
	s.instance = cfg.InstanceID
	if s.instance == "" {
		host, _ := os.Hostname()
		s.instance = fmt.Sprintf("%s:%d", host, s.Addr().Port)
	}
	if s.reg = cfg.Registry; s.reg == nil {
		s.reg = prometheus.NewRegistry()
		s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if err := s.buildStore(ctx); err != nil {
		return nil, err
	}
	if s.lock, err = lockInstance(ctx, s.store, cfg.ListenDatabaseURL, s.log); err != nil {
		return nil, err
	}
	if err := s.buildPollerAndNode(); err != nil {
		return nil, err
	}
	s.buildMesh(ctx)
	gwCfg, err := s.gatewayConfig(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.buildWakeSources(ctx, &gwCfg); err != nil {
		return nil, err
	}
	// The members beat (every MemberBeat, 2 s) also reads when a
	// maintenance switch last changed and has the gateway read them again
	// (mesh.onState): the periodic read only heals what neither it nor a
	// NOTIFY or datagram covers, in every wake mode. At 5 s it was an
	// idle instance's most frequent wake-up after the beat itself.
	if gwCfg.MaintenanceRefresh == 0 {
		gwCfg.MaintenanceRefresh = gateway.MaintenanceRefreshListening
	}
	if gwCfg.MaxConnections, err = connectionLimit(&cfg, openFiles, int(s.db.pool.Config().MaxConns), s.log); err != nil {
		return nil, err
	}
	s.wakeOthers = gwCfg.Notifier
	if cfg.Adjust.Gateway != nil {
		cfg.Adjust.Gateway(&gwCfg)
	}
	if s.gw, err = gateway.New(gwCfg); err != nil {
		return nil, err
	}
	// The maintenance switches, and the push buffer's drain.
	s.runners = append(s.runners, runner{"maintenance", s.gw.RunMaintenance},
		// The analytics history's gauges (pool, CPU, memory, scheduler).
		runner{"analytics", s.gw.RunAnalytics})
	// The leases, reconciled when the database changes (reconcile.go).
	s.reconcileKick = make(chan struct{}, 1)
	s.lock.OnDatabaseChanged(s.databaseChanged)
	s.runners = append(s.runners, runner{"lease reconciler", s.reconcileLoop})
	if err := s.gw.LoadMaintenance(ctx); err != nil {
		s.log.Warn().Err(err).Msg("reading the maintenance switches at start; they are read again periodically")
	}
	return s, nil
}

// buildStore makes the queue store over the pool, with the config cache
// syncnet keeps in step.
func (s *Server) buildStore(ctx context.Context) error {
	var encKey []byte
	if s.cfg.EncryptionKey != "" {
		k, err := hex.DecodeString(s.cfg.EncryptionKey)
		if err != nil {
			return fmt.Errorf("server: Config.EncryptionKey: %w", err)
		}
		encKey = k
	}
	s.configs = queue.NewConfigCache()
	qc := queue.Config{Pool: s.db.pool, InstanceID: s.instance, Configs: s.configs, Logger: s.log, EncryptionKey: encKey,
		PartitionCleanupAfter: cleanupAfter(s.cfg.PartitionCleanupDays),
		TraceRetention:        traceRetention(s.cfg.TraceRetention),
		// The node is built after the store; it exists by the time
		// retention runs.
		OnPartitionDeleted: func(q, p string) {
			if s.node != nil {
				s.node.PartitionDeleted(q, p)
			}
		},
		// Every pop passes the store: the gateway counts what each gave
		// up on once, whichever path popped. The gateway is built after
		// the store, before anything pops (New returns before Run).
		OnGivenUp: func(res *queue.PopResult) {
			if s.gw != nil {
				s.gw.CountGivenUp(res)
			}
		}}
	if s.cfg.Adjust.Store != nil {
		s.cfg.Adjust.Store(&qc)
	}
	var err error
	if s.store, err = queue.New(qc); err != nil {
		return err
	}
	if err := s.store.CheckEncryption(ctx); err != nil {
		return err
	}
	registerCacheMetrics(s.reg, s.configs, s.store)
	return nil
}

// buildPollerAndNode makes the poller and, with peers, the syncnet node.
// They know each other: the poller reports its consumers' presence and its
// leases to the node, the node wakes the poller.
func (s *Server) buildPollerAndNode() error {
	c := &s.cfg
	mode := poller.WakePush
	if c.Wake == WakePoll {
		mode = poller.WakePoll
	}
	pc := poller.Config{Store: s.store, Workers: c.PollWorkers, Mode: mode, SweepMin: c.SweepMin, SweepMax: c.SweepMax,
		PreflightTimeout: c.PreflightTimeout, MaxIntentions: c.PreflightMax, Registerer: s.reg, Logger: s.log}
	if c.SyncOn() {
		// syncnet names each pushed partition as the push commits.
		pc.PromptSources = []string{syncnet.SourceSync}
		serverID := c.ServerID
		if serverID == "" {
			host, _ := os.Hostname()
			_, syncPort, _ := net.SplitHostPort(c.SyncBind)
			serverID = host + ":" + syncPort
		}
		sc := syncnet.Config{Bind: c.SyncBind, Peers: c.SyncPeers, Secret: c.SyncSecret, ServerID: serverID,
			Freshness: c.SyncFreshness, Registerer: s.reg, Logger: s.log,
			Waker: syncnet.WakerFunc(wakers{s}.Wake),
			// The gateway exists before any datagram is read (Run).
			OnMaintenance: func(bool, bool) { s.gw.RefreshMaintenance() },
			OnStranger: func() {
				select {
				case s.meshKick <- struct{}{}:
				default:
				}
			}}
		hook(&sc, s.store)
		if c.Adjust.Syncnet != nil {
			c.Adjust.Syncnet(&sc)
		}
		var err error
		if s.node, err = syncnet.New(sc); err != nil {
			return err
		}
		pc.OnPresence = s.node.SetLocal
		pc.Hints = s.node
		s.runners = append(s.runners, runner{"syncnet", s.node.Run})
	}
	if c.Adjust.Poller != nil {
		c.Adjust.Poller(&pc)
	}
	var err error
	s.poller, err = poller.New(pc)
	return err
}

// buildMesh makes the membership loop: this instance's row, its peers.
func (s *Server) buildMesh(ctx context.Context) {
	c := &s.cfg
	s.mesh = &mesh{kick: s.meshKick, store: s.store, node: s.node, deadAfter: c.MemberDeadAfter,
		onState: func() {
			if s.gw != nil {
				s.gw.RefreshMaintenance()
			}
		},
		followers: func() map[string]int {
			if s.gw == nil {
				return nil
			}
			return s.gw.Followers()
		},
		log:  s.log.With().Str("component", "members").Logger(),
		self: queue.Member{ID: s.instance, Session: queue.NewID(), StartedAt: time.Now(), Listens: c.Wake == WakeNotify}}
	s.mesh.beat = c.memberBeat()
	if s.mesh.deadAfter <= 0 {
		s.mesh.deadAfter = MemberDeadAfterDefault
	}
	if s.node != nil {
		s.mesh.self.ID, s.mesh.self.Session = s.node.ServerID(), s.node.Session()
		s.mesh.self.SyncAddr = advertised(ctx, c.SyncAdvertise, s.node.Addr(), s)
	}
	s.runners = append(s.runners, runner{"members", s.mesh.Run})
}

// Members are the other instances the members table lists alive.
func (s *Server) Members() []queue.Member { return s.mesh.Members() }

// gatewayConfig is the HTTP server's config, with auth and the store's
// loops (config refresh, retention, hygiene) that report to its metrics.
func (s *Server) gatewayConfig(ctx context.Context) (gateway.Config, error) {
	c := &s.cfg
	// One bound for the queue labels of the gateway's series and of
	// retention's, so both name the same queues.
	queueLabels := gateway.NewLabelLimiter(c.MetricsMaxQueues)
	gc := gateway.Config{Store: s.store, Poller: s.poller, BodyLimit: c.BodyLimit, BodyReadTimeout: c.BodyReadTimeout,
		Version: c.Version, Instance: s.instance, AllowedOrigins: c.AllowedOrigins,
		MaxWSConnections: c.MaxWSConnections, MaxSSEConnections: c.MaxSSEConnections,
		SSEHeartbeat: c.SSEHeartbeat, SSEResumeGrace: c.SSEResumeGrace, DrainWindow: c.DrainWindow,
		BufferDir: bufferDir(c, s.log), BufferMaxBytes: c.BufferMaxBytes, Registry: s.reg, Logger: s.log,
		Metrics:     gateway.MetricsConfig{Queues: queueLabels, GroupLabels: c.MetricsGroupLabels, Auth: c.MetricsAuth},
		SharedState: sharedState(s.configs, s.store, s.node),
		// Every instance's followers: this one's now, the others' as of
		// their last members beat (the mesh is built first).
		ClusterFollowers: func(here map[string]int) map[string]int { return s.mesh.Followers(here) }}
	if s.sup != nil {
		gc.Database = s.sup.health
	}
	if s.node != nil {
		// Followers are consumers too: peers wake this instance, and
		// NOTIFY is not skipped, for a queue it has followers of.
		gc.FollowPresence = s.node.SetLocal
		gc.OnQueueDeleted = s.node.QueueDeleted
		gc.OnQueueConfigured = announce(s.node)
		gc.OnMaintenance = s.node.MaintenanceSet
	}
	if c.AuthOn() {
		var err error
		if gc.Auth, err = newAuth(ctx, c, s.reg, s.log); err != nil {
			return gc, err
		}
	}
	retained := gateway.RetentionMetrics(s.reg, queueLabels)
	// Table sizes, dead rows, the xmin horizon, slots, consumer backlog
	// and dead letters, for /metrics and a warning when a transaction holds the horizon over 5 minutes.
	hygiene := gateway.HygieneMetrics(s.reg, gc.Metrics)
	s.hygiene = hygiene
	s.runners = append(s.runners,
		// The cached queue configs are read again every minute: a change
		// whose broadcast was lost heals.
		runner{"config refresh", func(ctx context.Context) error {
			return s.store.RunConfigRefresh(ctx, queue.ConfigRefreshDefault)
		}},
		runner{"retention", func(ctx context.Context) error {
			return s.store.RunRetentionLoop(ctx, c.RetentionInterval, func(ds []queue.RetentionDeleted) {
				retained(ds)
				s.gw.RecordRetention(ds) // the analytics history (the gateway exists before the loops run)
			})
		}},
		runner{"hygiene", func(ctx context.Context) error {
			return s.store.RunHygieneLoop(ctx, hygieneInterval, hygiene)
		}})
	return gc, nil
}

// buildWakeSources makes the database wake source of the Wake mode, and
// tells the gateway whom a push notifies.
func (s *Server) buildWakeSources(ctx context.Context, gc *gateway.Config) error {
	c := &s.cfg
	var err error
	switch c.Wake {
	case WakeNotify:
		// Our pushes wake this instance directly; the NOTIFY is for the
		// others, and each instance skips its own.
		self := queue.NewID()
		nc := pgnotify.NotifierConfig{Pool: s.db.pool, Window: c.NotifyWindow, Sender: self, Registerer: s.reg, Logger: s.log}
		// No NOTIFY where syncnet woke every instance that listens.
		nc.Presence = s.mesh
		if c.Adjust.Notifier != nil {
			c.Adjust.Notifier(&nc)
		}
		if s.notifier, err = pgnotify.NewNotifier(nc); err != nil {
			return err
		}
		lc := pgnotify.ListenerConfig{Waker: wakers{s}, Self: self, Registerer: s.reg, Logger: s.log,
			OnState: func() { s.gw.RefreshMaintenance() },
			// A quiet LISTEN connection is pinged at the members beat's
			// instants: an idle instance wakes once for both.
			NextPing: func(t time.Time) time.Time { return tick.After(t, c.memberBeat()) }}
		if c.ListenDatabaseURL != "" {
			lc.URL = c.ListenDatabaseURL
		} else {
			lc.Pool = s.db.pool
		}
		if c.Adjust.Listener != nil {
			c.Adjust.Listener(&lc)
		}
		if s.listener, err = pgnotify.NewListener(lc); err != nil {
			return err
		}
		s.mesh.on = s.listener
		gc.Notifier = s.notifier
		s.wakeReady = s.listener.Connected()
		s.runners = append(s.runners, runner{"notifier", s.notifier.Run}, runner{"listener", s.listener.Run})
	case WakeLogical:
		lc := pgnotify.LogicalConfig{Pool: s.db.pool, URL: c.ListenDatabaseURL, Tables: s.store, Waker: wakers{s},
			Registerer: s.reg, Logger: s.log}
		if c.Adjust.Logical != nil {
			c.Adjust.Logical(&lc)
		}
		if s.logical, err = pgnotify.NewLogical(lc); err != nil {
			return err
		}
		if err := s.logical.Check(ctx); err != nil {
			return err
		}
		s.wakeReady = s.logical.Ready()
		s.runners = append(s.runners, runner{"logical", s.logical.Run})
	}
	if s.node != nil {
		// Pushes announce themselves over syncnet too, to the peers with
		// subscribers.
		gc.Notifier = notifiers{gc.Notifier, s.node}
	}
	return nil
}

// Run serves until ctx ends, a component fails or the private PostgreSQL
// cannot be restarted, then stops everything in the order the package doc
// gives and releases what New acquired. It returns the failure, if any.
func (s *Server) Run(ctx context.Context) (err error) {
	s.ran.Store(true)
	defer func() { err = errors.Join(err, s.Close()) }()
	stopPoller := s.poller.Start()
	defer stopPoller()
	// The loops outlive ctx: they stop after the HTTP server, so that
	// streams draining still reach a working instance.
	loopsCtx, stopLoops := context.WithCancel(context.Background())
	defer stopLoops()
	g, gctx := errgroup.WithContext(loopsCtx)
	for _, r := range s.runners {
		g.Go(func() error {
			if err := r.run(gctx); err != nil && gctx.Err() == nil {
				return fmt.Errorf("%s: %w", r.name, err)
			}
			return nil
		})
	}
	defer func() {
		stopLoops()
		err = errors.Join(err, g.Wait())
	}()
	s.releasePreviousLife(loopsCtx)
	srv := &http.Server{Handler: s.gw.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ConnContext: s.gw.ConnContext}
	errc := make(chan error, 1)
	// Connections count against the cap. An accept that fails for want of
	// descriptors (EMFILE, ENFILE) is temporary: Serve waits up to 1 s and
	// accepts again, it does not return.
	go func() { errc <- srv.Serve(s.gw.Listener(s.ln)) }()
	go s.signalReady(gctx)
	s.log.Info().Str("url", fmt.Sprintf("http://localhost:%d/", s.Addr().Port)).Str("instance", s.instance).
		Str("version", s.cfg.Version).Str("wake", s.cfg.Wake).Msg("herald is serving")

	var fatal error // a component failed, or the private PostgreSQL stays down
	select {
	case err := <-errc:
		return fmt.Errorf("serving http: %w", err)
	case <-ctx.Done():
	case <-gctx.Done(): // a loop failed; g.Wait reports it
	case fatal = <-s.sup.Failed():
	}
	s.shutdown(srv)
	return fatal
}

// shutdown stops accepting, then drains, all within DrainWindow and
// ShutdownTimeout. The HTTP server's Shutdown starts at once: the listener
// closes (a client's next connection goes to another instance) and idle
// keep-alive connections close; a request that still arrives on a busy one
// finds the gateway draining (a WebSocket upgrade or a long-poll is answered
// 503 with Retry-After, an SSE stream 200 with a retry:). Meanwhile the
// gateway stops leasing, answers waiting long-polls and closes its streams
// at random points of the window, each giving its leases back. What is
// still open at the deadline (a request still sending its body, a
// connection that never sent one, a stream whose client stopped reading)
// is closed then: nothing waits for a timeout of its own (the HTTP
// server's 5 s grace for silent connections, ReadHeaderTimeout,
// BodyReadTimeout, a write deadline).
func (s *Server) shutdown(srv *http.Server) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.DrainWindow+s.cfg.ShutdownTimeout)
	defer cancel()
	// Serve returns at once; Shutdown closes the listener again, harmlessly.
	_ = s.ln.Close()
	s.gw.Drain()
	s.log.Info().Dur("drain_window", s.cfg.DrainWindow).Int("streams", s.gw.Streams()).Msg("shutting down")
	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(ctx) }()
	s.gw.WaitStreams(ctx)
	err := <-shut
	if err != nil {
		_ = srv.Close() // the deadline passed: close what is left
	}
	// Streams still open past the deadline are ended now; then the leases
	// SSE streams kept for a resume are released.
	s.gw.EndStreams()
	s.gw.Close()
	s.log.Info().Dur("took", time.Since(start)).Bool("forced", err != nil).Msg("drained")
}

// InstanceLockWait is how long a start waits for its instance id's lock:
// the previous life's connection, killed a moment ago, may not have been
// seen gone by PostgreSQL yet.
const InstanceLockWait = 10 * time.Second

// lockInstance takes the instance id's lock (queue.LockInstance), waiting
// up to InstanceLockWait for a previous life's session to end; past that
// another live instance has this id, and starting would release its leases.
func lockInstance(ctx context.Context, store *queue.Store, url string, log zerolog.Logger) (*queue.InstanceLock, error) {
	deadline := time.Now().Add(InstanceLockWait)
	for {
		l, err := store.LockInstance(ctx, url)
		if !errors.Is(err, queue.ErrInstanceInUse) {
			return l, err
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: every instance needs an --instance-id of its own "+
				"(a restarted one keeps its id, and gives back the leases its previous life held)", err)
		}
		log.Warn().Err(err).Msg("waiting for the instance id's lock")
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// releasePreviousLife gives back, before serving, the leases recorded under
// this instance's id: a previous life that was killed (or lost its
// database before its drain) left them, and their partitions would wait
// out the lease time though nobody holds them. No attempt is counted. The
// other instances' consumers are woken (NOTIFY, syncnet, lease hints), so
// they need not wait for their timers. A failure is logged: the leases
// then expire in time. Nor does it run while the instance id's lock is not
// held (its connection was lost, and it is being taken again): a twin may
// have the id meanwhile, and these would be its live leases.
func (s *Server) releasePreviousLife(ctx context.Context) {
	if !s.lock.Held() {
		s.log.Warn().Str("instance", s.instance).
			Msg("the instance id's lock is not held (its connection was lost): the leases of this instance's previous life are not released; they expire in time")
		return
	}
	freed, err := s.store.ReleaseInstanceLeases(ctx)
	if err != nil {
		s.log.Warn().Err(err).Msg("releasing the leases of this instance's previous life; they expire in time")
		return
	}
	if len(freed) == 0 {
		return
	}
	s.wakeFreed(freed)
	s.log.Info().Int("leases", len(freed)).Str("instance", s.instance).Msg("released the leases of this instance's previous life")
}

// signalReady closes Ready once the database wake source listens (at
// once without one).
func (s *Server) signalReady(ctx context.Context) {
	if s.wakeReady != nil {
		select {
		case <-s.wakeReady:
		case <-ctx.Done():
			return
		}
	}
	close(s.ready)
}

// Close releases what New acquired: for an instance that never ran, the
// syncnet socket and the gateway's push buffer (Run stops those itself);
// then the supervisor, the pool, the private PostgreSQL (stopped unless
// another herald on its data directory still uses it) and the listener.
// Run calls it; calling it again does nothing.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		if !s.ran.Load() {
			if s.node != nil {
				s.closeErr = s.node.Close()
			}
			if s.gw != nil {
				s.gw.Close()
			}
		}
		s.sup.Stop()
		if err := s.lock.Close(context.Background()); err != nil {
			s.log.Debug().Err(err).Msg("closing the instance lock's connection")
		}
		if s.db != nil {
			s.closeErr = errors.Join(s.closeErr, s.db.close(s.log))
		}
		if s.ln != nil {
			_ = s.ln.Close() // the HTTP server's Shutdown closed it already, when it ran
		}
	})
	return s.closeErr
}

// Ready is closed once Run serves and the wake source listens.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Addr is the HTTP address served.
func (s *Server) Addr() *net.TCPAddr { return s.ln.Addr().(*net.TCPAddr) }

// URL is the HTTP base URL on loopback (no trailing slash).
func (s *Server) URL() string { return fmt.Sprintf("http://127.0.0.1:%d", s.Addr().Port) }

// Instance is the name this instance records as lease owner.
func (s *Server) Instance() string { return s.instance }

// Store is the instance's queue store.
func (s *Server) Store() *queue.Store { return s.store }

// Poller is the instance's poller.
func (s *Server) Poller() *poller.Poller { return s.poller }

// Gateway is the instance's HTTP server.
func (s *Server) Gateway() *gateway.Server { return s.gw }

// Node is the syncnet node; nil without syncnet.
func (s *Server) Node() *syncnet.Node { return s.node }

// Configs is the queue config cache the store reads and syncnet updates.
func (s *Server) Configs() *queue.ConfigSnapshot { return s.configs }

// Notifier is the NOTIFY sender; nil unless Wake is notify.
func (s *Server) Notifier() *pgnotify.Notifier { return s.notifier }

// Listener is the LISTEN connection; nil unless Wake is notify.
func (s *Server) Listener() *pgnotify.Listener { return s.listener }

// Logical is the replication listener; nil unless Wake is logical.
func (s *Server) Logical() *pgnotify.Logical { return s.logical }

// SampleHygiene takes a hygiene sample now and reports it to /metrics,
// as the hygiene loop does every 30 s (a test need not wait for it).
func (s *Server) SampleHygiene(ctx context.Context) error {
	h, err := s.store.SampleHygiene(ctx)
	if err != nil {
		return err
	}
	s.hygiene(h)
	return nil
}

// Registry is the Prometheus registry /metrics shows.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// notifiers tells several wake-up channels about a push.
type notifiers []interface{ Notify(queue, partition string) }

func (ns notifiers) Notify(queue, partition string) {
	for _, n := range ns {
		if n != nil {
			n.Notify(queue, partition)
		}
	}
}

// bufferDir is the push buffer's directory. BufferDir must be usable (the
// gateway refuses to start otherwise); the default, DataDir/buffer, may not
// be (a read-only working directory, with a database URL): then this
// instance runs without a buffer, says so, and answers pushes 503 during
// push maintenance.
func bufferDir(c *Config, log zerolog.Logger) string {
	if c.BufferDir != "" {
		return c.BufferDir
	}
	if c.DataDir == "" {
		return ""
	}
	dir := c.BufferDirOrDefault()
	if err := os.MkdirAll(dir, 0o700); err != nil { // #nosec G703 -- the operator's data directory
		log.Error().Err(err).Str("dir", dir).
			Msg("no push buffer: pushes during push maintenance will be refused (503); set --buffer-dir to a writable directory")
		return ""
	}
	return dir
}

// cleanupAfter is PartitionCleanupDays as queue.Config wants it (0: never,
// which the store spells as a negative duration).
func cleanupAfter(days int) time.Duration {
	if days == 0 {
		return -1
	}
	return time.Duration(days) * 24 * time.Hour
}

// traceRetention is TraceRetention as queue.Config wants it (0: forever,
// which the store spells as a negative duration).
func traceRetention(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// wakers hands every wake-up from outside this instance (NOTIFY, the
// logical stream, syncnet) to the poller and to the follow hubs. The
// gateway exists before any wake source runs (Run).
type wakers struct{ s *Server }

func (w wakers) Wake(source, q, p string) {
	w.s.poller.Wake(source, q, p)
	if w.s.gw != nil {
		w.s.gw.WakeFollowers(q)
	}
}

func (w wakers) WakeAll(source string) {
	w.s.poller.WakeAll(source)
	if w.s.gw != nil {
		w.s.gw.WakeAllFollowers()
	}
}
