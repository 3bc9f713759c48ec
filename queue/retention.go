package queue

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Retention reasons (herald_retention_deleted_total{reason}).
const (
	RetentionAge       = "retention"           // older than retentionSeconds
	RetentionTTL       = "ttl"                 // older than the queue's ttl, consumed or not
	RetentionCompleted = "completed_retention" // acknowledged by every group, older than completedRetentionSeconds
	RetentionPartition = "partition_cleanup"   // empty, idle partitions (N counts partitions)
	RetentionMaxWait   = "max_wait"            // not consumed within maxWaitTimeSeconds: moved to the DLQ
	// RetentionMaxWaitDropped: as RetentionMaxWait on a queue with
	// deadLetterQueue false: finished for the group, no dead letter kept.
	RetentionMaxWaitDropped = "max_wait_dropped"
	// RetentionMaxWaitUnread: older than maxWaitTimeSeconds on a queue no
	// consumer group has subscribed to: deleted (there is no group whose
	// dead-letter queue could take it), as the reference server does.
	RetentionMaxWaitUnread = "max_wait_unread"
)

// MaxWaitError is the dead letter's error of a message nobody consumed in
// time.
const MaxWaitError = "max wait time exceeded"

// RetentionBatchDefault is how many messages one delete statement removes:
// small enough that no statement holds its row locks for long.
const RetentionBatchDefault = 5000

// RetentionDeleted counts what a run deleted from one queue for one reason.
type RetentionDeleted struct {
	Queue  string
	Reason string
	N      int64
}

// retentionVictims is what a message m must be for retention to delete
// it: %s (the rule's condition on m, p, q) and under no live lease (an ack
// of it must still find it).
const retentionVictims = `messages m JOIN partitions p ON p.id = m.partition_id JOIN queues q ON q.id = p.queue_id
	WHERE %[1]s
	  AND NOT EXISTS (SELECT 1 FROM consumers c WHERE c.partition_id = m.partition_id
	                  AND c.lease_expires_at > now() AND m.seq BETWEEN c.lease_from AND c.lease_to)`

// retentionLockSQL locks up to $1 messages of one rule, skipping rows
// another transaction holds (a replay holds the message it puts back), and
// names the queue of each.
var retentionLockSQL = `-- herald:retention_lock
SELECT m.partition_id::text, m.seq, q.id::text FROM ` + retentionVictims + `
LIMIT $1
FOR UPDATE OF m SKIP LOCKED`

// retentionQueuesSQL share-locks the queues ($1) retention is about to
// delete from, in id order, skipping those a group's registration, seek or
// reset holds (FOR NO KEY UPDATE: groupsLockSQL, groupQueuesLockSQL) or a
// configuration: their messages wait for the next batch. Those acts place
// a group's cursors from the messages and holes they read, and retention's
// rule reads the groups' cursors: run across each other, the delete did not
// see a group registered meanwhile (and took a message it had not
// finished), and the registration still saw the message (and did not count
// its offset as finished), so the group waited on that offset forever.
// With the lock, such an act commits before the delete statement's
// snapshot (which then sees its rows) or waits for retention's commit
// (and then reads the message gone and its hole recorded). Skipping rather
// than waiting: retention already holds message locks, and it never waits
// while it holds them.
const retentionQueuesSQL = `-- herald:retention_queues
SELECT q.id::text FROM queues q WHERE q.id = ANY ($1::uuid[]) ORDER BY q.id FOR SHARE SKIP LOCKED`

