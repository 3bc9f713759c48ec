// Package history is what one instance did and how it fared, kept in its
// memory: the message path records into it as it serves, the admin routes
// read it. Minutes (minutes.go) is one slot per minute for the last 24 h:
// pushes, pops and their lag, acks, dead letters, transactions, database
// errors, retention's deletions and the long-polls waiting, by queue, and
// the gauges Run samples every 2 s (sampler.go: the process's CPU and
// memory, the database pool, the Go scheduler); a reader sums the slots of
// a bucket with QueueOps.Add, queue by queue, and Slot.AddInstance, the
// instance's figures. Rates (rates.go) is each
// queue's pushes and acks in the last 30 intervals of 10 s, for the
// console's sparklines.
//
// The gateway records (its push, pop and ack paths, the error adapter's
// database faults, retention's runs through Server.RecordRetention) and
// runs the sampler (Server.RunAnalytics); admin/analytics.go answers the
// /api/v1/analytics/* routes, GET /api/v1/status's throughput and workers
// and GET /api/v1/status/rates from it. Each side imports this package,
// neither the other: the message path knows nothing of the routes that
// chart it. It imports queue only, for the shapes of what it counts.
//
// Queue names are bounded by the label function each is built with (the
// gateway's LabelLimiter), so the memory is: a queue past the bound is
// counted under one shared label.
//
// # Concurrency
//
// Every method of Minutes and Rates is safe for concurrent use (one mutex
// each, held only to add or copy); Run is one loop on its caller's
// goroutine, stopped by its context. The package starts no goroutine.
//
// # Failures
//
// Recording never fails and never blocks on I/O. A gauge the sampler cannot
// read (no /proc, no pool) is sampled as zero.
package history
