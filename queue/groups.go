package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Consumer groups as an operator sees them: list, lag, details, and the
// acts on a group's position (delete, seek, move its subscription). Every
// read comes from consumer and partition rows (a group's waiting messages
// on a partition are last_offset − cursor − cardinality(done)); only the
// ages of the oldest unconsumed messages probe messages, one index lookup
// per partition. Every write takes, in the one lock order, the queue rows
// (FOR NO KEY UPDATE, as a group's registration does, so no partition is
// created meanwhile with a row for a group being deleted) and then the
// group's consumer rows in key order.

// GroupSummary is one (group, queue) pair with consumer rows.
type GroupSummary struct {
	Group, Queue string
	// Members is how many partitions of the queue the group has a row on;
	// Lagging how many hold messages it has not finished.
	Members, Lagging int
	// MaxTimeLag is, over the lagging partitions, the age of the newest
	// message (a lower bound of the lag, read without scanning messages).
	MaxTimeLag time.Duration
	// Consumed: the group has been delivered a message on some partition
	// (its cursor may also stand where its subscription started).
	Consumed bool
	// SubscriptionMode is "new", "timestamp" or "" (from the beginning);
	// SubscribedFrom the instant it counts from (nil: the beginning).
	SubscriptionMode string
	SubscribedFrom   *time.Time
	SubscribedAt     *time.Time // when the group first read the queue
	// LastSeenAt is when a consumer of the group last read (written at
	// most every GroupSeenEvery); retention removes the group once it is
	// older than the queue's idleGroupRetentionSeconds. Nil for rows with
	// no group record.
	LastSeenAt *time.Time
	// IdleRetention is the queue's idleGroupRetentionSeconds.
	IdleRetention int
}

// groupListSQL summarizes every (group, queue) pair: one pass over the
// consumer rows, no message read.
const groupListSQL = `-- herald:group_list
SELECT c.consumer_group, q.name, count(*),
       count(*) FILTER (WHERE p.last_offset - c.cursor - cardinality(c.done) > 0),
       coalesce(max(extract(epoch FROM now() - p.last_push_at))
                FILTER (WHERE p.last_offset - c.cursor - cardinality(c.done) > 0), 0)::float8,
       bool_or(c.leased_at IS NOT NULL),
       coalesce(g.subscription_mode, ''), g.subscribed_from, g.created_at, g.last_seen_at, q.idle_group_retention_seconds
FROM consumers c
JOIN partitions p ON p.id = c.partition_id
JOIN queues q ON q.id = c.queue_id
LEFT JOIN consumer_groups g ON g.queue_id = c.queue_id AND g.name = c.consumer_group
GROUP BY c.consumer_group, q.name, g.subscription_mode, g.subscribed_from, g.created_at, g.last_seen_at,
	q.idle_group_retention_seconds
ORDER BY c.consumer_group, q.name`

// ConsumerGroups lists every (group, queue) pair with consumer rows,
// ordered by group then queue; queue mode (DefaultGroup) is listed too.
func (s *Store) ConsumerGroups(ctx context.Context) ([]GroupSummary, error) {
	rows, err := s.pool.Query(ctx, groupListSQL)
	if err != nil {
		return nil, fmt.Errorf("listing consumer groups: %w", err)
	}
	defer rows.Close()
	out := []GroupSummary{}
	for rows.Next() {
		var g GroupSummary
		var secs float64
		if err := rows.Scan(&g.Group, &g.Queue, &g.Members, &g.Lagging, &secs, &g.Consumed, &g.SubscriptionMode,
			&g.SubscribedFrom, &g.SubscribedAt, &g.LastSeenAt, &g.IdleRetention); err != nil {
			return nil, fmt.Errorf("listing consumer groups: %w", err)
		}
		g.MaxTimeLag = time.Duration(secs * float64(time.Second))
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing consumer groups: %w", err)
	}
	return out, nil
}

// PartitionLag is one partition's position for a group.
type PartitionLag struct {
	Group, Queue, Partition, PartitionID string
	// LeaseOwner is the instance holding the group's live lease here for a
	// stream, or "<instance>#pop" for a client's HTTP pop ("":
	// none); LeaseExpires its expiry.
	LeaseOwner   string
	LeaseExpires *time.Time
	// Consumed is how many messages the group has finished here (offsets
	// up to the cursor and those done above it); OffsetLag how many it has
	// not (exact: offsets are dense).
	Consumed, OffsetLag int64
	// OldestUnconsumed is when the first message the group has not
	// finished was pushed; LastConsumed when the one at its cursor was
	// (nil when unknown: none, or deleted by retention).
	OldestUnconsumed, LastConsumed *time.Time
}

