package queue

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// LeaseMark says how far a consumer got through one lease on one partition:
// it received every message of the lease up to and including Through, and
// none after. Streams that cannot ack each message (SSE) resume with marks.
type LeaseMark struct {
	PartitionID string
	LeaseID     string
	Through     int64
}

// ResumeResult reports one LeaseMark.
type ResumeResult struct {
	Queue, Partition string
	// Matched is false when the lease is no longer the partition's lease
	// (it was acked, or expired and given to another consumer): nothing was
	// changed, and whatever it covered is or will be delivered again.
	Matched bool
	Acked   int // messages acknowledged by the mark
}

var resumeLockSQL = `-- herald:resume_lock
SELECT c.partition_id::text, c.cursor, c.done, coalesce(c.lease_id::text, ''),
       coalesce(c.lease_from, 0), coalesce(` + leaseEnd("c") + `, 0), c.attempts, c.attempt_seq, q.name, p.name,
       coalesce(c.lease_subject, '')
FROM (SELECT DISTINCT pid::uuid AS pid FROM unnest($1::text[]) AS k(pid)) k
JOIN consumers c ON c.partition_id = k.pid AND c.consumer_group = $2
JOIN partitions p ON p.id = c.partition_id
JOIN queues q ON q.id = p.queue_id
ORDER BY c.partition_id
FOR UPDATE OF c`

// ResumeLeases applies marks for group in one transaction: a mark whose
// lease is still the partition's lease (live or expired but not yet taken
// over) acknowledges the lease's messages up to Through and gives the rest
// back without counting an attempt, so they are delivered again at once.
// Results are in the order of marks. With a holder other than "", a mark
// of a lease leased to another subject refuses the whole call (ErrForeign):
// a resume token is its earner's.
func (s *Store) ResumeLeases(ctx context.Context, group string, marks []LeaseMark, holder string) ([]ResumeResult, error) {
	if group == "" {
		group = DefaultGroup
	}
	if err := ValidateName("consumerGroup", group); err != nil {
		return nil, err
	}
	out := make([]ResumeResult, len(marks))
	var pids []string
	for _, m := range marks {
		if ValidUUID(m.PartitionID) && ValidUUID(m.LeaseID) {
			pids = append(pids, m.PartitionID)
		}
	}
	if len(pids) == 0 {
		return out, nil
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		type row struct {
			st                        cursorState
			queue, partition, subject string
		}
		locked := map[string]*row{}
		rows, err := tx.Query(ctx, resumeLockSQL, pids, group)
		if err != nil {
			return fmt.Errorf("locking consumers: %w", err)
		}
		for rows.Next() {
			var pid string
			r := &row{}
			if err := rows.Scan(&pid, &r.st.cursor, &r.st.done, &r.st.leaseID, &r.st.leaseFrom, &r.st.leaseTo,
				&r.st.attempts, &r.st.attemptSeq, &r.queue, &r.partition, &r.subject); err != nil {
				rows.Close()
				return fmt.Errorf("locking consumers: %w", err)
			}
			locked[pid] = r
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("locking consumers: %w", err)
		}
		var u consumerUpdates
		for i, m := range marks {
			r := locked[m.PartitionID]
			if r == nil {
				continue
			}
			out[i].Queue, out[i].Partition = r.queue, r.partition
			if r.st.leaseID == "" || r.st.leaseID != m.LeaseID {
				continue
			}
			if holder != "" && r.subject != "" && r.subject != holder {
				return ErrForeign
			}
			out[i].Matched = true
			for seq := max(r.st.leaseFrom, r.st.cursor+1); seq <= min(r.st.leaseTo, m.Through); seq++ {
				if !r.st.isDone(seq) {
					r.st.markDone(seq)
					out[i].Acked++
				}
			}
			r.st.release()
			u.add(m.PartitionID, group, &r.st, -1, s.cfg.InstanceID, "")
		}
		return u.exec(ctx, tx)
	})
	if err != nil {
		return nil, err
	}
	groups := make([]string, len(pids))
	for i := range groups {
		groups[i] = group
	}
	s.markRows(context.WithoutCancel(ctx), pids, groups)
	return out, nil
}

// HeldLease is the state of one (partition, group) consumer row as a stream
// that holds messages under a lease needs it.
type HeldLease struct {
	LeaseID string // "" when no live lease
	// Lapsed: the row's lease followed its partition and has expired (its
	// consumer stopped acking); HeldLeases brought the row's copy of the
	// partition's last offset up, so the messages pushes handed that lease
	// are ready for a pop again: wake the partition.
	Lapsed bool
	cursor int64
	done   []int64
}

// Finished reports whether offset is acknowledged for the group.
func (h HeldLease) Finished(offset int64) bool {
	st := cursorState{cursor: h.cursor, done: h.done}
	return st.isDone(offset)
}

// heldLeasesSQL reads HeldLeases' rows. An expired lease that followed its
// partition (pushes handed it messages without writing the row, so the
// row's copy of last_offset may not show them) gets the copy brought up,
// as a push would have: a row another holds is skipped (its holder marks
// it). $1 partition ids, $2 group.
const heldLeasesSQL = `-- herald:held_leases
WITH lapsed AS (
	UPDATE consumers c SET last_offset = p.last_offset
	FROM partitions p
	WHERE c.partition_id = ANY($1::uuid[]) AND c.consumer_group = $2 AND p.id = c.partition_id
	  AND c.follow_lease = c.lease_id AND c.lease_expires_at <= now() AND c.last_offset < p.last_offset
	  AND c.ctid IN (SELECT c2.ctid FROM consumers c2 WHERE c2.partition_id = ANY($1::uuid[]) AND c2.consumer_group = $2
	                 AND c2.follow_lease = c2.lease_id AND c2.lease_expires_at <= now() FOR NO KEY UPDATE SKIP LOCKED)
	RETURNING c.partition_id
)
SELECT c.partition_id::text, c.cursor, c.done,
       CASE WHEN c.lease_expires_at > now() THEN coalesce(c.lease_id::text, '') ELSE '' END,
       EXISTS (SELECT 1 FROM lapsed l WHERE l.partition_id = c.partition_id)
FROM consumers c WHERE c.partition_id = ANY($1::uuid[]) AND c.consumer_group = $2`

// HeldLeases reads the live lease and the acknowledged offsets of group on
// each partition, keyed by partition id. A partition without a consumer row
// is missing from the map.
func (s *Store) HeldLeases(ctx context.Context, group string, partitionIDs []string) (map[string]HeldLease, error) {
	if group == "" {
		group = DefaultGroup
	}
	out := make(map[string]HeldLease, len(partitionIDs))
	if len(partitionIDs) == 0 {
		return out, nil
	}
	rows, err := s.pool.Query(ctx, heldLeasesSQL, partitionIDs, group)
	if err != nil {
		return nil, fmt.Errorf("reading leases: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var pid string
		var h HeldLease
		if err := rows.Scan(&pid, &h.cursor, &h.done, &h.LeaseID, &h.Lapsed); err != nil {
			return nil, fmt.Errorf("reading leases: %w", err)
		}
		out[pid] = h
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading leases: %w", err)
	}
	return out, nil
}
