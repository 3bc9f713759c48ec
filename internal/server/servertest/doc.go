// Package servertest runs whole Herald instances (internal/server) for
// multi-instance tests: several instances on one migrated schema, each with
// the wake source under test, and the HTTP helpers those tests share.
//
// # Concurrency
//
// Start runs the instance's Run on a goroutine of its own and returns once
// the instance is Ready; Stop (or the test's cleanup) cancels it and waits
// for Run to return. Get answers on a channel from a goroutine of its own,
// cancelled when the test ends.
//
// # Failures
//
// Everything that goes wrong fails the test: an instance that does not
// start within 10 s, or stops with an error, a request that fails, an
// answer that does not come within its ceiling.
package servertest