// partitionLagColumns reads a PartitionLag from consumer row c, partition
// p and queue q, probing messages for the two ages.
const partitionLagColumns = `c.consumer_group AS grp, q.name AS qname, p.name AS pname, p.id::text AS pid,
       CASE WHEN c.lease_expires_at > now() THEN coalesce(c.lease_owner, '') ELSE '' END AS owner,
       CASE WHEN c.lease_expires_at > now() THEN c.lease_expires_at END AS expires,
       c.cursor + cardinality(c.done) AS consumed,
       greatest(p.last_offset - c.cursor - cardinality(c.done), 0) AS lag,
       (SELECT m.created_at FROM messages m WHERE m.partition_id = c.partition_id AND m.seq > c.cursor
        AND m.seq <> ALL (c.done) ORDER BY m.seq LIMIT 1) AS oldest,
       (SELECT m.created_at FROM messages m WHERE m.partition_id = c.partition_id AND m.seq = c.cursor) AS last_consumed`

func scanPartitionLag(row pgx.Row) (PartitionLag, error) {
	var l PartitionLag
	err := row.Scan(&l.Group, &l.Queue, &l.Partition, &l.PartitionID, &l.LeaseOwner, &l.LeaseExpires,
		&l.Consumed, &l.OffsetLag, &l.OldestUnconsumed, &l.LastConsumed)
	return l, err
}

// laggingSQL lists (partition, group) pairs whose oldest unfinished
// message is older than $1 seconds, the oldest first. It reads the consumer
// rows with work (the partial index consumers_ready) and probes one
// message per row.
var laggingSQL = `-- herald:group_lagging
SELECT * FROM (
	SELECT ` + partitionLagColumns + `
	FROM consumers c
	JOIN partitions p ON p.id = c.partition_id
	JOIN queues q ON q.id = c.queue_id
	WHERE c.last_offset > c.cursor
) x
WHERE x.oldest < now() - make_interval(secs => $1)
ORDER BY x.oldest, x.pid, x.grp
LIMIT $2 OFFSET $3`

// Lagging lists the (partition, group) pairs whose oldest unfinished
// message waited longer than minLag, the most lagging first, a page of
// limit after offset.
func (s *Store) Lagging(ctx context.Context, minLag time.Duration, limit, offset int) ([]PartitionLag, error) {
	if err := checkPage(limit, offset); err != nil {
		return nil, err
	}
	if minLag < 0 {
		return nil, inputErrorf("minLagSeconds must not be negative")
	}
	rows, err := s.pool.Query(ctx, laggingSQL, minLag.Seconds(), limit, offset)
	if err != nil {
		return nil, fmt.Errorf("listing lagging partitions: %w", err)
	}
	return collectLags(rows, "listing lagging partitions")
}

