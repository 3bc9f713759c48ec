// Package poller serves waiting consumers. Every waiting long-poll and
// every WebSocket or SSE subscription is an Intention in a registry;
// poll workers serve them in cycles that cost two database round trips
// whatever the number of waiters (docs/design.md, "The poller cycle"):
//
//	wake ──▶ dirty queues ──▶ ONE pre-flight ──▶ decide ──▶ ONE coalesced pop ──▶ Deliver
//	 ▲        (nothing dirty:     (queue.Preflight:   (pure,       (queue.PopAssigned:
//	 │         no SQL at all)      waiting counts,     lease-safe)  every lease, every
//	 │                             eligibility times)               message, one statement)
//	 └── push / ack in this instance, a new intention, an eligibility timer
//	     (lease expiry, delay, window buffer), or the adaptive safety sweep
//
// # Decisions
//
// decide gives each (partition, consumer group) to at most one intention per
// cycle: intentions naming a partition first, then the oldest; a wildcard
// intention gets the fullest eligible partitions, up to its partition count
// and until what they hold covers its credit (a batch at most from each).
// A long-poll takes one batch; a subscription may take a batch from each
// partition it claims, and Deliver gets them a batch at a time. The
// pre-flight reads per target only as many partitions as its intentions
// could take. The coalesced pop re-checks everything under row locks (FOR
// UPDATE SKIP LOCKED), so a stale pre-flight or another instance can cost a
// query, never a double delivery. Rare cases take a slower path: a group
// new to a queue is registered first (queue.EnsureConsumers gives it a
// consumer row on every partition; the queue is re-checked at once), and an
// expired lease whose attempt dead-letters a message goes through
// queue.Store.Pop.
//
// # Hand-off, and what marks a queue
//
// A push through this instance asks the Poller (queue.HandOff: Reserve,
// then Settle) which subscriptions wait for the partitions it writes, and
// leases the new messages to them in its own statement when their group
// is caught up; Settle delivers them when the commit returns. Long-polls
// are left to the cycle, which answers them with what arrived across
// partitions. A cycle holds the credit of the intentions it pops for, and
// a push the credit it reserved, so neither fills an intention past its
// credit; an intention passed over while held (or without credit) is
// marked missed and looked at when it may take again. Only what may have
// left work marks a queue: a delivery that took all it could (its
// planned budget, a partition it left messages in, an assignment that came
// back empty), credit returning to an intention whose last delivery took
// all it could or that was passed over, a push, an ack that gives messages
// back or ends a lease with messages pending, a timer. A subscription kept
// up to date therefore costs no cycle at all.
//
// # Timers instead of polling
//
// The pre-flight reports when each blocked partition becomes eligible (lease
// expiry, end of a delay or window buffer); the earliest per queue arms the
// worker's timer. The safety sweep (seed 002) is only a net for lost
// wake-ups: 100 ms after a cycle that found work, doubling while idle up to
// 5 s, ±10% jitter. In WakePoll mode push wake-ups are ignored and the
// sweep does everything, as in the reference server (a benchmark baseline).
//
// # Pause
//
// SetPaused(true) (pop maintenance) makes every cycle return before its
// first query and every push hand off to nobody; a cycle already past its
// check gives back what it leased, uncounted. SetPaused(false) marks every
// queue with waiting intentions, so subscriptions resume where they were.
//
// # Concurrency
//
// Run owns the worker goroutines (Config.Workers, default 2) and returns when
// they have stopped. A queue (or namespace pattern) hashes to one worker.
// Each worker's mutex guards its registry shard and the mutable state of its
// intentions; it is never held across a query or a Deliver call. Deliver is
// called on a worker goroutine and must not block. There is no goroutine per
// intention: a long-poll waits on its own request goroutine (Waiter).
//
// # Failures
//
// A failed query is logged and retried at the next cycle (soon: the worker
// arms its timer SweepMin ahead). A consumer that is gone when its messages
// arrive (Deliver returns false, or Waiter.Cancel hands them back) gets its
// lease released at once, without counting an attempt, so nothing waits for
// the lease to expire.
package poller
