package queue

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Retention reasons (herald_retention_deleted_total{reason}).
const (
	RetentionAge       = "retention"           // older than retentionSeconds
	RetentionCompleted = "completed_retention" // acknowledged by every group, older than completedRetentionSeconds
	RetentionPartition = "partition_cleanup"   // empty, idle partitions (N counts partitions)
)

// RetentionBatchDefault is how many messages one delete statement removes:
// small enough that no statement holds its row locks for long.
const RetentionBatchDefault = 5000

// RetentionDeleted counts what a run deleted from one queue for one reason.
type RetentionDeleted struct {
	Queue  string
	Reason string
	N      int64
}

// retentionSQL deletes up to $1 messages of one rule (%s: the rule's
// condition on m, p, q), skipping rows another transaction holds and
// messages under a live lease (an ack of them must still find them). It
// returns the queue and partition of each deleted message.
const retentionSQL = `-- herald:retention_delete
WITH victims AS (
	SELECT m.partition_id, m.seq, q.name AS qname
	FROM messages m JOIN partitions p ON p.id = m.partition_id JOIN queues q ON q.id = p.queue_id
	WHERE %s
	  AND NOT EXISTS (SELECT 1 FROM consumers c WHERE c.partition_id = m.partition_id
	                  AND c.lease_expires_at > now() AND m.seq BETWEEN c.lease_from AND c.lease_to)
	LIMIT $1
	FOR UPDATE OF m SKIP LOCKED
), del AS (
	DELETE FROM messages m USING victims v
	WHERE m.partition_id = v.partition_id AND m.seq = v.seq
	RETURNING v.qname, v.partition_id
)
SELECT qname, partition_id::text, count(*) FROM del GROUP BY 1, 2`

var retentionRules = []struct{ reason, cond string }{
	{RetentionAge, `q.retention_enabled AND q.retention_seconds > 0
	  AND m.created_at < now() - make_interval(secs => q.retention_seconds)`},
	// Every consumer group of the queue is past the message (its cursor, or
	// done out of order); a queue nobody has consumed keeps everything.
	{RetentionCompleted, `q.completed_retention_seconds > 0
	  AND m.created_at < now() - make_interval(secs => q.completed_retention_seconds)
	  AND EXISTS (SELECT 1 FROM consumer_groups cg WHERE cg.queue_id = q.id)
	  AND NOT EXISTS (SELECT 1 FROM consumer_groups cg WHERE cg.queue_id = q.id AND NOT EXISTS (
	      SELECT 1 FROM consumers c WHERE c.partition_id = m.partition_id AND c.consumer_group = cg.name
	      AND (c.cursor >= m.seq OR m.seq = ANY (c.done))))`},
}

// retentionCursorsSQL moves the cursors of groups that had not reached
// messages retention deleted past them (so nothing waits for what is
// gone): up to the partition's first remaining message, or its last offset.
// A group under a live lease is left for the next run.
const retentionCursorsSQL = `-- herald:retention_cursors
UPDATE consumers c SET cursor = x.floor, attempts = 0, attempt_seq = 0,
	done = ARRAY(SELECT d FROM unnest(c.done) d WHERE d > x.floor ORDER BY d)
FROM (
	SELECT p.id, coalesce((SELECT min(m.seq) FROM messages m WHERE m.partition_id = p.id) - 1, p.last_offset) AS floor
	FROM partitions p WHERE p.id = ANY ($1::uuid[])
) x
WHERE c.partition_id = x.id AND c.cursor < x.floor
  AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= now())`