// retentionDeleteSQL deletes the locked messages ($1, $2) that still
// match the rule, and returns the queue and partition of each. It is a
// statement of its own, after the locks, so its snapshot holds whatever
// committed before them: decided on the locking statement's snapshot, a
// message whose dead letter was replayed (pending for its group again)
// while that statement scanned was deleted, and the group waited on its
// offset forever. A replay that commits later waited for the lock and
// finds the message gone.
var retentionDeleteSQL = `-- herald:retention_delete
WITH victims AS (
	SELECT m.partition_id, m.seq, q.name AS qname
	FROM unnest($1::uuid[], $2::bigint[]) AS v(pid, seq) JOIN ` + strings.Replace(retentionVictims,
	"WHERE", "ON m.partition_id = v.pid AND m.seq = v.seq\n\tWHERE", 1) + `
), del AS (
	DELETE FROM messages m USING victims v
	WHERE m.partition_id = v.partition_id AND m.seq = v.seq
	RETURNING v.qname, v.partition_id, m.queue_id, m.follow_xid, m.seq
), gone AS (
	-- The highest follow position deleted, per queue and per partition:
	-- followers behind it are told of the gap (follow.go).
	INSERT INTO follow_gone AS g (scope, follow_xid, partition_id, seq)
	SELECT DISTINCT ON (x.scope) x.scope, x.follow_xid, x.partition_id, x.seq
	FROM (SELECT d.queue_id AS scope, d.follow_xid, d.partition_id, d.seq FROM del d
	      UNION ALL SELECT d.partition_id, d.follow_xid, d.partition_id, d.seq FROM del d) x
	ORDER BY x.scope, x.follow_xid DESC, x.partition_id DESC, x.seq DESC
	ON CONFLICT (scope) DO UPDATE SET follow_xid = excluded.follow_xid, partition_id = excluded.partition_id, seq = excluded.seq
	WHERE (excluded.follow_xid, excluded.partition_id, excluded.seq) > (g.follow_xid, g.partition_id, g.seq)
)
SELECT qname, partition_id::text, count(*) FROM del GROUP BY 1, 2`

// retentionHolesSQL records, after retentionDeleteSQL and in its
// transaction, the offsets it deleted ($1, $2 minus those still stored)
// that lie above their partition's first remaining message, as
// DeleteMessage does (deleteHoleSQL): completed retention takes messages
// from the middle (every group finished them out of order), and a group
// registered, sought or reset later must count them as finished
// (holesAfterStart). It forgets the holes of those partitions below their
// first remaining message: no position starts under it.
const retentionHolesSQL = `-- herald:retention_holes
WITH f AS (
	SELECT v.pid, (SELECT min(m.seq) FROM messages m WHERE m.partition_id = v.pid) AS first
	FROM (SELECT DISTINCT u.pid FROM unnest($1::uuid[]) AS u(pid)) v
), ins AS (
	INSERT INTO message_holes (partition_id, seq)
	SELECT v.pid, v.seq FROM unnest($1::uuid[], $2::bigint[]) AS v(pid, seq) JOIN f ON f.pid = v.pid
	WHERE v.seq > f.first AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.partition_id = v.pid AND m.seq = v.seq)
	ORDER BY 1, 2
	ON CONFLICT DO NOTHING
)
DELETE FROM message_holes h USING f WHERE h.partition_id = f.pid AND (f.first IS NULL OR h.seq < f.first)`

// sweepHolesSQL forgets every hole below its partition's first remaining
// message, wherever it came from: the deleters forget those of the
// partitions they delete from, but two racing (DeleteMessage and a
// retention batch) may each read the other's work uncommitted and leave
// one behind. One pass over message_holes, which holds only a few offsets
// per partition (holesAfterStart), and one index probe per partition with
// holes.
const sweepHolesSQL = `-- herald:retention_sweep_holes
WITH f AS (
	SELECT p.id, (SELECT min(m.seq) FROM messages m WHERE m.partition_id = p.id) AS first
	FROM partitions p WHERE p.id IN (SELECT h.partition_id FROM message_holes h)
)
DELETE FROM message_holes h USING f WHERE h.partition_id = f.id AND (f.first IS NULL OR h.seq < f.first)`

