// Package benchstat is the latency measure the benchmarks share
// (cmd/herald-bench, and bench/peers, a module of its own): the stamp a
// measured message carries (its push time and index, Stamp), a recorder of
// push → receipt latencies that counts each index once and passes over
// the warm-up (Recorder), their percentiles in milliseconds (Latencies,
// Percentile, Ms), the paced producers that push the messages on their
// schedule (Pace), and a server's counter or gauge read from its /metrics
// (Metric). It imports no Herald package and is imported by no server
// package.
//
// # Concurrency
//
// A Recorder is safe for concurrent use. Pace runs its pushes on 16
// goroutines of its own and returns once they have all returned.
//
// # Failures
//
// A payload that is not a Stamp is passed over (RecordJSON); Pace returns
// the first error a push returned, after the others have run.
package benchstat
