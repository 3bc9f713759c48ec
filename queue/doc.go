// Package queue owns Herald's schema and every SQL statement: push, pop and
// lease, ack, lease extension, configure, delete, the dead-letter queue,
// atomic transactions and traces (notes attached to messages, with their
// own retention: traces.go), and what the other packages need to know of
// the tables (the publication a logical-replication stream reads, a
// partition's names: publication.go). It knows nothing of HTTP, sockets or
// wake-ups, and imports no other Herald package (internal/layout checks
// it): the poller calls it, the wiring hands its callbacks (HandOff,
// Config.OnPartitionDeleted, Config.OnGivenUp) and its caches' news in.
//
// # Model
//
// A queue has partitions; a partition numbers its messages with dense
// offsets (1, 2, 3, …) assigned under the partition row lock, so inside a
// partition commit order equals offset order and a cursor never skips a late
// commit. Each (partition, consumer group) has one consumers row: a cursor
// (everything at or below it is done), the offsets done above it, at most one
// lease over a contiguous range, and the failed-attempt count of the first
// pending offset. Messages waiting for a group = last_offset − cursor.
//
// # Consumer rows
//
// A consumers row also holds its queue id and a copy of its partition's
// last_offset, so the pairs with work for a group are one range of the
// partial index consumers_ready (WHERE last_offset > cursor): pops and the
// pre-flight read as many entries as they want partitions, at any partition
// count. The copy is a lower bound: a row whose copy is above its cursor
// stays ready whatever the partition holds now, so a push marks (copies
// its last_offset to) only the rows that are caught up (last_offset <=
// cursor: the partial index consumers_caught_up), in its own statement (no
// pop takes anything from a caught-up row before its commit). Groups that
// are not reading cost a push nothing: their rows were marked once, by the
// first push after they left. Whoever leaves a row caught up (an ack, an
// autoAck pop, dead letters, an SSE resume, DeleteMessage, retention, a
// transaction, a seek or group reset, a DLQ replay) marks it after its
// commit (queueReady: readyRowsSQL or readySQL), in a short transaction that does not wait for its WAL flush
// and share-locks the partitions first, so a push in flight (which holds
// its partition lock until its commit) commits before the marking reads
// its last_offset: either the push's statement saw the row caught up, or
// the marking sees the push. A marking only trails committed data, so a
// crash that loses one loses no message: RepairReady, at start and in the
// hygiene loop, marks whatever lags. Counts of waiting messages read the
// partition's last_offset, not the copy; so does whether an ack that ends
// a lease leaves messages pending (AckResult.Pending), read by the ack's
// marking (readyRowsPendingSQL) rather than in its transaction. For that,
// a group registered on a queue (consumer_groups) has a row on every
// partition of it: resolvePartitions (and Configure, for the Default
// partition) gives a new partition one per group, under the queue row's
// share (update) lock; registerGroups gives groups new to a queue (any
// number, in one transaction) one per partition, under the queue row's
// no-key-update lock and the partitions' share locks, so one of the two
// always sees the other.
//
// # Idle groups
//
// A group records when a consumer last read (consumer_groups.last_seen_at:
// pre-flights, pops, registration; at most every GroupSeenEvery per
// instance, groups_idle.go). Retention removes a group idle past its
// queue's idleGroupRetentionSeconds and holding no live lease, with its
// rows (idleGroupsSQL: the queue, the group's record, then its rows in key
// order); the default group stays.
//
// # Deleted offsets
//
// A cursor moves only over a contiguous prefix of finished offsets, so an
// offset whose message is gone must count as finished, or the cursor (and
// the row's place in consumers_ready) would wait for it forever. Retention
// removes a prefix and moves the cursors past it. DeleteMessage marks the
// deleted offset done in every consumer row of the partition, under their
// locks. Both record, in the transaction that deletes, the offsets they
// take above the partition's first remaining message in message_holes
// (completed retention takes messages every group finished out of order
// from the middle), and forget the partition's holes below it; each
// retention run also sweeps stale ones. Whatever places a cursor without
// history (a group's registration, a seek, a reset) starts no lower than
// the partition's first remaining message and counts the holes above its
// start as done (holesAfterStart: two index probes of messages and a range
// of holes per partition, whatever the partition holds). A retention
// batch share-locks the queues it deletes from before its delete statement
// (skipping a locked one), and those acts lock their queues first (FOR NO
// KEY UPDATE), so they run before the batch (whose delete then sees the
// group's rows) or after it (and read the message gone and its hole),
// never across.
//
// # Follow reads
//
// Followers (follow.go) read a queue in one total order with no consumer
// row: a message's position is (follow_xid, partition, offset), where a
// push sets follow_xid to its transaction's id raised to its partition's
// previous one (under the partition row lock), so it grows along every
// partition. ReadFollow takes only messages below its snapshot's xmin (the
// barrier): their transactions have ended, and nothing can ever commit
// below it, so what a follower read is a prefix that never changes, and a
// resume after any position is exact. Messages above the barrier wait for
// the older transactions to end (Held). Retention records the highest
// position it deleted per queue and partition (follow_gone), in its delete
// statement, so a follower behind it is told of the gap (FollowBatch.Gone).
// Event ids (EncodeFollowID) are versioned and tagged with the queue.
//
// # Browsing
//
// BrowseQueues, BrowsePartitions, BrowseMessages, BrowseMessage and the
// status reads compute their figures when asked, from partition and
// consumer rows (no statistics table, no message scan where those rows
// give the answer), each in a read-only transaction planned for its
// parameters (Store.browse): one queue may hold 100 partitions and the
// next 100,000. Each statement states its cost.
//
// # Delivery
//
//	          pop                      ack completed (whole range)
//	free ────────────────▶ leased ─────────────────────────────────▶ free
//	  ▲                      │  ack failed / retry: release now, redeliver
//	  └──────────────────────┤  lease expires: counted as a failed attempt
//	                         ▼  at the next pop; past retryLimit → DLQ
//
// A message given up on (past retryLimit, acked dlq, undecryptable, past
// maxWaitTimeSeconds) is dead-lettered, or dropped (finished for its group,
// no copy) where the queue's deadLetterQueue or, past retryLimit,
// dlqAfterMaxRetries is false (deadPolicy). A message older than the
// queue's ttl is never delivered: Pop skips it, the poller's statements
// leave its row to Pop (nextExpired), a replay of its dead letter is
// refused (ReasonExpired), and retention deletes it. Every pop path ends in
// Pop for these (the poller's statements only dead-letter what fails to
// decrypt), so Pop, and for that the poller's, tell Config.OnGivenUp what
// they dead-lettered, dropped or skipped (the gateway's counters), once.
//
// # The ack contract
//
// Acks are checked against the consumers row (lockedConsumer.refusal), item
// by item, each against the state the items before it left. An ack naming a
// lease needs that lease live and the offset inside its range. An ack naming
// none never touches a live lease (it cannot prove it comes from the holder;
// a transaction's requiredLeases can); with no live lease it may finish an
// offset at or below delivered_to, the highest ever leased to the group, but
// not fail or retry it. A failed or retry item gives its offset back at
// once for the rest of the request; the lease itself ends after the last
// item. Lease durations are bounded by MaxLeaseSeconds.
//
// # Read, decide, write
//
// An ack and a pop each read the consumer rows under lock, decide with no
// database, and write what they decided. Ack (ackTx): readAck finds the
// messages and locks the rows in one round trip; decideAck applies the
// items to the rows in memory (ack_decide.go: the refusal rules above, the
// cursor over the contiguous done prefix, retries, dead letters, the
// lease's end) and returns an ackPlan; writeAck writes the dead letters
// and rows in one round trip, with COMMIT. Pop (popTx): claimPartitions
// locks the rows, expireLeases charges their expired leases (pop_decide.go),
// fetchClaimed reads the messages after the cursors, decidePop leases
// them, and one batch writes the dead letters and rows. What stays in SQL
// is what the index decides in the same round trip as the lock: which rows
// are claimable at all (popLockSQL: no live lease, past the window and the
// delay), and the coalesced pop (PopAssigned), whose lease decision is one
// statement for many consumers.
//
// # Concurrency
//
// Store is safe for concurrent use. Its memory holds only advisory caches,
// each safe on its own, none decisive: the queue configs (a ConfigCache,
// by default a ConfigSnapshot: lock-free reads, writers serialised by its
// mutex; shared with syncnet's news through the wiring), the partition ids
// (an LRU whose entries expire as they are read: no goroutine or timer),
// and the partition names (an LRU). The package starts no goroutine. Pushes and acks
// are merged by coalescers that have no goroutine either: callers take
// turns running the merged transaction (below). RunConfigRefresh,
// RunRetentionLoop and RunHygieneLoop run on the goroutine that calls
// them, until its context ends, and then return nil: the wiring starts
// each in a goroutine it owns. A HandOff's Reserve and Settle are called
// on the goroutine of the caller that runs the merged push. The in-memory
// mutexes (a coalescer's, a ConfigSnapshot's writers', the id
// generator's) are never held while taking another or calling out.
//
// Pops claim (partition, group) rows with FOR UPDATE SKIP
// LOCKED, so concurrent pops never lease the same pair and never wait. Locks
// are taken in one order: queue row, partition rows by id, consumer rows
// by (partition, group). Pushes lock their partitions (pushLockSQL)
// then their caught-up consumer rows, the markings after a commit the
// partitions (share) then the rows, acks the
// consumer rows they need, a registration the queue then its partitions
// (a retention batch locks messages, then the queues of those it may
// delete, but skips what it cannot lock, so it never waits while it
// holds them);
// every other statement that locks or writes several rows of one table
// (a lease's extension or release, retention's cursor moves, the idle
// partitions' cleanup) locks them first in key order in a CTE (ORDER BY
// … FOR NO KEY UPDATE), and a transaction (/transaction) locks every row
// its operations write before the first runs (lockTxRows), so none of
// them can deadlock another (lockorder_test.go). Pushes
// that arrive while Config.PushFlushers pushes are in flight wait and are
// merged into one transaction (coalescer); so are acks while
// Config.AckFlushers acks are in flight, but only acks on (partition, group)
// pairs no other ack of the batch touches, so that each keeps the results it
// would get alone (ackBatcher). The callers themselves run the merged
// transaction, so there is no background goroutine to start or stop.
//
// # Failures
//
// Client mistakes come back as *InputError (IsInputError); callers branch
// on a few sentinels (ErrNotFound, ErrQueueNotFound, ErrMessageNotFound,
// ErrForeign); everything else is a database fault wrapped with what was
// being done. Per-item outcomes (a duplicate push, an ack with a stale
// lease) are results, not errors. A merged push or ack transaction that
// fails is run again request by request, so one bad request cannot fail
// its neighbours; a request already taken into a merged run runs to its
// end (under a 30 s bound) even if its caller gives up. The background
// loops log a failed run and try again at the next tick. A stale cache
// entry costs a retry or a lookup, never a wrong answer: the database
// decides. A crash between a commit and its ready marking loses no
// message (RepairReady, at start and in the hygiene loop), and a payload
// that no longer decrypts is dead-lettered (DecryptError) rather than
// blocking its partition.
package queue