var retentionRules = []struct{ reason, cond string }{
	{RetentionAge, `q.retention_enabled AND q.retention_seconds > 0
	  AND m.created_at < now() - make_interval(secs => q.retention_seconds)`},
	// ttl: the message has expired, consumed or not, whatever
	// retentionEnabled says.
	{RetentionTTL, `q.ttl > 0 AND m.created_at < now() - make_interval(secs => q.ttl)`},
	// Every consumer group of the queue is past the message (its cursor, or
	// done out of order); a queue nobody has consumed keeps everything.
	{RetentionCompleted, `q.completed_retention_seconds > 0
	  AND m.created_at < now() - make_interval(secs => q.completed_retention_seconds)
	  AND EXISTS (SELECT 1 FROM consumer_groups cg WHERE cg.queue_id = q.id)
	  AND NOT EXISTS (SELECT 1 FROM consumer_groups cg WHERE cg.queue_id = q.id AND NOT EXISTS (
	      SELECT 1 FROM consumers c WHERE c.partition_id = m.partition_id AND c.consumer_group = cg.name
	      AND (c.cursor >= m.seq OR m.seq = ANY (c.done))))`},
	// maxWaitTimeSeconds on a queue no group reads yet (maxWaitSQL serves
	// the queues groups read, per group, into their dead-letter queues).
	{RetentionMaxWaitUnread, `q.max_wait_time_seconds > 0
	  AND m.created_at < now() - make_interval(secs => q.max_wait_time_seconds)
	  AND NOT EXISTS (SELECT 1 FROM consumer_groups cg WHERE cg.queue_id = q.id)`},
}

// retentionCursorsSQL moves the cursors of groups that had not reached
// messages retention deleted past them (so nothing waits for what is
// gone): up to the partition's first remaining message, or its last offset.
// A group under a live lease is left for the next run. It spans many
// partitions' rows: they are locked first in key order (lk), as pushes and
// acks lock them; updated in scan order, a multi-partition push's marking
// or an ack holding one and waiting for another deadlocked with it.
const retentionCursorsSQL = `-- herald:retention_cursors
WITH x AS (
	SELECT p.id, coalesce((SELECT min(m.seq) FROM messages m WHERE m.partition_id = p.id) - 1, p.last_offset) AS floor,
	       p.last_offset
	FROM partitions p WHERE p.id = ANY ($1::uuid[])
), lk AS (
	SELECT c.partition_id, c.consumer_group, x.floor, x.last_offset
	FROM x JOIN consumers c ON c.partition_id = x.id
	WHERE c.cursor < x.floor AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= now())
	ORDER BY c.partition_id, c.consumer_group
	FOR NO KEY UPDATE OF c
)
UPDATE consumers c SET cursor = lk.floor, attempts = 0, attempt_seq = 0,
	done = ARRAY(SELECT d FROM unnest(c.done) d WHERE d > lk.floor ORDER BY d),
	last_offset = greatest(c.last_offset, lk.last_offset) -- still ready when messages remain
FROM lk
WHERE c.partition_id = lk.partition_id AND c.consumer_group = lk.consumer_group`

// RunRetention applies the queues' retention settings once, unless another
// instance is running it: ran is false then. Deletes go in batches of batch
// (0: the default), each its own short transaction. It is a chore (the
// lock: takeChore) that is always due: its run counts as its interval's
// for RetentionRound.
func (s *Store) RunRetention(ctx context.Context, batch int) (deleted []RetentionDeleted, ran bool, err error) {
	return s.retention(ctx, batch, 0)
}

// RetentionRound runs retention unless an instance runs it now or ran it
// less than every ago: RunRetentionLoop's round, so that the instances
// together run it once per interval, not each once.
func (s *Store) RetentionRound(ctx context.Context, every time.Duration) (deleted []RetentionDeleted, ran bool, err error) {
	return s.retention(ctx, 0, every)
}

