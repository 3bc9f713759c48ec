// Package pgtest provides throwaway PostgreSQL databases for tests.
//
// Each test binary gets at most one cluster, started lazily by the first
// DSN, Pool or AdminURL call in a fresh temp dir and stopped (and deleted)
// by Run after all tests finished. It trades durability for speed (fsync,
// synchronous_commit and full_page_writes off). Each call to DSN creates a
// schema named t_<16 hex digits>, returns a connection string whose
// search_path points at it, and drops it with CASCADE when the test ends, so
// tests see only their own tables even when they run in parallel.
//
// Use it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }
//
// and in tests:
//
//	pool := pgtest.Pool(t) // unqualified table names live in the test's schema
//
// Set TEST_DATABASE_URL to use an existing database instead of starting a
// cluster; the role needs permission to create schemas there.
//
// # Concurrency
//
// All functions are safe to call from parallel tests. The cluster start is
// guarded by a sync.Once; schemas are independent of one another.
//
// # Failure handling
//
// If the PostgreSQL server binaries are missing or the cluster cannot
// start, every test that asks for a database fails with t.Fatalf and the
// reason (for missing binaries: how to install them). Tests are never
// skipped, so a broken setup cannot pass as green. A test binary killed
// before Run returns (for example by -timeout) leaves its postmaster
// running in $TMPDIR/pgtest-*; stop it with pg_ctl stop -D <dir>/pgdata.
package pgtest
