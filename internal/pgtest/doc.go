// Package pgtest provides throwaway PostgreSQL databases for tests.
//
// Each test binary gets at most one cluster, started lazily by the first
// DSN, Pool or AdminURL call in a fresh temp dir and stopped (and deleted)
// by Run after all tests finished. It is an internal/pgcluster cluster
// that trades durability for speed (fsync, synchronous_commit and
// full_page_writes off), with wal_level=logical for the logical-replication
// wake source and wal_writer_delay=10ms so that WAL reaches a replication
// stream promptly. Each call to DSN creates a
// schema named t_<16 hex digits>, returns a connection string whose
// search_path points at it, and drops it with CASCADE when the test ends, so
// tests see only their own tables even when they run in parallel.
//
// Use it from TestMain (Main is Run, then goleak, then os.Exit):
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// and in tests:
//
//	pool := pgtest.Pool(t) // unqualified table names live in the test's schema
//
// Restart stops the cluster and starts it again on the same port, for
// tests of a database that goes away; every connection of the binary
// breaks, so such tests do not run in parallel.
//
// Set TEST_DATABASE_URL to use an existing database instead of starting a
// cluster; the role needs permission to create schemas there.
//
// # Concurrency
//
// All functions are safe to call from parallel tests; the package starts
// no goroutine. The cluster start is guarded by a sync.Once, and a mutex
// guards the cluster handle and its directory, which Restart replaces and
// Run reads after the tests; schemas are independent of one another.
//
// # Failures
//
// If the PostgreSQL server binaries are missing or the cluster cannot
// start, every test that asks for a database fails with t.Fatalf and the
// reason (for missing binaries: how to install them). Tests are never
// skipped, so a broken setup cannot pass as green. A binary whose TestMain
// calls neither Run nor Main fails at its first database request: nobody
// would stop the cluster it started. A test binary killed
// before Run returns (for example by -timeout) leaves its postmaster
// running in $TMPDIR/pgtest-*; stop it with pg_ctl stop -D <dir>/pgdata.
package pgtest
