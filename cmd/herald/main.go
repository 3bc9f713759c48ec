// Command herald runs the Herald server.
//
//	herald [serve]   serve the HTTP API (default)
//	herald migrate   apply migrations and exit
//	herald version   print the version
//
// Without a database URL it runs a private PostgreSQL under the data
// directory: initdb on first run, start on a free port, restart it on the
// same port if it dies (exit 1 when five restarts in a row fail), stop on
// exit.
package main

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/heraldmq/herald/gateway"
	"github.com/heraldmq/herald/internal/pgcluster"
	"github.com/heraldmq/herald/internal/shared"
	"github.com/heraldmq/herald/pgnotify"
	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/syncnet"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = ""

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && slices.Contains([]string{"--version", "-version", "-v", "-V"}, args[0]) {
		args[0] = "version"
	}
	cmd := "serve"
	if len(args) > 0 && slices.Contains([]string{"serve", "migrate", "version", "help", "demo", "produce", "health", "token"}, args[0]) {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "version":
		fmt.Fprintln(stdout, "herald", buildVersion())
		return 0
	case "help":
		usage(stdout, "serve")
		return 0
	case "token":
		switch err := runToken(args, stdout, stderr); {
		case errors.Is(err, flag.ErrHelp):
			return 0
		case err != nil:
			fmt.Fprintln(stderr, "herald token:", err)
			return 2
		}
		return 0
	case "demo", "produce", "health":
		return runTool(cmd, args, stdout, stderr)
	}
	cfg, err := parseConfig(cmd, args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "herald:", err)
		return 2
	}
	zerolog.ErrorMarshalFunc = plainError
	log := newLogger(cfg, stderr)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = serve(ctx, cmd, cfg, log)
	switch {
	case ctx.Err() != nil:
		// SIGINT or SIGTERM: a stop the operator asked for, at any stage
		// (an initdb or a migration it interrupted included).
		ev := log.Info()
		if err != nil && !errors.Is(err, context.Canceled) {
			ev = log.Warn().Err(err)
		}
		ev.Msg("herald stopped")
		return 0
	case err != nil:
		log.Error().Err(err).Msg("herald stopped")
		return 1
	}
	return 0
}

// runTool runs the demo topology, the demo producer or a health check.
func runTool(cmd string, args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := zerolog.New(zerolog.ConsoleWriter{Out: stderr, TimeFormat: time.TimeOnly}).With().Timestamp().Logger()
	var err error
	switch cmd {
	case "demo":
		var c *demoConfig
		if c, err = parseDemo(args, stderr); err == nil {
			err = demo(ctx, c, stdout, log)
		}
	case "produce":
		err = runProduce(ctx, args, stderr, log)
	case "health":
		err = runHealth(ctx, args, stderr)
	}
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case ctx.Err() != nil:
		fmt.Fprintf(stderr, "herald %s: stopped\n", cmd) // SIGINT or SIGTERM, at any stage
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "herald %s: %v\n", cmd, plainError(err))
		return 1
	}
	return 0
}

func newLogger(cfg *config, w io.Writer) zerolog.Logger {
	lvl, _ := zerolog.ParseLevel(cfg.LogLevel)
	if cfg.LogFormat == "console" || (cfg.LogFormat == "auto" && isTerminal(w)) {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger()
}

// plainError is an error as Herald logs it. A connection error from pgx
// lists every attempt; with sslmode=prefer (a URL that names no sslmode)
// the first is "tls error: server refused TLS connection", which says only
// that the server does not do TLS and hides the real cause in the next
// line: that attempt is dropped, and a single remaining one joins its line.
func plainError(err error) any {
	if err == nil {
		return nil
	}
	lines := strings.Split(err.Error(), "\n")
	kept := lines[:0:0]
	for _, l := range lines {
		if len(lines) > 2 && strings.Contains(l, "server refused TLS connection") {
			continue
		}
		kept = append(kept, l)
	}
	if len(kept) == 2 && strings.HasPrefix(kept[1], "\t") {
		return kept[0] + " " + strings.TrimSpace(kept[1])
	}
	return strings.Join(kept, "\n")
}

// isTerminal reports whether w is a person's terminal, as opposed to a file,
// a pipe, /dev/null or a log collector.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && terminal(f)
}

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// cleanupAfter is --partition-cleanup-days as queue.Config wants it (0:
// never, which the store spells as negative).
func cleanupAfter(days int) time.Duration {
	if days == 0 {
		return -1
	}
	return time.Duration(days) * 24 * time.Hour
}

