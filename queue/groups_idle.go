package queue

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Groups that come and go: a consumer group records when one of its
// consumers last read (consumer_groups.last_seen_at), and retention
// removes, with all its rows, a group idle for longer than its queue's
// idleGroupRetentionSeconds, so that an abandoned group neither keeps its
// rows forever nor blocks completed-message retention.

// GroupSeenEvery is how often at most a group's last read is written: a
// pre-flight (every waiting subscription or long-poll is in one at least
// every sweep), a pop or a registration records it, once per this
// interval per instance, never per message.
const GroupSeenEvery = 5 * time.Minute

// RetentionIdleGroup is the reason of herald_retention_deleted_total for
// idle consumer groups removed (N counts groups).
const RetentionIdleGroup = "idle_group"

// groupSeen remembers when this instance last wrote a group's last read.
type groupSeen struct {
	mu   sync.Mutex
	last map[string]time.Time
}

// due returns the keys not written within GroupSeenEvery, and records them
// as written now.
func (g *groupSeen) due(keys []string, now time.Time) []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.last == nil {
		g.last = map[string]time.Time{}
	}
	if len(g.last) > 100000 { // bounded: forget the old ones
		for k, t := range g.last {
			if now.Sub(t) >= GroupSeenEvery {
				delete(g.last, k)
			}
		}
	}
	var out []int
	for i, k := range keys {
		if t, ok := g.last[k]; ok && now.Sub(t) < GroupSeenEvery {
			continue
		}
		g.last[k] = now
		out = append(out, i)
	}
	return out
}

// groupSeenSQL writes the last read of the groups $5 on the queues the
// selections ($1 names, $2 namespaces, $3 tasks, $4 matches) select,
// skipping those another instance wrote within the last minute.
const groupSeenSQL = `-- herald:group_seen
WITH k AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) AS k(qname, ns, task, qmatch, grp)
), m AS (
	SELECT q.id, k.grp FROM k JOIN queues q ON q.name = k.qname WHERE k.qname <> ''
	UNION
	SELECT q.id, k.grp FROM k JOIN queues q
	  ON (k.ns = '' OR q.namespace = k.ns) AND (k.task = '' OR q.task = k.task) AND (k.qmatch = '' OR q.name ~ k.qmatch)
	WHERE k.qname = ''
)
UPDATE consumer_groups g SET last_seen_at = now() FROM m
WHERE g.queue_id = m.id AND g.name = m.grp AND g.last_seen_at < now() - interval '1 minute'`

// seen records that consumers of these selections read (sel as
// groupsLockSQL's), at most every GroupSeenEvery per selection. A failure
// is logged: the next one writes it.
func (s *Store) seen(ctx context.Context, sel [5][]string) {
	keys := make([]string, len(sel[0]))
	for i := range keys {
		keys[i] = strings.Join([]string{sel[0][i], sel[1][i], sel[2][i], sel[3][i], sel[4][i]}, "\x00")
	}
	idx := s.groupSeen.due(keys, time.Now())
	if len(idx) == 0 {
		return
	}
	var due [5][]string
	for _, i := range idx {
		for j := range due {
			due[j] = append(due[j], sel[j][i])
		}
	}
	if _, err := s.pool.Exec(ctx, groupSeenSQL, due[0], due[1], due[2], due[3], due[4]); err != nil && ctx.Err() == nil {
		s.log.Warn().Err(err).Int("groups", len(idx)).Msg("recording consumer groups' last read")
	}
}

// idleGroupsSQL removes up to $1 consumer groups idle for longer than
// their queue's idle_group_retention_seconds (at least $2 seconds), with
// their consumer rows: no read recorded since, and no live lease. The
// default group (queue mode) stays. Locks: the queue row (as a
// registration or DeleteGroup takes it; a queue someone holds is skipped
// for the next run), the group's record, then its consumer rows in key
// order, as pushes and acks lock them.
const idleGroupsSQL = `-- herald:retention_idle_groups
WITH idle AS (
	SELECT g.queue_id, g.name, q.name AS qname FROM consumer_groups g JOIN queues q ON q.id = g.queue_id
	WHERE q.idle_group_retention_seconds > 0 AND g.name <> '` + DefaultGroup + `'
	  AND g.last_seen_at < now() - make_interval(secs => greatest(q.idle_group_retention_seconds, $2))
	  AND NOT EXISTS (SELECT 1 FROM partitions p JOIN consumers c ON c.partition_id = p.id AND c.consumer_group = g.name
	                  WHERE p.queue_id = g.queue_id AND c.lease_expires_at > now())
	ORDER BY g.queue_id, g.name
	LIMIT $1
	FOR NO KEY UPDATE OF q SKIP LOCKED
	FOR UPDATE OF g SKIP LOCKED
), lk AS (
	SELECT c.partition_id, c.consumer_group FROM idle
	JOIN partitions p ON p.queue_id = idle.queue_id
	JOIN consumers c ON c.partition_id = p.id AND c.consumer_group = idle.name
	ORDER BY c.partition_id, c.consumer_group
	FOR UPDATE OF c
), rows AS (
	DELETE FROM consumers c USING lk
	WHERE c.partition_id = lk.partition_id AND c.consumer_group = lk.consumer_group
)
DELETE FROM consumer_groups g USING idle
WHERE g.queue_id = idle.queue_id AND g.name = idle.name
RETURNING idle.qname`

// removeIdleGroups runs idleGroupsSQL in batches, counting the groups
// removed per queue.
func (s *Store) removeIdleGroups(ctx context.Context, q querier, batch int, add func(queue string)) error {
	for {
		rows, err := q.Query(ctx, idleGroupsSQL, batch, MinIdleGroupRetentionSeconds)
		if err != nil {
			return fmt.Errorf("retention: removing idle consumer groups: %w", err)
		}
		n := 0
		for rows.Next() {
			var qname string
			if err := rows.Scan(&qname); err != nil {
				rows.Close()
				return fmt.Errorf("retention: removing idle consumer groups: %w", err)
			}
			add(qname)
			n++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("retention: removing idle consumer groups: %w", err)
		}
		if n < batch {
			return nil
		}
	}
}