// retention is RunRetention with the chore's interval (0: always due). A
// run that fails is not recorded: the next round anywhere runs it again.
func (s *Store) retention(ctx context.Context, batch int, every time.Duration) (deleted []RetentionDeleted, ran bool, err error) {
	if batch <= 0 {
		batch = RetentionBatchDefault
	}
	ran, err = s.chore(ctx, "retention", "retention", "herald_retention:", every, func(ctx context.Context) error {
		var err error
		deleted, err = s.retentionRun(ctx, batch)
		return err
	})
	return deleted, ran, err
}

// retentionRun is one run of retention, under its lock.
func (s *Store) retentionRun(ctx context.Context, batch int) ([]RetentionDeleted, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("retention: acquiring a connection: %w", err)
	}
	defer conn.Release()
	totals := map[[2]string]int64{}
	// Idle groups first: their rows no longer hold back completed retention.
	if err := s.removeIdleGroups(ctx, conn, max(batch/100, 10), func(q string) {
		totals[[2]string{q, RetentionIdleGroup}]++
	}); err != nil {
		return collect(totals), err
	}
	for _, rule := range retentionRules {
		for {
			began := time.Now()
			n, parts, err := deleteBatch(ctx, conn, rule.cond, batch, func(q string, k int64) {
				totals[[2]string{q, rule.reason}] += k
			})
			if err != nil {
				return collect(totals), fmt.Errorf("retention (%s): %w", rule.reason, err)
			}
			if len(parts) > 0 {
				if _, err := conn.Exec(ctx, retentionCursorsSQL, parts); err != nil {
					return collect(totals), fmt.Errorf("retention: moving cursors: %w", err)
				}
				// Rows a push raced past are marked after the commit.
				if err := sendReady(ctx, conn, parts); err != nil {
					return collect(totals), fmt.Errorf("retention: %w", err)
				}
			}
			if n < int64(batch) {
				break
			}
			// Half the time for the live load: after each full batch,
			// rest as long as it took.
			select {
			case <-ctx.Done():
				return collect(totals), ctx.Err()
			case <-time.After(time.Since(began)):
			}
		}
	}
	for {
		n, err := s.expireWaiting(ctx, conn, batch, func(q, reason string, k int64) { totals[[2]string{q, reason}] += k })
		if err != nil {
			return collect(totals), err
		}
		if n == 0 {
			break
		}
	}
	if _, err := conn.Exec(ctx, sweepHolesSQL); err != nil {
		return collect(totals), fmt.Errorf("retention: forgetting holes: %w", err)
	}
	if s.cfg.PartitionCleanupAfter > 0 {
		if err := s.cleanPartitions(ctx, conn, func(q string) { totals[[2]string{q, RetentionPartition}]++ }); err != nil {
			return collect(totals), err
		}
	}
	return collect(totals), nil
}