// traceRetention is --trace-retention as queue.Config wants it (0: forever,
// which the store spells as negative).
func traceRetention(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// hygieneInterval is how often the storage gauges are sampled (three
// catalog queries).
const hygieneInterval = 30 * time.Second

// notifiers tells several wake-up channels about a push.
type notifiers []interface{ Notify(queue, partition string) }

func (ns notifiers) Notify(queue, partition string) {
	for _, n := range ns {
		if n != nil {
			n.Notify(queue, partition)
		}
	}
}

// bufferDir is the push buffer's directory. --buffer-dir must be usable
// (the gateway refuses to start otherwise); the default, <data-dir>/buffer,
// may not be (a read-only working directory, with --database-url): then
// this instance runs without a buffer, says so, and answers pushes 503
// during push maintenance.
func bufferDir(cfg *config, log zerolog.Logger) string {
	dir := cfg.bufferDir()
	if cfg.BufferDir != "" {
		return dir
	}
	if err := os.MkdirAll(dir, 0o700); err != nil { // #nosec G703 -- the operator's --data-dir
		log.Error().Err(err).Str("dir", dir).
			Msg("no push buffer: pushes during push maintenance will be refused (503); set --buffer-dir to a writable directory")
		return ""
	}
	return dir
}

// serve wires database, store and gateway, and runs until ctx ends.
func serve(ctx context.Context, cmd string, cfg *config, log zerolog.Logger) (err error) {
	// Ports first: a port in use is reported in a moment, before a private
	// PostgreSQL is initialized, started and migrated for nothing.
	var ln net.Listener
	if cmd == "serve" {
		if ln = cfg.listener; ln == nil {
			if ln, err = listen(cfg.Addr, "--addr", "HERALD_ADDR"); err != nil {
				return err
			}
		}
		defer func() { _ = ln.Close() }() // the server's Shutdown closes it too
		if len(cfg.SyncPeers) > 0 {
			if err := probeUDP(cfg.SyncBind); err != nil {
				return bindError(cfg.SyncBind, "--sync-bind", "HERALD_SYNC_BIND", err)
			}
		}
		if cfg.PprofAddr != "" {
			stopPprof, err := servePprof(cfg.PprofAddr, log)
			if err != nil {
				return err
			}
			defer stopPprof()
		}
	}
	dbURL := cfg.DatabaseURL
	var cluster *pgcluster.Cluster
	if dbURL == "" {
		dir, err := filepath.Abs(filepath.Join(cfg.DataDir, "postgres"))
		if err != nil {
			return fmt.Errorf("resolving data dir: %w", err)
		}
		log.Info().Str("dir", dir).Msg("no database URL: starting a private PostgreSQL")
		cluster, err = pgcluster.Start(ctx, pgcluster.Config{Dir: dir, Port: cfg.PGPort,
			Logger: log.With().Str("component", "pgcluster").Logger()})
		if err != nil {
			return err
		}
		defer func() {
			// Stop it unless another herald on the same data dir still uses it.
			rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			stopped, rerr := cluster.Release(rctx)
			if rerr != nil {
				err = errors.Join(err, fmt.Errorf("stopping private PostgreSQL: %w", rerr))
				return
			}
			log.Info().Bool("stopped", stopped).Msg("private PostgreSQL released")
		}()
		dbURL = cluster.URL()
	}

	pool, err := queue.NewPool(ctx, dbURL, int32(cfg.DBMaxConns))
	if err != nil {
		return err
	}
	defer pool.Close()
	applied, err := queue.Migrate(ctx, pool)
	if err != nil {
		return err
	}
	log.Info().Ints("applied", applied).Msg("database migrated")
	if cmd == "migrate" {
		return nil
	}
	// Restarts the private PostgreSQL if it dies; stopped before the pool
	// closes and the cluster is released.
	sup := supervise(cluster, pool, log)
	defer sup.Stop()

	port := ln.Addr().(*net.TCPAddr).Port
	instance := cfg.InstanceID
	if instance == "" {
		host, _ := os.Hostname()
		instance = fmt.Sprintf("%s:%d", host, port)
	}
	configs := shared.NewConfigCache()
	// syncnet and the poller know each other: the poller reports its
	// consumers' presence and its leases to the node, the node wakes the
	// poller; the store tells the node of partitions retention deleted.
	var node *syncnet.Node
	var encKey []byte
	if cfg.EncryptionKey != "" {
		encKey, _ = hex.DecodeString(cfg.EncryptionKey) // validated: 64 hex characters
	}
	store, err := queue.New(queue.Config{Pool: pool, InstanceID: instance, Configs: configs, Logger: log, EncryptionKey: encKey,
		PartitionCleanupAfter: cleanupAfter(cfg.PartitionCleanupDays),
		TraceRetention:        traceRetention(cfg.TraceRetention),
		OnPartitionDeleted: func(q, p string) {
			if node != nil {
				node.PartitionDeleted(q, p)
			}
		}})
	if err != nil {
		return err
	}
	if err := store.CheckEncryption(ctx); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	shared.RegisterMetrics(reg, configs, store)
	mode := poller.WakePush
	if cfg.Wake == WakePoll {
		mode = poller.WakePoll
	}
	pcfg := poller.Config{Store: store, Workers: cfg.PollWorkers, Mode: mode,
		SweepMin: cfg.SweepMin, SweepMax: cfg.SweepMax, PreflightTimeout: cfg.PreflightTimeout,
		MaxIntentions: cfg.PreflightMax, Registerer: reg, Logger: log}
	var pl *poller.Poller
	var gw *gateway.Server // the node and the listener tell it of maintenance switches
	if len(cfg.SyncPeers) > 0 {
		serverID := cfg.ServerID
		if serverID == "" {
			host, _ := os.Hostname()
			_, syncPort, _ := net.SplitHostPort(cfg.SyncBind)
			serverID = host + ":" + syncPort
		}
		scfg := syncnet.Config{Bind: cfg.SyncBind, Peers: cfg.SyncPeers, Secret: cfg.SyncSecret, ServerID: serverID, Freshness: cfg.SyncFreshness,
			Waker: syncnet.WakerFunc(func(source, q, p string) { pl.Wake(source, q, p) }), Registerer: reg, Logger: log}
		shared.Hook(&scfg, store)
		scfg.OnMaintenance = func(bool, bool) { gw.RefreshMaintenance() }
		node, err = syncnet.New(scfg)
		if err != nil {
			return err
		}
		pcfg.OnPresence = node.SetLocal
		pcfg.Hints = node
	}
	pl, err = poller.New(pcfg)
	if err != nil {
		return err
	}
	// One bound for the queue labels of the gateway's series and of
	// retention's, so both name the same queues.
	queueLabels := gateway.NewLabelLimiter(cfg.MetricsMaxQueues)
	gwCfg := gateway.Config{Store: store, Poller: pl, BodyLimit: cfg.BodyLimit, BodyReadTimeout: cfg.BodyReadTimeout, Version: buildVersion(), Instance: instance,
		AllowedOrigins: cfg.AllowedOrigins, MaxWSConnections: cfg.MaxWSConnections, MaxSSEConnections: cfg.MaxSSEConnections,
		SSEHeartbeat: cfg.SSEHeartbeat, SSEResumeGrace: cfg.SSEResumeGrace, DrainWindow: cfg.DrainWindow,
		BufferDir: bufferDir(cfg, log), BufferMaxBytes: cfg.BufferMaxBytes,
		Registry: reg, Logger: log}
	gwCfg.Metrics = gateway.MetricsConfig{Queues: queueLabels, GroupLabels: cfg.MetricsGroupLabels, Auth: cfg.MetricsAuth}
	gwCfg.SharedState = shared.Stats(configs, store, node)
	if sup != nil {
		gwCfg.Database = sup.health
	}
	if node != nil {
		gwCfg.OnQueueDeleted = node.QueueDeleted
		gwCfg.OnQueueConfigured = shared.Announce(node)
		gwCfg.OnMaintenance = node.MaintenanceSet
	}
	if cfg.authOn() {
		if gwCfg.Auth, err = newAuth(ctx, cfg, reg, log); err != nil {
			return err
		}
	}
	// The cached queue configs are read again every minute: a change whose
	// broadcast was lost heals.
	retained := shared.RetentionReporter(reg, queueLabels)
	// Table sizes, dead rows and the xmin horizon, for /metrics and a
	// warning when a transaction holds the horizon over 5 minutes.
	hygiene := shared.HygieneReporter(reg)
	runners := []func(context.Context) error{func(ctx context.Context) error {
		return store.RunConfigRefresh(ctx, queue.ConfigRefreshDefault)
	}, func(ctx context.Context) error {
		return store.RunRetentionLoop(ctx, cfg.RetentionInterval, retained)
	}, func(ctx context.Context) error {
		return store.RunHygieneLoop(ctx, hygieneInterval, hygiene)
	}}
	if cfg.Wake == WakeNotify {
		// Our pushes wake this instance directly; the NOTIFY is for the others.
		self := queue.NewID()
		ncfg := pgnotify.NotifierConfig{Pool: pool, Window: cfg.NotifyWindow, Sender: self, Registerer: reg, Logger: log}
		if node != nil {
			ncfg.Presence = node // no NOTIFY for a queue nobody subscribes to, once that is known
		}
		nt, err := pgnotify.NewNotifier(ncfg)
		if err != nil {
			return err
		}
		lcfg := pgnotify.ListenerConfig{Waker: pl, Self: self, Registerer: reg, Logger: log,
			OnState: func() { gw.RefreshMaintenance() }}
		if cfg.ListenDatabaseURL != "" {
			lcfg.URL = cfg.ListenDatabaseURL
		} else {
			lcfg.Pool = pool
		}
		ls, err := pgnotify.NewListener(lcfg)
		if err != nil {
			return err
		}
		gwCfg.Notifier = nt
		runners = append(runners, nt.Run, ls.Run)
	}
	if cfg.Wake == WakeLogical {
		lg, err := pgnotify.NewLogical(pgnotify.LogicalConfig{Pool: pool, Tables: store, Waker: pl, Registerer: reg, Logger: log})
		if err != nil {
			return err
		}
		if err := lg.Check(ctx); err != nil {
			return err
		}
		runners = append(runners, lg.Run)
	}
	if node != nil {
		// Pushes announce themselves over syncnet too, to the peers with
		// subscribers.
		gwCfg.Notifier = notifiers{gwCfg.Notifier, node}
		runners = append(runners, node.Run)
	}
	if gw, err = gateway.New(gwCfg); err != nil {
		return err
	}
	// The maintenance switches, and the push buffer's drain.
	runners = append(runners, gw.RunMaintenance)
	if err := gw.LoadMaintenance(ctx); err != nil {
		log.Warn().Err(err).Msg("reading the maintenance switches at start; they are read again every 5 s")
	}
	defer pl.Start()()
	bgCtx, stopBg := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	for _, run := range runners {
		bg.Go(func() { _ = run(bgCtx) })
	}
	defer func() {
		stopBg()
		bg.Wait()
	}()
	srv := &http.Server{Handler: gw.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info().Str("url", fmt.Sprintf("http://localhost:%d/", port)).Str("instance", instance).
		Str("version", buildVersion()).Str("wake", cfg.Wake).Msg("herald is serving")

	var fatal error // the private PostgreSQL could not be restarted: shut down, then exit 1
	select {
	case err := <-errc:
		return fmt.Errorf("serving http: %w", err)
	case <-ctx.Done():
	case fatal = <-sup.Failed():
	}
	log.Info().Dur("drain_window", cfg.DrainWindow).Int("streams", gw.Streams()).Msg("shutting down")
	// Stop leasing, close streams over the drain window (each gives its
	// leases back), then stop serving and release what SSE streams kept
	// for a resume.
	gw.Drain()
	dctx, cancelDrain := context.WithTimeout(context.Background(), cfg.DrainWindow+cfg.ShutdownTimeout)
	defer cancelDrain()
	gw.WaitStreams(dctx)
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	err = srv.Shutdown(sctx)
	gw.Close()
	if err != nil {
		_ = srv.Close()
		return errors.Join(fatal, fmt.Errorf("shutting down http: %w", err))
	}
	return fatal
}
