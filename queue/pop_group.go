package queue

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// A pop by a group that a queue does not know yet registers it first, in a
// transaction of its own (Pop, registerGroup).

// groupMissingSQL lists the queues the request selects that do not know
// the group yet. Parameters as popFilter, $5 group.
const groupMissingSQL = `-- herald:group_missing
SELECT q.id::text FROM queues q
WHERE %s AND NOT EXISTS (SELECT 1 FROM consumer_groups g WHERE g.queue_id = q.id AND g.name = $5)`

// groupPartitionsSQL share-locks the partitions of the queues being
// registered, in id order: a push in flight commits first, so the
// registration reads its last_offset; a later push sees the new rows.
const groupPartitionsSQL = `-- herald:group_partitions
SELECT count(*) FROM (SELECT 1 FROM partitions p WHERE p.queue_id = ANY($1::uuid[]) ORDER BY p.id FOR SHARE) x`

// groupRegisterSQL records the first subscription of each (queue, group)
// pair ($1 queue ids, $2 groups, $3 subscribe-now, $4 subscribe-from) and
// gives the group a consumer row on every partition of the queue, starting
// after the messages older than its subscription, and never before the
// partition's first remaining message (retention or a delete took those
// below it: a cursor under them would wait for offsets that never come).
// Offsets deleted above the start (message_holes: DeleteMessage and
// retention record them) are finished for the new row as they are for the
// others: the ones right after the start move its cursor, the rest go into
// done. Its cost does not depend on how many messages a partition holds:
// two index probes of messages and a range of holes per partition
// (holesAfterStart); one statement registers any number of groups. It runs
// before or after a retention batch on the queue, never across: the
// queue's lock (groupsLockSQL) waits for the share lock retention holds
// while it deletes.
var groupRegisterSQL = `-- herald:group_register
WITH g AS (
	INSERT INTO consumer_groups (queue_id, name, subscribed_from, subscription_mode)
	SELECT r.qid, r.grp, CASE WHEN r.now THEN now() ELSE r.sfrom END,
	       CASE WHEN r.now THEN 'new' WHEN r.sfrom IS NOT NULL THEN 'timestamp' END
	FROM unnest($1::uuid[], $2::text[], $3::bool[], $4::timestamptz[]) AS r(qid, grp, now, sfrom)
	ORDER BY r.qid, r.grp
	ON CONFLICT DO NOTHING
	RETURNING queue_id, name, subscribed_from
)
INSERT INTO consumers (partition_id, consumer_group, queue_id, last_offset, cursor, done)
SELECT p.id, g.name, p.queue_id, p.last_offset, s.cursor, s.done
FROM partitions p JOIN g ON g.queue_id = p.queue_id
CROSS JOIN LATERAL (
	SELECT greatest(CASE WHEN g.subscribed_from IS NULL THEN 0 ELSE coalesce((
		SELECT m.seq FROM messages m WHERE m.partition_id = p.id AND m.created_at < g.subscribed_from
		ORDER BY m.seq DESC LIMIT 1), 0) END, ` + firstRemaining + `) AS start
	OFFSET 0 -- computed once, not copied into each use below
) s0
` + holesAfterStart + `
ORDER BY p.id, g.name
ON CONFLICT DO NOTHING`

// groupsLockSQL lists, for many targets at once ($1 queue names, $2
// namespaces, $3 tasks, $4 queue matches, $5 groups, one per target, as
// the pre-flight selects queues), each (target, queue) pair whose queue
// does not know the target's group, and locks those queues (FOR NO KEY
// UPDATE, which a partition's creation waits for: see resolvePartitions)
// in id order. It waits for a retention batch deleting from them, which
// skips them while it is held (deleteBatch).
const groupsLockSQL = `-- herald:groups_lock
WITH k AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
	       WITH ORDINALITY AS k(qname, ns, task, qmatch, grp, ord)
), m AS (
	SELECT k.ord, k.grp, q.id FROM k JOIN queues q ON q.name = k.qname WHERE k.qname <> ''
	UNION ALL
	SELECT k.ord, k.grp, q.id FROM k JOIN queues q
	  ON (k.ns = '' OR q.namespace = k.ns) AND (k.task = '' OR q.task = k.task) AND (k.qmatch = '' OR q.name ~ k.qmatch)
	WHERE k.qname = ''
)
SELECT m.ord, q.id::text FROM queues q JOIN m ON m.id = q.id
WHERE NOT EXISTS (SELECT 1 FROM consumer_groups g WHERE g.queue_id = q.id AND g.name = m.grp)
ORDER BY q.id
FOR NO KEY UPDATE OF q`

// registerGroups registers the pairs sel finds (groupsLockSQL's
// arguments; pick gives the subscription of target ord), in one transaction
// that takes, in order: those queues' locks, their partitions' share locks
// (a statement of its own, so that the insert after it starts with a
// snapshot holding every push committed before the locks), then the rows.
// It holds no consumer row while it waits, so a push waiting for one
// cannot deadlock with it.
func (s *Store) registerGroups(ctx context.Context, sel [5][]string, pick func(ord int) (group string, subNow bool, subFrom *time.Time)) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, groupsLockSQL, sel[0], sel[1], sel[2], sel[3], sel[4])
		if err != nil {
			return err
		}
		type pair struct{ q, g string }
		seen := map[pair]bool{}
		var qids, groups []string
		var nows []bool
		var froms []*time.Time
		var locked []string
		for rows.Next() {
			var ord int
			var qid string
			if err := rows.Scan(&ord, &qid); err != nil {
				rows.Close()
				return err
			}
			g, now, from := pick(ord - 1)
			if k := (pair{qid, g}); !seen[k] {
				seen[k] = true
				qids, groups, nows, froms = append(qids, qid), append(groups, g), append(nows, now), append(froms, from)
				locked = append(locked, qid)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil || len(qids) == 0 {
			return err
		}
		b := &pgx.Batch{}
		b.Queue(groupPartitionsSQL, locked)
		b.Queue(groupRegisterSQL, qids, groups, nows, froms)
		return tx.SendBatch(ctx, b).Close()
	})
}

// registerGroup registers req's group on the queues it selects that do not
// know it (registerGroups).
func (s *Store) registerGroup(ctx context.Context, req *PopRequest, subNow bool, subFrom *time.Time) error {
	sel := [5][]string{{req.Queue}, {req.Namespace}, {req.Task}, {req.QueueMatch}, {req.Group}}
	err := s.registerGroups(ctx, sel, func(int) (string, bool, *time.Time) { return req.Group, subNow, subFrom })
	if err != nil {
		return fmt.Errorf("registering consumer group %s: %w", req.Group, err)
	}
	// A group on a big queue has just added a row per partition: the
	// statistics may be behind. Checked on every registration (one cheap
	// read of pg_stat_user_tables): one rate-limited with the pushes' checks
	// left a pre-flight planned at 200 partitions scanning 20,000 until the
	// next check (TestPop_CachedPlansFollowTableGrowth).
	s.analyzeGrown(ctx)
	return nil
}

// readIDs collects a one-column text result.
func readIDs(rows pgx.Rows) ([]string, error) {
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, id)
	}
	rows.Close()
	return out, rows.Err()
}
