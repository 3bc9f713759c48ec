// Herald-bench measures a Herald server: push → receipt latency per
// transport and wake mode, end-to-end throughput, the cost of idle
// connections, a connection ramp, cross-instance latency, the drain of
// many partitions, and the fanout of follow streams; it prints a table and writes a JSON results file with
// an HTML report beside it (--out).
//
//	herald-bench [flags] [scenario ...]
//
// Scenarios (default: all, idle first so that its memory baseline is a
// fresh server): idle, connections (a ramp: connect rate and RSS per
// connection), latency, throughput, drain, cluster (three instances,
// cross-instance latency with syncnet on and off) and fanout (--fanout
// FOLLOWERS@RATE cases: SSE followers of one queue on a fresh instance,
// single-message pushes one at a time; every follower must get every
// message in order; push → receipt latency per delivery, herald and
// PostgreSQL CPU per 1,000 deliveries, idle RSS and heap per follower;
// --fanout-cluster the same over three instances with syncnet, pushes to
// the first; --fanout-profile takes herald's CPU profile during the
// pushes). Three more run only when named: restart (--restart-partitions
// subscriptions naming a partition each hold their messages; the instance
// is restarted under them, by SIGTERM or --restart-kill; time to each
// one's first message again, with the restarted instance's CPU profile in
// --restart-profile), mesh (--mesh-instances idle instances found through
// the members table) and groups (consumer groups that come and go: the
// push cost with 0, 1,000 and 10,000 groups that read once and left, with
// the WAL per push from the private PostgreSQL or --dsn; 1,000 new groups
// subscribing at once, timed to their first message; autoAck against
// manual-ack latency at 200 msgs/s). Cluster, fanout, restart and mesh
// start their own servers. Without --url it starts
// `herald serve` (the binary next to herald-bench, or --herald) on a
// private PostgreSQL in a temporary directory and measures that process;
// with --url it measures a running server (give --pid for its memory and
// CPU). A list of --wake modes measures latency once per mode, each on a
// server of its own.
//
// # Concurrency
//
// Each scenario runs its producers, consumers and ack loops on goroutines
// of a sync.WaitGroup it waits for before it reports; the idle and
// connections scenarios hold their sockets in child processes of this
// binary (herald-bench with the holder argument: one process cannot hold
// 20,000 sockets under a common file limit), each watched by a goroutine
// that reads its "ready" line; so does fanout (the follower argument, at
// most 5,000 followers each, raw non-blocking sockets read by GOMAXPROCS
// epoll loops, no goroutine per stream, from source addresses
// 127.0.0.2-9), which answers an "end N" line on its stdin with
// its followers' counts and latency histogram. A started server is watched by a goroutine
// waiting for its exit. SIGINT or SIGTERM cancels the context every
// scenario runs under.
//
// # Failures
//
// A bad flag, scenario or --drain-partitions value exits 2 before anything
// starts. A server that does not answer /health within 2 minutes, or exits
// while starting, and any scenario's error, end the run with exit 1 and the
// scenario's name; a server it started is stopped (SIGTERM, then kill after
// 30 s) and its directory removed either way. Nothing is retried: a
// benchmark that hides a failure would report a false figure.
package main
