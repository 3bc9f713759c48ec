// Package fanoutload is the fanout benchmarks' followers: raw SSE clients
// held by child processes of the benchmark (one process cannot hold 10,000
// sockets and the server's under a 20,000 open-file limit, and a child's
// CPU is not the server's), each reading its sockets non-blocking from a
// few epoll loops and parsing only the push's timestamp and index from
// each event. cmd/herald-bench and bench/peers (a module of its own) both
// run them (RunFollowers in a child, StartFollowers in the parent), pace
// their pushes with PaceSequential and read their fanout cases ("N@R",
// cases.go) with ParseCases. StartChildren, which starts the followers'
// children (procs.go), starts herald-bench's idle connection holders too.
// It imports no Herald package and is imported by no server package.
//
// # Concurrency
//
// In a child (RunFollowers): up to 64 goroutines dial the streams at once
// and end; then one goroutine per epoll loop (-loops, GOMAXPROCS) reads
// every stream it holds for the child's life, each follower's counters
// atomics and the latency histogram an array of atomics. In the parent
// (StartChildren, under StartFollowers): one goroutine per child reads its
// "ready" line and ends; Finish and Close run on the caller's goroutine.
//
// # Failures
//
// A stream that fails to open fails the child (it prints "error: …" and
// exits 1), which fails StartChildren (it closes the children it had
// started); an event without a stamp and an index (a ping, a connect
// reply) is skipped, one whose index is not past the last counts as out
// of order, and what never arrives as lost (Finish sums them); Close ends
// the children whatever their state.
package fanoutload
