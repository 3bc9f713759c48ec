// Package benchstat is the latency measure the benchmarks share
// (cmd/herald-bench, and bench/peers, a module of its own): the stamp a
// measured message carries (its push time and index, Stamp), a recorder of
// push → receipt latencies that counts each index once and passes over
// the warm-up (Recorder), their percentiles in milliseconds (Latencies,
// Percentile, Ms), the paced producers that push the messages on their
// schedule (Pace) over a pool of goroutines that calls a job for each index
// fed to it (Pool), and a server's counter or gauge read from its /metrics
// (Metric). It imports no Herald package and is imported by no server
// package.
//
// # Concurrency
//
// A Recorder is safe for concurrent use. A Pool's jobs run on its own
// goroutines, which Wait waits for; one goroutine feeds it. Pace runs its
// pushes on a Pool of 16 and returns once they have all returned.
//
// # Failures
//
// A payload that is not a Stamp is passed over (RecordJSON); Pace returns
// the first error a push returned, after the others have run, as a Pool's
// Wait returns the first error a job returned.
package benchstat
