// Package benchstat is the latency measure the benchmarks share
// (cmd/herald-bench, and bench/peers, a module of its own): the stamp a
// measured message carries (its push time and index, Stamp), a recorder of
// push → receipt latencies that counts each index once and passes over
// the warm-up (Recorder), and their percentiles in milliseconds
// (Latencies, Percentile, Ms). It imports no Herald package and is
// imported by no server package. A Recorder is safe for concurrent use.
package benchstat
