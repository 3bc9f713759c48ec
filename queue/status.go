package queue

import (
	"context"
	"fmt"
)

// QueueStatus is a queue's depth and its consumer groups' lag, read from
// partition and consumer rows only (no message scan): cheap enough for a
// dashboard that asks every second.
type QueueStatus struct {
	Queue      string        `json:"queue"`
	Exists     bool          `json:"exists"`
	Partitions int           `json:"partitions"`
	Pushed     int64         `json:"pushed"` // messages ever pushed (the partitions' last offsets)
	Groups     []GroupStatus `json:"groups"`
}

// GroupStatus is one consumer group's progress over a queue.
type GroupStatus struct {
	Group string `json:"group"`
	// Lag is how many pushed messages the group has not finished, over
	// every partition of the queue (since the group's registration).
	Lag int64 `json:"lag"`
	// Leased is how many of its partitions are under a live lease that
	// holds messages not finished yet (a following lease whose messages
	// are all acked stays held for the next push, and holds none).
	Leased int `json:"leased"`
}

// QueueStatus reports a queue's depth and lag per consumer group, in one
// statement.
func (s *Store) QueueStatus(ctx context.Context, name string) (*QueueStatus, error) {
	if err := ValidateName("queue", name); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `-- herald:queue_status
		WITH p AS (
			SELECT p.id, p.last_offset FROM partitions p JOIN queues q ON q.id = p.queue_id WHERE q.name = $1
		)
		SELECT '' AS grp, count(*)::int, coalesce(sum(p.last_offset), 0)::bigint, 0 FROM p
		UNION ALL
		SELECT c.consumer_group, count(*) FILTER (WHERE c.lease_expires_at > now() AND c.cursor < p.last_offset)::int,
		       sum(p.last_offset - c.cursor - cardinality(c.done))::bigint, 1
		FROM p JOIN consumers c ON c.partition_id = p.id
		GROUP BY c.consumer_group
		ORDER BY 4, 1`, name)
	if err != nil {
		return nil, fmt.Errorf("reading the status of %s: %w", name, err)
	}
	defer rows.Close()
	st := &QueueStatus{Queue: name, Groups: []GroupStatus{}}
	for rows.Next() {
		var group string
		var n, kind int
		var v int64
		if err := rows.Scan(&group, &n, &v, &kind); err != nil {
			return nil, fmt.Errorf("reading the status of %s: %w", name, err)
		}
		if kind == 0 {
			st.Partitions, st.Pushed, st.Exists = n, v, n > 0
			continue
		}
		st.Groups = append(st.Groups, GroupStatus{Group: group, Lag: v, Leased: n})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the status of %s: %w", name, err)
	}
	return st, nil
}
