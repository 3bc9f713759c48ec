// Package pgnotify turns PostgreSQL notifications into wake-ups between
// Herald instances (docs/design.md, "Wake-ups").
//
//	instance A                              instance B
//	push ─▶ Notifier.Notify (no SQL)        Listener: LISTEN "herald.<schema>"
//	          │ one goroutine, per queue:      │ WaitForNotification (pinged when quiet)
//	          │ leading edge at once,          ▼
//	          │ then ≤ 1 per window ──NOTIFY──▶ Waker.Wake(queue, partition)
//	          ▼                                (after every (re)connect: WakeAll)
//	   short tx, synchronous_commit off
//
// The same channel carries StatePayload, sent by the transaction that
// switches a maintenance mode: the Listener hands it to OnState (and calls
// OnState after every connect too), and the instance reads the switches
// from the database again.
//
// A push never NOTIFYs inside its own transaction (a notifying transaction
// takes a cluster-wide lock at commit) and never per row. The Notifier
// coalesces per queue: a quiet queue is announced at once, a busy one gets at
// most one NOTIFY per window (default 20 ms). A Presence, when known, lets it
// skip queues nobody listens to. SQL producers use the push SQL function,
// which notifies itself.
//
// Logical is the other wake source (--wake logical): a temporary pgoutput
// slot streams the inserts into the messages table, so any producer's
// insert wakes its queue with no NOTIFY at all. The package speaks the
// replication protocol (pglogrepl) but writes no SQL on Herald's tables:
// the publication it reads and the queue of an inserted message's
// partition come from the queue store through the Tables interface
// (queue.Store satisfies it). What SQL stays here is the wake protocol
// itself and the server's state: LISTEN, pg_notify, current_schema (the
// channel's name), pg_notification_queue_usage (the Listener's ping) and
// SHOW wal_level (Logical.Check).
//
// Both hold a connection for good: LISTEN and the replication stream need
// a session of their own, which a transaction-mode pooler (PgBouncer
// pool_mode=transaction) cannot give. ListenerConfig.URL and
// LogicalConfig.URL (--listen-database-url) take them straight to
// PostgreSQL while the pool goes through the pooler (docs/failover.md).
//
// # Concurrency
//
// Notifier.Run, Listener.Run and Logical.Run each run on their caller's
// goroutine (internal/server's errgroup) and return when their context
// ends. Notify is safe from any goroutine and
// never blocks. Waker.Wake and WakeAll are called on the Listener's and
// Logical's own goroutine; Tables.PartitionOf on Logical's, once per
// inserted message. Listener.Do, safe from any goroutine, hands the
// Listener's goroutine a job to run on the LISTEN connection between two
// waits (the instance's members beat: its answer proves the connection
// alive, so a connection given jobs needs no ping) and waits for it.
//
// # Failures
//
// NOTIFY is an optimisation: a lost one costs latency, never a message (the
// poller's sweep finds it). The Listener reconnects with exponential
// back-off and ±10% jitter, and after every connect wakes every queue once,
// because notifications sent while it was away are gone; Logical does the
// same with a new temporary slot (the old one died with its connection, so
// a stopped instance holds no WAL back). An insert whose partition Tables
// cannot name is logged at debug and dropped: the sweep covers it. The
// channel and the publication carry the schema, so instances on different
// schemas of one database ignore each other.
package pgnotify