// maxWaitSQL moves to the dead-letter queue, per consumer group, the
// messages a group has not finished that are older than the queue's
// maxWaitTimeSeconds (up to $1 per group and partition), and marks them
// done for it. A group under a live lease is left for the next run. Every
// partition of a queue counts for each group registered on it (consumer
// rows exist for all of them); a queue a group has never read from is not
// its concern yet.
const maxWaitSQL = `-- herald:retention_max_wait
WITH c AS (
	SELECT c.partition_id, c.consumer_group, c.cursor, c.done, q.id AS queue_id, q.name AS qname,
	       q.max_wait_time_seconds AS mw, q.dead_letter_queue AS keep
	FROM consumers c JOIN partitions p ON p.id = c.partition_id JOIN queues q ON q.id = p.queue_id
	WHERE q.max_wait_time_seconds > 0 AND p.last_offset > c.cursor
	  AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= now())
	ORDER BY c.partition_id, c.consumer_group
	FOR UPDATE OF c SKIP LOCKED
), expired AS (
	SELECT c.partition_id, c.consumer_group, c.queue_id, c.qname, c.keep, m.seq, m.id, m.transaction_id, m.trace_id,
	       m.producer_sub, m.payload, m.created_at
	FROM c CROSS JOIN LATERAL (
		SELECT * FROM messages m
		WHERE m.partition_id = c.partition_id AND m.seq > c.cursor AND m.seq <> ALL (c.done)
		  AND m.created_at < now() - make_interval(secs => c.mw)
		ORDER BY m.seq LIMIT $1
	) m
), ins AS (
	INSERT INTO dead_letters (queue_id, partition_id, seq, message_id, transaction_id, trace_id, producer_sub, payload,
	                          created_at, consumer_group, error, retry_count)
	SELECT queue_id, partition_id, seq, id, transaction_id, trace_id, producer_sub, payload, created_at, consumer_group,
	       '` + MaxWaitError + `', 0
	FROM expired WHERE keep -- deadLetterQueue false: dropped, finished all the same
), marks AS (
	SELECT partition_id, consumer_group, array_agg(seq) AS seqs FROM expired GROUP BY 1, 2
), upd AS (
	UPDATE consumers c SET done = ARRAY(SELECT DISTINCT d FROM unnest(c.done || mk.seqs) d ORDER BY d)
	FROM marks mk WHERE c.partition_id = mk.partition_id AND c.consumer_group = mk.consumer_group
)
SELECT qname, keep, count(*) FROM expired GROUP BY 1, 2`

// donePrefixSQL moves cursors over the done offsets that directly follow
// them (what maxWaitSQL marked), as an ack would. The rows are locked
// first in key order (lk, as retentionCursorsSQL), and how far each moves
// is counted from the locked row's own cursor and done. Only rows whose
// next offset is done are locked: locking every row with something done
// waited for each one an ack held, with nothing to move there. A row an
// ack changed meanwhile is checked again as locked (its new version), and
// how far it moves is counted from that.
const donePrefixSQL = `-- herald:retention_done_prefix
WITH lk AS (
	SELECT c.partition_id, c.consumer_group, c.cursor, c.done FROM consumers c
	WHERE cardinality(c.done) > 0 AND c.cursor + 1 = ANY (c.done)
	  AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= now())
	ORDER BY c.partition_id, c.consumer_group
	FOR NO KEY UPDATE OF c
), x AS (
	SELECT lk.partition_id, lk.consumer_group, lk.cursor + (
		SELECT count(*) FROM (SELECT d, row_number() OVER (ORDER BY d) AS rn FROM unnest(lk.done) d WHERE d > lk.cursor) y
		WHERE y.d = lk.cursor + y.rn) AS cur
	FROM lk
)
UPDATE consumers c SET cursor = x.cur,
	done = ARRAY(SELECT d FROM unnest(c.done) d WHERE d > x.cur ORDER BY d),
	attempts = CASE WHEN c.attempt_seq <= x.cur THEN 0 ELSE c.attempts END,
	attempt_seq = CASE WHEN c.attempt_seq <= x.cur THEN 0 ELSE c.attempt_seq END
FROM x
WHERE c.partition_id = x.partition_id AND c.consumer_group = x.consumer_group AND x.cur > c.cursor`

// expireWaiting runs maxWaitSQL once (then the cursor step) and reports
// how many messages it finished for their groups (dead-lettered, or
// dropped on a queue with deadLetterQueue false).
func (s *Store) expireWaiting(ctx context.Context, conn *pgxpool.Conn, batch int, add func(q, reason string, n int64)) (int64, error) {
	rows, err := conn.Query(ctx, maxWaitSQL, batch)
	if err != nil {
		return 0, fmt.Errorf("retention (max wait): %w", err)
	}
	var total int64
	for rows.Next() {
		var q string
		var keep bool
		var n int64
		if err := rows.Scan(&q, &keep, &n); err != nil {
			rows.Close()
			return 0, fmt.Errorf("retention (max wait): %w", err)
		}
		total += n
		reason := RetentionMaxWait
		if !keep {
			reason = RetentionMaxWaitDropped
		}
		add(q, reason, n)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("retention (max wait): %w", err)
	}
	if total > 0 {
		if _, err := conn.Exec(ctx, donePrefixSQL); err != nil {
			return 0, fmt.Errorf("retention (max wait): moving cursors: %w", err)
		}
		// The rows it left caught up, marked after its commit.
		if _, err := conn.Exec(ctx, repairReadySQL); err != nil {
			return 0, fmt.Errorf("retention (max wait): marking rows ready: %w", err)
		}
	}
	return total, nil
}

