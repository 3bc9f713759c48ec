// Package queuetest gives tests a migrated queue.Store on the test
// database of internal/pgtest, in a schema of its own: NewStore(t) builds
// it as the server does (queue.NewPool, queue.Migrate, queue.New;
// NewStoreWith adjusts its queue.Config first, for a hook), and the
// pool closes and the schema is dropped when the test ends. A package that
// uses it calls pgtest.Main from its TestMain.
//
// Building the Store as the server does means that what the server sets
// on its pool (generic plans, the statement counter, timeouts) holds in
// the tests too. It starts no goroutine; a failure to connect or migrate
// fails the test at once (t.Fatalf), never skips it.
package queuetest
