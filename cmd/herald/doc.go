// Herald is the server binary: a push gateway over a partitioned message
// queue in PostgreSQL.
//
//	herald [serve]   serve the HTTP API (the default command)
//	herald migrate   apply the database migrations and exit
//	herald demo      three instances with syncnet on one private
//	                 PostgreSQL, and a demo producer
//	herald produce   push a few demo messages a second
//	herald health    exit 0 when /health answers 200
//	herald token     sign a development token with --auth-secret
//	herald version   print the module version and the commit it was built from
//
// Every flag has an environment variable; a flag given wins over the
// variable, which wins over the default (config.go; herald --help prints
// the table). This package is wiring: flags and environment become the
// components' Config structs, the components are built, started and
// stopped in order, and signal.NotifyContext ends them.
//
// Without --database-url, serve runs a private PostgreSQL under the data
// directory (internal/pgcluster): initdb on first run, --pg-port or a free
// port, and a restart on the same port if it dies; on exit it is stopped
// unless another herald on the same directory still uses it.
//
// # Concurrency
//
// serve checks its ports first (the HTTP listener, the syncnet UDP port,
// pprof), then opens the database, migrates and builds the components. It
// runs each component's Run loop (config refresh, retention, storage
// hygiene, NOTIFY sender and LISTEN connection or the logical-replication
// listener, the syncnet node, the maintenance switches) on a goroutine of
// one WaitGroup, the poller beside them, the HTTP server on one more, and
// the private PostgreSQL's supervisor on its own. It waits for SIGINT or
// SIGTERM, the HTTP server failing, or the supervisor giving up; then it
// stops in this order: the gateway's drain (nothing new is leased; streams
// close at random points of --drain-window and give their leases back),
// the HTTP server's shutdown (--shutdown-timeout), the gateway's Close (what
// SSE streams kept for a resume is released), the Run loops and the poller,
// the supervisor, the pool, and last the private PostgreSQL.
//
// herald demo runs three such instances in one process, each on its own
// goroutines, and a producer.
//
// # Failures
//
// A bad flag or variable of serve, migrate or token prints the reason and
// exits 2 before anything starts; a port in use is reported before a
// database is started for nothing. A failure while starting (the database
// unreachable, a migration, the encryption key check) exits 1 once what
// had started is stopped, and a failure while serving after the shutdown
// above; SIGINT or SIGTERM exits 0 at any stage. The private
// PostgreSQL's supervisor restarts it when it dies (/health answers 503
// "restarting" meanwhile) and, after five failed attempts in a row, makes
// herald shut down and exit 1, so that its own supervisor acts. The
// maintenance switches that cannot be read at start are read again every
// 5 s.
package main
