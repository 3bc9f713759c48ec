// Package pgcluster runs a private PostgreSQL cluster in a directory.
//
// It backs `herald serve` when no database URL is given, and the throwaway
// databases of package pgtest. Start finds the server binaries (BinDir), runs
// initdb on first use, and starts a postmaster with pg_ctl that listens on
// 127.0.0.1 only, trusts every local connection, and has logical replication
// enabled. Authentication is "trust": any local user can connect as the
// postgres superuser, which suits development and tests, not shared hosts.
// Everything lives under Config.Dir:
//
//	Dir/pgdata          the cluster (initdb'd once, reused afterwards)
//	Dir/postgres.log    the server log
//	Dir/.s.PGSQL.<port> the Unix socket, unless Dir is too long for one
//	Dir/start.lock      serializes Start calls (and Release's stop)
//	Dir/users.lock      a shared flock per Cluster handle: who uses it
//
// Stop shuts the postmaster down if this handle started it. Release stops
// it if no other handle, in this process or another, still uses it (its
// shared lock on users.lock turns exclusive), whoever started it: the last
// of several servers sharing one private cluster stops it.
//
// # Running as root
//
// initdb and postgres refuse to run as root. When the process is root, they
// run as the postgres OS user, Dir is chowned to it, and Start checks up
// front that postgres can traverse Dir's parents, so that a bad location
// fails with an error naming the directory instead of a bare EACCES.
//
// # Concurrency
//
// A *Cluster is immutable apart from Stop, which runs once, and the state
// Supervise keeps (Health, and Owned turning true when it restarts the
// postmaster), which a mutex and atomics guard; all methods are safe for
// concurrent use. Several Starts on the same Dir, in one process or
// many, share one postmaster: the first one starts it and owns it (Owned
// reports true, and only its Stop shuts the server down); later ones reuse
// it. Starts on one Dir are serialized by a flock on Dir/start.lock, so
// racing first starts run initdb and pg_ctl once.
//
// # Failures
//
// A postmaster that dies without cleaning up (kill -9, OOM killer, power
// loss) leaves postmaster.pid behind. Start treats it as stale unless the
// PID it names is a live process whose working directory is this data
// directory — the postmaster chdirs there — so a PID recycled by an
// unrelated process, or a zombie, does not block a restart. Start also waits
// until the dead postmaster's children have exited, so two generations of
// processes never share the files; this relies on Linux's /proc. Start
// retries when a port it picked gets taken before postgres binds it.
//
// # Supervision
//
// pg_ctl daemonizes the postmaster, so it is not our child and there is no
// Wait to block on. Supervise polls instead, every 100 ms: the postmaster
// is down when postmaster.pid is missing or names a process that does not
// serve the data directory (the same test Start uses for a stale file, so
// a zombie counts as dead). It then restarts it on the port of the URL it
// handed out, after 0.2 s and then with doubling waits up to 5 s, under the
// start lock like Start, never running initdb; after 5 failures in a row it
// returns an error, and the caller (herald) exits so that its own
// supervisor acts. The restart goes through the same stale-pid cleanup and
// waits for the dead postmaster's children to exit, as Start does.
//
// Out of file descriptors (EMFILE, ENFILE) this process cannot read
// postmaster.pid, and that says nothing of the postmaster: it is then judged
// by its process alone, the last one seen serving, whose /proc cwd link
// readlink gives without a descriptor, and not down when that cannot be
// told either (judge). A restart attempt that fails for want of
// descriptors is retried every 5 s without counting towards the five.
//
// When several processes share Dir, all their Supervise calls notice the
// death; the first to take the start lock restarts the postmaster and the
// others find it serving and reuse it, so each counts one restart. Stop and
// Release end supervision first, so a postmaster they stop stays stopped.
//
// Errors say what was being done ("starting postgres: ...") and, when
// pg_ctl fails to start the server, include the tail of postgres.log. Start
// gives up after two minutes (or when ctx ends) rather than waiting forever
// on a postmaster that never becomes ready. If ctx is cancelled while pg_ctl
// is starting the server, the postmaster may come up anyway; the next Start
// then reuses it.
package pgcluster