// cleanPartitionsSQL deletes partitions that hold no messages and no dead
// letters and saw no push and no lease for $1 seconds. A push racing with
// it either finds the partition gone (its lock takes no row: it looks the
// partition up again and recreates it) or bumps last_push_at first, which
// the delete re-checks on the locked row. The rows are locked first, in id
// order as pushes lock them, skipping those a push holds (that partition
// is not idle): deleted in scan order, one held while a multi-partition
// push held another deadlocked.
const cleanPartitionsSQL = `-- herald:retention_partitions
WITH idle AS (
	SELECT p.id FROM partitions p
	WHERE coalesce(p.last_push_at, p.created_at) < now() - make_interval(secs => $1)
	  AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.partition_id = p.id)
	  AND NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.partition_id = p.id)
	  AND NOT EXISTS (SELECT 1 FROM consumers c WHERE c.partition_id = p.id
	                  AND (c.lease_expires_at > now() OR c.leased_at > now() - make_interval(secs => $1)))
	ORDER BY p.id
	FOR UPDATE OF p SKIP LOCKED
)
DELETE FROM partitions p USING idle, queues q
WHERE p.id = idle.id AND q.id = p.queue_id
RETURNING q.name, p.name`

func (s *Store) cleanPartitions(ctx context.Context, conn *pgxpool.Conn, count func(queue string)) error {
	rows, err := conn.Query(ctx, cleanPartitionsSQL, s.cfg.PartitionCleanupAfter.Seconds())
	if err != nil {
		return fmt.Errorf("retention: deleting idle partitions: %w", err)
	}
	type qp struct{ queue, partition string }
	var gone []qp
	for rows.Next() {
		var x qp
		if err := rows.Scan(&x.queue, &x.partition); err != nil {
			rows.Close()
			return fmt.Errorf("retention: deleting idle partitions: %w", err)
		}
		gone = append(gone, x)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("retention: deleting idle partitions: %w", err)
	}
	for _, x := range gone {
		s.ForgetPartition(x.queue, x.partition)
		count(x.queue)
		if f := s.cfg.OnPartitionDeleted; f != nil {
			f(x.queue, x.partition)
		}
	}
	return nil
}

// retentionHook, set only by tests (SetRetentionHook), is called inside
// deleteBatch's transaction at each step: "locked" (the victims are
// locked, nothing deleted yet) and "deleted" (before COMMIT), so that a
// test can run a concurrent act at that very point instead of racing for
// it.
var retentionHook func(step string)