// RunRetention applies the queues' retention settings once, unless another
// instance is running it (a PostgreSQL advisory lock, held for the run):
// ran is false then. Deletes go in batches of batch (0: the default), each
// its own short transaction.
func (s *Store) RunRetention(ctx context.Context, batch int) (deleted []RetentionDeleted, ran bool, err error) {
	if batch <= 0 {
		batch = RetentionBatchDefault
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("retention: %w", err)
	}
	defer conn.Release()
	const lockKey = `hashtext('herald_retention:' || current_schema())`
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+lockKey+`)`).Scan(&ran); err != nil {
		return nil, false, fmt.Errorf("retention: taking the lock: %w", err)
	}
	if !ran {
		return nil, false, nil
	}
	defer func() {
		if _, uerr := conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(`+lockKey+`)`); uerr != nil {
			// The lock goes with the connection: drop it from the pool.
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
		}
	}()
	totals := map[[2]string]int64{}
	for _, rule := range retentionRules {
		for {
			n, parts, err := deleteBatch(ctx, conn, fmt.Sprintf(retentionSQL, rule.cond), batch, func(q string, k int64) {
				totals[[2]string{q, rule.reason}] += k
			})
			if err != nil {
				return collect(totals), true, fmt.Errorf("retention (%s): %w", rule.reason, err)
			}
			if len(parts) > 0 {
				if _, err := conn.Exec(ctx, retentionCursorsSQL, parts); err != nil {
					return collect(totals), true, fmt.Errorf("retention: moving cursors: %w", err)
				}
			}
			if n < int64(batch) {
				break
			}
		}
	}
	if s.cfg.PartitionCleanupAfter > 0 {
		if err := s.cleanPartitions(ctx, conn, func(q string) { totals[[2]string{q, RetentionPartition}]++ }); err != nil {
			return collect(totals), true, err
		}
	}
	return collect(totals), true, nil
}

// cleanPartitionsSQL deletes partitions that hold no messages and no dead
// letters and saw no push and no lease for $1 seconds. A push racing with
// it either finds the partition gone (its lock takes no row: it looks the
// partition up again and recreates it) or bumps last_push_at first, which
// the delete re-checks on the locked row.
const cleanPartitionsSQL = `-- herald:retention_partitions
DELETE FROM partitions p USING queues q
WHERE q.id = p.queue_id
  AND coalesce(p.last_push_at, p.created_at) < now() - make_interval(secs => $1)
  AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.partition_id = p.id)
  AND NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.partition_id = p.id)
  AND NOT EXISTS (SELECT 1 FROM consumers c WHERE c.partition_id = p.id
                  AND (c.lease_expires_at > now() OR c.leased_at > now() - make_interval(secs => $1)))
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

func deleteBatch(ctx context.Context, conn *pgxpool.Conn, sql string, batch int, add func(string, int64)) (int64, []string, error) {
	rows, err := conn.Query(ctx, sql, batch)
	if err != nil {
		return 0, nil, err
	}
	defer rows.Close()
	var total int64
	var parts []string
	for rows.Next() {
		var q, pid string
		var n int64
		if err := rows.Scan(&q, &pid, &n); err != nil {
			return 0, nil, err
		}
		total += n
		parts = append(parts, pid)
		add(q, n)
	}
	return total, parts, rows.Err()
}

func collect(totals map[[2]string]int64) []RetentionDeleted {
	out := make([]RetentionDeleted, 0, len(totals))
	for k, n := range totals {
		out = append(out, RetentionDeleted{Queue: k[0], Reason: k[1], N: n})
	}
	return out
}

// RetentionIntervalDefault is how often RunRetentionLoop runs.
const RetentionIntervalDefault = time.Minute

// RunRetentionLoop runs retention every interval until ctx ends, reporting
// each run that deleted something to report.
func (s *Store) RunRetentionLoop(ctx context.Context, interval time.Duration, report func([]RetentionDeleted)) error {
	if interval <= 0 {
		interval = RetentionIntervalDefault
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		start := time.Now()
		deleted, ran, err := s.RunRetention(ctx, 0)
		if err != nil && ctx.Err() == nil {
			s.log.Warn().Err(err).Msg("retention run failed")
		}
		if !ran {
			continue
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
	}
}
