// Package poller serves waiting consumers. Every waiting long-poll and
// every WebSocket or SSE subscription is an Intention in a registry; poll
// workers serve them in cycles (docs/design.md, "The poller cycle"):
//
//	wake ──▶ dirty queues ──▶ ONE pre-flight ──▶ decide ──▶ ONE coalesced pop ──▶ Deliver
//	 ▲        (nothing dirty:     (queue.Preflight:   (pure,       (queue.PopAssigned:
//	 │         no SQL at all)      waiting counts,     lease-safe)  every lease, every
//	 │                             eligibility times)               message, one statement)
//	 │
//	 │        a push hint only ──────────────────▶ decideFast ──▶ ONE coalesced pop ──▶ Deliver
//	 │        a backlog, one subscription ──────────────────────▶ queue.PopClaim ─────▶ Deliver
//	 │
//	 └── a push or an ack in this instance, another instance's push (syncnet,
//	     pgnotify), a lease given back, a new intention, an eligibility timer
//	     (lease expiry, delay, window buffer), or the adaptive safety sweep
//
// A pre-flight cycle costs two round trips however many intentions wait on
// a target (queue or pattern, partition, group); past Config.MaxIntentions
// distinct targets a worker splits its intentions over several pre-flights.
//
// # Decisions
//
// One engine decides (decide.go), pure: the worker only gathers its input
// and carries out its answer. Every decision offers work in one order
// (preferred): intentions naming a partition first, then the others, each
// oldest first. decide works on a pre-flight: it gives each (partition,
// consumer group) to at most one intention per cycle; a wildcard
// intention gets the fullest eligible partitions (of the queues of highest
// priority first, for a namespace or task target), up to its partition
// count and until what they hold covers its credit (a batch at most from
// each). decideFast works on push hints, when the only
// news of a queue is that some of its partitions got messages: per hinted
// partition and group, the intention a cycle would pick, skipping one that may take nothing now, a group a push
// leased the partition to already, a partition another live instance
// holds by a lease hint (Config.Hints), and one a lease of this instance
// holds when only this instance's pushes woke it (Poller.heldHere: the pop
// would come back empty and the pre-flight after it say the same; the
// ack's release, told before its wake-up, looks again, and any release
// wakes it if a push was passed over: LeaseReleased); a partition whose id the store has
// not cached sends its queue to a pre-flight. The ids come from the
// store's cache (queue.Store.CachedPartitionID), which pushes through this
// instance fill and pre-flights add to (NotePartitionID); a miss costs a
// pre-flight, never a wrong lease.
//
// A long-poll takes one batch; a subscription may take a batch from each
// partition it claims, and Deliver gets them a batch at a time. The
// pre-flight reads per target only as many partitions as its intentions
// could take. Every pop re-checks everything under row locks (FOR UPDATE
// SKIP LOCKED), so a stale pre-flight, hint or cached id, or another
// instance, can cost a query, never a double delivery. Rare cases take a
// slower path: a group new to a queue is registered first
// (queue.EnsureConsumers gives it a consumer row on every partition; the
// queue is re-checked at once), and an expired lease whose attempt
// dead-letters a message goes through queue.Store.Pop.
//
// # Claims
//
// A subscription alone on its queue whose last delivery took all it could
// (the queue has a backlog) is served by queue.Store.PopClaim: one
// statement claims partitions from the queue's ready rows and leases them,
// with no pre-flight; a claim that comes back short hands the queue back to
// the pre-flight, and so does the sweep.
//
// The three serving routes (serve after a pre-flight, fastServe on push
// hints, claimServe) end in one tail, popDeliver: the pop statement, the
// credit given back, the leases of a pop whose outcome is unknown
// forgotten, each result delivered.
//
// # Hand-off, and what marks a queue
//
// A push through this instance asks the Poller (queue.HandOff: Reserve,
// then Settle) which intentions wait for the partitions it writes
// (subscriptions and long-polls of one queue), and leases the new
// messages to them in its own statement when their group is caught up;
// Settle delivers them when the push is over. A long-poll is handed off to
// once a cycle found nothing for it since it registered (or its target was
// known to have nothing waiting and nothing hinted: Intention.limited); it
// is answered by one push, one partition (its one-shot intention ends with it; from the moment it is
// leased to, Intention.answered, nothing else is, though the delivery is
// still under way), and its lease is its client's, as a pop's. A cycle holds the credit of the intentions it pops for, and
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
// Nor does a new intention pay a pre-flight on a (queue, partition, group)
// known to have nothing eligible waiting but in the partitions hinted
// since (keyState.known; not in WakePoll mode): the last pre-flight found
// nothing, or every partition it found was leased in its cycle and
// drained; any wake-up without a partition, a timer or the sweep forgets
// it, and a fast-path cycle that leaves a hinted partition to none of a
// group's intentions, or a one-shot answer that took all it could, forgets
// the target; and it is not trusted while a lease a long-poll's answer took
// here is not heard released here (keyState.leased: its client may have
// acked on another instance, giving messages back). With nothing hinted the intention waits for a wake-up or a
// push's hand-off (idle long-polls asking again when their wait ends send
// no query); with hints the fast path serves it from them, in one batch: a
// long-poll client asking again after acking a drained answer gets what
// was pushed or given back meanwhile from one pop. A key whose intentions
// are all gone lingers while it knows a target, keeping its hints, until a
// touch, the sweep, or the expiry of a lease it answered with (its timer:
// a client that never acks gets its messages at expiry, through a
// pre-flight).
//
// # Timers instead of polling
//
// The pre-flight reports when each blocked partition becomes eligible (lease
// expiry, end of a delay or window buffer); the earliest per queue arms the
// worker's timer, and so does the end of a lease hint that kept the fast
// path off a partition. The safety sweep (seed 002) is only a net for lost
// wake-ups: 100 ms after a cycle that found work, doubling while idle up to
// 5 s, ±10% jitter. In WakePoll mode push wake-ups are ignored, pushes hand
// off to nobody and the sweep does everything, as in the reference server
// (a benchmark baseline).
//
// # Pause
//
// SetPaused(true) (pop maintenance) makes every cycle return before its
// first query and every push hand off to nobody; a cycle already past its
// check gives back what it leased, uncounted (an autoAck pop, which keeps
// no lease, is delivered). SetPaused(false) marks every queue with waiting
// intentions, so subscriptions resume where they were.
//
// # Concurrency
//
// Goroutines. Run starts one goroutine per worker (Config.Workers, default
// 2) and the orphan releaser's; a lost hand-off's read-back (worker.fill)
// and an idle following lease's release run on goroutines of their own,
// started through background.go, which none starts after the poller's
// stop. Run returns once all of them have returned, after ctx ends; Start
// runs Run on one more goroutine, which its stop func waits for. A registration that
// OnPresence calls news arms three time.AfterFuncs (Config.PresenceGrace,
// 4 and 20 times it) that each mark its queue. Nothing else runs on the poller's own goroutines: there
// is no goroutine per intention (a long-poll waits on its request's
// goroutine, through a Waiter). Register, AddCredit, Wake, WakeAll,
// SetPaused and Release run on their callers' goroutines (the gateway, the
// wake sources), and Reserve and Settle on the goroutine of a push
// through the store.
//
// Mutexes. Each worker's mutex guards its registry shard (the keys hashed
// to it, their dirty marks, hints and timers) and the mutable fields of
// their intentions (credit, reserved, serving, gone, missed, limited). An
// autoAck subscription takes nothing while a pop or a push's hand-off for
// it is under way (serving, from hold or Reserve until its result is
// delivered): its cursor moved at that commit, and a second one's delivery
// could overtake the first's. A
// one-shot intention's cancel waits on the worker's condition (served, on
// that mutex) while a pop or a push's hand-off for it is under way
// (serving, from hold or Reserve until its result is delivered; a cycle
// does not end it at its deadline meanwhile): a long-poll whose wait ends
// mid-pop gets what the pop took, which with autoAck was consumed already. A Waiter's
// mutex guards its state. The rest is atomic (paused, the sequence, the
// count of namespace intentions) or a sync.Map (wake-up counts).
//
// Lock order: none is needed, because no two are ever held at once. A
// goroutine holds at most one worker's mutex (SetPaused, WakeAll, Wake and
// Intentions take them one after another), and a Waiter's mutex is taken
// with no worker's held (Waiter.Cancel withdraws the intention first).
// The one leaf: the mutex of the statements under way that lease
// (leasing.go), which Reserve takes under a worker's and which takes
// nothing.
//
// No callback and no query runs under a lock. Deliver, OnPresence, the
// LeaseHints methods and every queue.Store method (queries and the store's
// caches alike) are called with no poller mutex held; a worker snapshots
// what it needs under its mutex, decides, lets go, and only then queries
// and delivers (fastServe: ids and hints read first, then snapshot, decide
// and hold credit under the mutex, then pop and deliver). A registration
// is told to OnPresence before the intention is visible, so that its
// withdrawal is always told after it. The one exception is Intention.Hold,
// a predicate read with the intention's other state under the mutex: it
// must be a plain load that takes no lock and calls nothing. Deliver is
// called on a worker goroutine, or on a push's goroutine by Settle; two
// calls for one subscription may overlap (a cycle's and a hand-off's), each
// under its own lease. Callbacks must not block: a blocked Deliver stalls
// its worker (or the push), though never another goroutine's call into the
// poller (TestWorker_NoCallbackUnderLock checks this under -race).
//
// # Failures
//
// A failed pre-flight or coalesced pop is logged (not when the context
// ended) and retried soon: the worker arms its timer SweepMin ahead. A
// failed fast-path pop, or one that came back empty for an intention,
// sends its queue to a pre-flight at once; a failed claim hands the queue
// back to the pre-flight. A failed EnsureConsumers or dead-lettering Pop is
// logged and left to the next wake-up or sweep. Every cycle's statements
// share one timeout (10 s), so a stuck database cannot stall a worker for
// good. When Run's context ends the workers return after their current
// cycle; intentions stay registered, and long-polls are their callers' to
// answer. A consumer that is gone when its messages arrive (Deliver returns
// false, or Waiter.Cancel hands them back) gets its lease released at once
// (Release), without counting an attempt, so nothing waits for the lease
// to expire; a release that fails is logged and the lease expires in time.
// While paused, see Pause.
package poller