// deleteBatch deletes up to batch messages of the rule cond in one
// transaction: retentionLockSQL, retentionQueuesSQL, then
// retentionDeleteSQL with retentionHolesSQL. It reports how many it locked
// on queues it could lock (fewer than batch: the rule has no more for now,
// or a queue was busy: the next run takes its messages) and the partitions
// it deleted from.
func deleteBatch(ctx context.Context, conn *pgxpool.Conn, cond string, batch int, add func(string, int64)) (int64, []string, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := tx.Query(ctx, fmt.Sprintf(retentionLockSQL, cond), batch)
	if err != nil {
		return 0, nil, err
	}
	var pids, qids []string
	var seqs []int64
	for rows.Next() {
		var pid, qid string
		var seq int64
		if err := rows.Scan(&pid, &seq, &qid); err != nil {
			rows.Close()
			return 0, nil, err
		}
		pids, seqs, qids = append(pids, pid), append(seqs, seq), append(qids, qid)
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(pids) == 0 {
		return 0, nil, err
	}
	if pids, seqs, err = lockVictimQueues(ctx, tx, pids, seqs, qids); err != nil || len(pids) == 0 {
		return 0, nil, err
	}
	if retentionHook != nil {
		retentionHook("locked")
	}
	b := &pgx.Batch{}
	b.Queue(fmt.Sprintf(retentionDeleteSQL, cond), pids, seqs)
	b.Queue(retentionHolesSQL, pids, seqs)
	br := tx.SendBatch(ctx, b)
	rows, err = br.Query()
	if err != nil {
		_ = br.Close()
		return 0, nil, err
	}
	var parts, queues []string
	var counts []int64
	for rows.Next() {
		var q, pid string
		var n int64
		if err := rows.Scan(&q, &pid, &n); err != nil {
			rows.Close()
			_ = br.Close()
			return 0, nil, err
		}
		parts, queues, counts = append(parts, pid), append(queues, q), append(counts, n)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		_ = br.Close()
		return 0, nil, err
	}
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return 0, nil, fmt.Errorf("recording the deleted offsets: %w", err)
	}
	if err := br.Close(); err != nil {
		return 0, nil, err
	}
	if retentionHook != nil {
		retentionHook("deleted")
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, nil, err
	}
	for i, q := range queues {
		add(q, counts[i])
	}
	return int64(len(pids)), parts, nil
}

// lockVictimQueues share-locks the queues of the locked victims
// (retentionQueuesSQL) and keeps the victims of the queues it locked.
func lockVictimQueues(ctx context.Context, tx pgx.Tx, pids []string, seqs []int64, qids []string) ([]string, []int64, error) {
	distinct := slices.Compact(slices.Sorted(slices.Values(qids)))
	rows, err := tx.Query(ctx, retentionQueuesSQL, distinct)
	if err != nil {
		return nil, nil, fmt.Errorf("locking queues: %w", err)
	}
	locked, err := readIDs(rows)
	if err != nil {
		return nil, nil, fmt.Errorf("locking queues: %w", err)
	}
	if len(locked) == len(distinct) {
		return pids, seqs, nil
	}
	var keep []string
	var keepSeqs []int64
	for i, q := range qids {
		if slices.Contains(locked, q) {
			keep, keepSeqs = append(keep, pids[i]), append(keepSeqs, seqs[i])
		}
	}
	return keep, keepSeqs, nil
}

func collect(totals map[[2]string]int64) []RetentionDeleted {
	out := make([]RetentionDeleted, 0, len(totals))
	for k, n := range totals {
		out = append(out, RetentionDeleted{Queue: k[0], Reason: k[1], N: n})
	}
	return out
}

// RetentionIntervalDefault is how often retention runs (RunRetentionLoop):
// once per interval on one of the instances.
const RetentionIntervalDefault = time.Minute

// RunRetentionLoop runs a round of retention (RetentionRound) every
// interval until ctx ends, so that the instances together run it about
// once per interval, reporting each run here that deleted something to
// report.
func (s *Store) RunRetentionLoop(ctx context.Context, interval time.Duration, report func([]RetentionDeleted)) error {
	if interval <= 0 {
		interval = RetentionIntervalDefault
	}
	every(ctx, interval, func() {
		start := time.Now()
		deleted, ran, err := s.RetentionRound(ctx, interval)
		if err != nil && ctx.Err() == nil {
			s.log.Warn().Err(err).Msg("retention run failed")
		}
		if !ran {
			return
		}
		var n int64
		for _, d := range deleted {
			n += d.N
		}
		if n > 0 {
			s.log.Info().Int64("deleted", n).Dur("took", time.Since(start)).Interface("by_queue", deleted).Msg("retention")
		}
		if report != nil && len(deleted) > 0 {
			report(deleted)
		}
	})
	return nil
}
