// Package server assembles one Herald instance from one Config: the
// database (a private PostgreSQL when no URL is given), the queue store,
// the poller, syncnet, the wake sources of pgnotify and the HTTP gateway.
// `herald serve`, `herald demo` and the multi-instance tests (through
// servertest) build instances with it; herald-bench and the reliability
// suite run the herald binary, which does. It holds no logic a component
// should own: it builds their Configs, connects their callbacks, and
// starts and stops them in one order.
//
// # Start and stop order
//
//	New                                   Run                      stop (Run, when ctx ends)
//	 1 listener (Config.Listener or Addr)  8 poller workers         a listener closed; gateway.Drain: no new
//	 2 private PostgreSQL (no URL)         9 loops, one errgroup:     leases, streams closed over DrainWindow;
//	 3 pool, migrations                      syncnet node, notifier, b HTTP server Shutdown alongside; what
//	 4 supervisor (private PostgreSQL)       listener | logical,      is open at DrainWindow+ShutdownTimeout
//	 5 store (encryption key checked);       config refresh,          is closed (gateway.EndStreams)
//	   the instance id's lock                retention, hygiene,    c gateway.Close: SSE resume leases released
//	 6 syncnet node and poller               maintenance            d loops cancelled, awaited (errgroup.Wait)
//	 7 wake source, connection cap,       10 the leases of the      e poller workers stopped
//	   gateway, maintenance switches read    previous life given    f supervisor, instance lock, pool,
//	                                         back, partitions woken   private PostgreSQL, listener (Close)
//	                                      11 HTTP serving; Ready
//	                                         once the wake source
//	                                         listens
//
// The loops stop after the HTTP server, so that streams draining still
// reach a working instance (acks, lease releases, NOTIFYs); the pool closes
// last. The exception is a loop that fails: the errgroup cancels the other
// loops at once, and the HTTP server is then drained and shut down without
// them (no loop returns an error while it should run today; the rule is
// for the future). New releases what it acquired when a later step fails; Close does
// the same for an instance that never ran.
//
// The syncnet node and the poller know each other (the poller reports its
// consumers' presence and leases to the node, the node wakes the poller),
// as do the gateway and the maintenance messages (the node and the LISTEN
// connection tell the gateway to re-read the switches): those callbacks
// capture the Server and read its fields, all set before Run starts
// anything that could call them.
//
// # The database changing under the instance
//
// The instance id's lock is taken again when its connection is lost; when
// it is taken on a database whose postmaster started at another time (a
// restart, a promoted standby: queue.InstanceLock.OnDatabaseChanged) the
// lease reconciler (a loop, reconcile.go) reconciles the leases of this
// instance's streams with it in one statement: what the old database
// committed and this one lost (an asynchronous standby's gap) leaves
// leases back that no stream holds (given back uncharged, partitions
// woken here and on the other instances) and deliveries held under leases
// it does not have (forgotten, their credit back). It retries until the
// database answers, and runs again while a pop begun before the change
// was under way.
//
// # Glue
//
// Neither queue nor syncnet knows the other: this package converts a
// queue's settings to and from QUEUE_CONFIG_SET (wireConfig, infoFromWire),
// points the node's callbacks at the store's caches (hook), exports the
// caches' counters (registerCacheMetrics) and the shared state the admin API
// shows (sharedState).
//
// # Concurrency
//
// Run owns every goroutine it starts: the poller's workers (stopped by the
// function Start returned), the loops (one errgroup on a context of their
// own, cancelled after the HTTP server has shut down), the HTTP server's
// Serve goroutine and the Ready signal's. The private PostgreSQL's
// supervisor goroutine is New's, stopped by Close; a JWKS key set's
// refresher (Config.AuthJWKSURL) lives as long as the ctx given to New (the
// process's, in herald serve). Accessors (Store,
// Poller, …) may be called from any goroutine once New returned.
//
// # Failures
//
// New fails on a port in use, a database that cannot be reached or
// migrated, a wrong encryption key, or unreadable auth keys; everything it
// had started is released. Run returns when ctx ends (nil), when HTTP
// serving fails, when a loop returns an error while it should be running
// (the other loops stop at once, then the rest in order), or when the private
// PostgreSQL stays down after the supervisor's restarts; the error says
// which. Errors releasing the private PostgreSQL are joined to the result.
//
// Running out of file descriptors ends none of these: New raises the soft
// open-file limit to the hard one (before the private PostgreSQL starts,
// so that it inherits it) and caps the gateway's connections below it,
// keeping a reserve for the pool, the wake-up connections and files
// (limits.go gives the formula); an accept that still fails with EMFILE or
// ENFILE is temporary to http.Server, which waits and accepts again; the
// supervisor does not take EMFILE for a dead postmaster (pgcluster); and
// no loop returns an error for a failed query or file.
package server