func collectLags(rows pgx.Rows, what string) ([]PartitionLag, error) {
	defer rows.Close()
	out := []PartitionLag{}
	for rows.Next() {
		l, err := scanPartitionLag(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// MaxGroupPartitions bounds GroupPartitions' answer.
const MaxGroupPartitions = 10000

// GroupPartitions lists a group's position on every partition it has a row
// on, by queue then partition name, at most MaxGroupPartitions (more is
// reported by truncated). queueName, when set, narrows to one queue.
func (s *Store) GroupPartitions(ctx context.Context, group, queueName string) (out []PartitionLag, truncated bool, err error) {
	if err := ValidateName("consumerGroup", group); err != nil {
		return nil, false, err
	}
	rows, err := s.pool.Query(ctx, `-- herald:group_partitions_read
		SELECT `+partitionLagColumns+`
		FROM consumers c
		JOIN partitions p ON p.id = c.partition_id
		JOIN queues q ON q.id = c.queue_id
		WHERE c.consumer_group = $1 AND ($2 = '' OR q.name = $2)
		ORDER BY q.name, p.name
		LIMIT $3`, group, queueName, MaxGroupPartitions+1)
	if err != nil {
		return nil, false, fmt.Errorf("reading consumer group %s: %w", group, err)
	}
	out, err = collectLags(rows, "reading consumer group "+group)
	if len(out) > MaxGroupPartitions {
		out, truncated = out[:MaxGroupPartitions], true
	}
	return out, truncated, err
}

// GroupDeleted reports a group deletion.
type GroupDeleted struct {
	Partitions      int  // consumer rows deleted (or reset, with the metadata kept)
	MetadataDeleted bool // the subscription records went too
	// Released are the live leases the deletion ended, for the poller and
	// the other instances.
	Released []ReleasedLease
}

// ReleasedLease is a live lease an admin act ended.
type ReleasedLease struct{ Queue, Partition, PartitionID, Group string }

// groupQueuesLockSQL locks the queues a group is registered on or has rows
// on ($2: one queue by name, or ” for all), in id order.
const groupQueuesLockSQL = `-- herald:group_queues_lock
SELECT q.id::text FROM queues q
WHERE ($2 = '' OR q.name = $2)
  AND (EXISTS (SELECT 1 FROM consumer_groups g WHERE g.queue_id = q.id AND g.name = $1)
       OR EXISTS (SELECT 1 FROM consumers c WHERE c.queue_id = q.id AND c.consumer_group = $1))
ORDER BY q.id
FOR NO KEY UPDATE OF q`

// groupRowsLockSQL locks the group's consumer rows on the queues $2, in
// key order, and tells which hold a live lease.
const groupRowsLockSQL = `-- herald:group_rows_lock
SELECT c.partition_id::text, p.name, q.name, c.lease_expires_at > now() AND c.lease_id IS NOT NULL
FROM consumers c JOIN partitions p ON p.id = c.partition_id JOIN queues q ON q.id = c.queue_id
WHERE c.consumer_group = $1 AND c.queue_id = ANY ($2::uuid[])
ORDER BY c.partition_id, c.consumer_group
FOR UPDATE OF c`

// placeConsumers moves consumer rows to the cursor and done set of a
// subquery x (with its partition's last_offset): no lease, nothing
// attempted, and only deliveries made afterwards ackable without their
// lease (delivered_to). Group resets and seeks both end this way. The
// offsets a move forward passes over are recorded (seek_from, seek_to]
// (migration 0018), joined to the last move's range when no ack moved the
// cursor between them: an ack under a lease the move ended may not pass
// for a harmless repeat there (lockedConsumer.refusal). A move back trims
// the range to the new position, the offsets above it being no longer done.
const placeConsumers = `UPDATE consumers c SET cursor = x.cursor, done = x.done, delivered_to = x.cursor, attempts = 0, attempt_seq = 0,
	lease_id = NULL, lease_owner = NULL, lease_expires_at = NULL, lease_from = NULL, lease_to = NULL,
	last_offset = greatest(c.last_offset, x.last_offset),
	seek_from = CASE WHEN x.cursor <= c.cursor THEN least(c.seek_from, x.cursor)
	                 WHEN c.seek_to = c.cursor AND c.seek_to > c.seek_from THEN c.seek_from ELSE c.cursor END,
	seek_to = CASE WHEN x.cursor <= c.cursor THEN least(c.seek_to, x.cursor) ELSE x.cursor END`

// groupResetSQL puts the group's rows on queues $2 back where its
// subscription starts (as a first read would: after the messages older
// than subscribed_from, or at the beginning), with no lease and nothing
// done or attempted.
var groupResetSQL = `-- herald:group_reset
` + placeConsumers + `
FROM (
	SELECT c2.partition_id, p.last_offset, s.cursor, s.done
	FROM consumers c2
	JOIN partitions p ON p.id = c2.partition_id
	LEFT JOIN consumer_groups g ON g.queue_id = c2.queue_id AND g.name = c2.consumer_group
	CROSS JOIN LATERAL (SELECT greatest(CASE WHEN g.subscribed_from IS NULL THEN 0 ELSE coalesce((
		SELECT m.seq FROM messages m WHERE m.partition_id = p.id AND m.created_at < g.subscribed_from
		ORDER BY m.seq DESC LIMIT 1), 0) END, ` + firstRemaining + `) AS start OFFSET 0) s0
	` + holesAfterStart + `
	WHERE c2.consumer_group = $1 AND c2.queue_id = ANY ($2::uuid[])
) x
WHERE c.partition_id = x.partition_id AND c.consumer_group = $1
RETURNING c.partition_id::text`

// firstRemaining is the offset before partition p's first remaining
// message (its last offset when none remains): a position below it would
// wait for messages retention or a delete removed.
const firstRemaining = `coalesce((SELECT min(m.seq) FROM messages m WHERE m.partition_id = p.id) - 1, p.last_offset)`

// holesAfterStart turns a start offset (s0.start) on partition p into a
// consumer row's cursor and done: the offsets after the start recorded as
// deleted (message_holes) count as finished, the ones directly after the
// start moving the cursor. Every offset deleted above the partition's
// first remaining message is recorded there, by DeleteMessage and by
// retention, in the transaction that deletes it, and a start never lies
// below that message (firstRemaining), so the holes are every offset after
// the start with no message. One index range of the holes: no message is
// read per offset, and the holes are few (below).
//
// The holes are few. Completed retention takes a message from the middle
// only when every group has finished it, and DeleteMessage marks it done
// for every group, so a hole above the first remaining message lies in
// the done set of every group that has not finished that message: never
// more of them than the largest done set of those groups. (Age retention
// deletes by creation time, out of offset order only across pushes that
// committed in another order than they began.)
const holesAfterStart = `CROSS JOIN LATERAL (
	SELECT s0.start + count(*) FILTER (WHERE h.seq = s0.start + h.rn) AS cursor,
	       coalesce(array_agg(h.seq ORDER BY h.seq) FILTER (WHERE h.seq <> s0.start + h.rn), '{}') AS done
	FROM (SELECT h.seq, row_number() OVER (ORDER BY h.seq) AS rn
	      FROM message_holes h WHERE h.partition_id = p.id AND h.seq > s0.start) h
) s`

// DeleteGroup forgets group's position on one queue (queueName) or on all
// (” ): its consumer rows and their leases go. With deleteMetadata its
// subscription records go too, so its next read registers it afresh with
// that read's subscription; without, its rows are put back where its
// subscription starts, so its next read starts there again. Messages are
// untouched. Deleting a group that has nothing is not an error.
func (s *Store) DeleteGroup(ctx context.Context, group, queueName string, deleteMetadata bool) (*GroupDeleted, error) {
	if err := ValidateName("consumerGroup", group); err != nil {
		return nil, err
	}
	res := &GroupDeleted{MetadataDeleted: deleteMetadata}
	var reset []string // the partitions of the rows a reset placed
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		qids, rowsTouched, released, err := lockGroup(ctx, tx, group, queueName)
		if err != nil || len(qids) == 0 {
			return err
		}
		res.Partitions, res.Released = rowsTouched, released
		if !deleteMetadata {
			rows, err := tx.Query(ctx, groupResetSQL, group, qids)
			if err != nil {
				return err
			}
			reset, err = readIDs(rows)
			return err
		}
		b := &pgx.Batch{}
		b.Queue(`DELETE FROM consumers WHERE consumer_group = $1 AND queue_id = ANY ($2::uuid[])`, group, qids)
		b.Queue(`DELETE FROM consumer_groups WHERE name = $1 AND queue_id = ANY ($2::uuid[])`, group, qids)
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return nil, fmt.Errorf("deleting consumer group %s: %w", group, err)
	}
	s.markPlaced(ctx, reset, group)
	return res, nil
}

// lockGroup takes the locks of an act on group's rows (queues, then rows)
// and reports the queues, how many rows, and the live leases among them.
func lockGroup(ctx context.Context, tx pgx.Tx, group, queueName string) (qids []string, n int, released []ReleasedLease, err error) {
	rows, err := tx.Query(ctx, groupQueuesLockSQL, group, queueName)
	if err != nil {
		return nil, 0, nil, err
	}
	if qids, err = readIDs(rows); err != nil || len(qids) == 0 {
		return nil, 0, nil, err
	}
	rows, err = tx.Query(ctx, groupRowsLockSQL, group, qids)
	if err != nil {
		return nil, 0, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var r ReleasedLease
		var live *bool
		if err := rows.Scan(&r.PartitionID, &r.Partition, &r.Queue, &live); err != nil {
			return nil, 0, nil, err
		}
		n++
		if live != nil && *live {
			r.Group = group
			released = append(released, r)
		}
	}
	return qids, n, released, rows.Err()
}

// SeekResult reports a seek.
type SeekResult struct {
	Partitions int // rows moved
	Released   []ReleasedLease
	// MovedTo is, for a one-partition seek, when the message the cursor
	// now stands on was pushed (nil: none).
	MovedTo *time.Time
}

// ErrNotFound: the queue, partition or group named does not exist.
var ErrNotFound = errors.New("not found")

// seekSQL moves the cursors of the locked rows of group $1 on queue $2
// (partition $4 only, when not ”) to the end ($3 NULL) or after the last
// message pushed at or before $3; nothing stays done, attempted or leased,
// and only deliveries made after the seek may be acked without their lease
// (delivered_to). Partitions with no message are left alone by a seek to
// the end. A position never stands below a message retention or a delete
// removed, and offsets deleted from the middle after it count as done
// (firstRemaining, holesAfterStart), or the group would wait for them.
// Completed retention's delete and the seek run one after the other, never
// across (the queue row's lock: see deleteBatch).
var seekSQL = `-- herald:group_seek
` + placeConsumers + `
FROM (
	SELECT c2.partition_id, p.last_offset, s.cursor, s.done
	FROM consumers c2 JOIN partitions p ON p.id = c2.partition_id JOIN queues q ON q.id = c2.queue_id
	CROSS JOIN LATERAL (SELECT greatest(CASE WHEN $3::timestamptz IS NULL THEN p.last_offset ELSE coalesce((
		SELECT m.seq FROM messages m WHERE m.partition_id = p.id AND m.created_at <= $3
		ORDER BY m.seq DESC LIMIT 1), 0) END, ` + firstRemaining + `) AS start OFFSET 0) s0
	` + holesAfterStart + `
	WHERE c2.consumer_group = $1 AND q.name = $2 AND ($4 = '' OR p.name = $4)
	  AND ($3::timestamptz IS NOT NULL OR p.last_offset > 0)
) x
WHERE c.partition_id = x.partition_id AND c.consumer_group = $1
RETURNING c.partition_id::text, (SELECT m.created_at FROM messages m WHERE m.partition_id = c.partition_id AND m.seq = c.cursor)`

// Seek moves group's position on queueName: to the end of every partition
// (to nil) or to just after the last message pushed at or before *to, so
// the messages after it are delivered again. partition, when set, narrows
// it to one partition (ErrNotFound when the queue or partition does not
// exist). Only partitions the group already has a row on move; every moved
// row loses its lease (its holder's acks are refused; the messages are
// delivered again).
func (s *Store) Seek(ctx context.Context, group, queueName, partition string, to *time.Time) (*SeekResult, error) {
	if err := errors.Join(ValidateName("consumerGroup", group), ValidateName("queue", queueName)); err != nil {
		return nil, err
	}
	if partition != "" {
		if err := ValidateName("partition", partition); err != nil {
			return nil, err
		}
		var exists bool
		if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM partitions p JOIN queues q ON q.id = p.queue_id
			WHERE q.name = $1 AND p.name = $2)`, queueName, partition).Scan(&exists); err != nil {
			return nil, fmt.Errorf("seeking: %w", err)
		}
		if !exists {
			return nil, ErrNotFound
		}
	}
	res := &SeekResult{}
	var moved []string
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		moved = moved[:0]
		qids, _, released, err := lockGroup(ctx, tx, group, queueName)
		if err != nil || len(qids) == 0 {
			return err
		}
		for _, r := range released {
			if partition == "" || r.Partition == partition {
				res.Released = append(res.Released, r)
			}
		}
		rows, err := tx.Query(ctx, seekSQL, group, queueName, to, partition)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var pid string
			var at *time.Time
			if err := rows.Scan(&pid, &at); err != nil {
				return err
			}
			moved = append(moved, pid)
			res.Partitions++
			res.MovedTo = at
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("seeking consumer group %s on %s: %w", group, queueName, err)
	}
	s.markPlaced(ctx, moved, group)
	return res, nil
}

// markPlaced marks, after the commit of a seek or a group reset, the rows
// of group it placed on the partitions pids: a push in flight meanwhile may
// have read a row as ready (before the move) and left it alone, while the
// move read the partition before that push's commit, leaving the row
// caught up with a message after it. The marking waits for such a push
// (queueReady), so a waiting consumer is served at once, not at the next
// repair.
func (s *Store) markPlaced(ctx context.Context, pids []string, group string) {
	groups := make([]string, len(pids))
	for i := range groups {
		groups[i] = group
	}
	s.markRows(context.WithoutCancel(ctx), pids, groups)
}

// SetSubscription moves the start of group's subscription on every queue
// it is registered on to from (mode "timestamp"). Cursors do not move: it
// counts where the group has no position yet (a deletion keeping the
// metadata, then a read). It reports how many queues changed.
func (s *Store) SetSubscription(ctx context.Context, group string, from time.Time) (int, error) {
	if err := ValidateName("consumerGroup", group); err != nil {
		return 0, err
	}
	tag, err := s.pool.Exec(ctx, `-- herald:group_subscription
		UPDATE consumer_groups SET subscribed_from = $2, subscription_mode = 'timestamp' WHERE name = $1`, group, from)
	if err != nil {
		return 0, fmt.Errorf("moving the subscription of %s: %w", group, err)
	}
	return int(tag.RowsAffected()), nil
}
