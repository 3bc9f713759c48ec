package queue

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// DeleteResult is what DeleteMessage removed.
type DeleteResult struct {
	Queue, Partition string
	// Message: the message row was deleted (false when only dead letters
	// of a message already gone were).
	Message bool
	// DeadLetters deleted with it.
	DeadLetters int64
	// Leases are the live leases that covered the message; each holder's
	// ack of it now answers "Message not found".
	Leases []CoveredLease
}

// CoveredLease is a live lease over a deleted message.
type CoveredLease struct {
	Group, LeaseID string
	// Released: the message was the last unfinished one of the lease,
	// which therefore ended; Pending then says whether the group has more
	// waiting on the partition.
	Released, Pending bool
}

// deleteLockSQL takes the partition (NO KEY UPDATE, as a push does: a
// group's registration, which share-locks the partitions it gives rows
// to, waits for the delete, so its new rows see the message gone and the
// hole recorded; a queue deletion waits too) and then every consumer row
// of it, in key order as acks lock them, so that no pop, ack or retention
// run changes a cursor while the message goes. It reads the partition's
// last_offset, not the rows' copies (a lower bound: a push leaves the row
// of a group that is behind alone), so that a lease the delete ends says
// exactly whether messages wait after it; no push runs on the partition
// while it is locked. $1 partition id.
var deleteLockSQL = `-- herald:delete_message_lock
WITH part AS (
	SELECT p.id, p.name, p.queue_id, p.last_offset FROM partitions p WHERE p.id = $1::uuid FOR NO KEY UPDATE
)
SELECT q.name, part.name, c.consumer_group, c.cursor, c.done, coalesce(c.lease_id::text, ''),
       coalesce(c.lease_expires_at > now(), false), coalesce(c.lease_from, 0), coalesce(` + leaseEnd("c") + `, 0),
       c.attempts, c.attempt_seq, part.last_offset
FROM part JOIN queues q ON q.id = part.queue_id
LEFT JOIN LATERAL (
	SELECT * FROM consumers c WHERE c.partition_id = part.id ORDER BY c.consumer_group FOR UPDATE
) c ON true
ORDER BY c.consumer_group`

// deleteRowsSQL deletes the message and its dead letters (by offset, or by
// transaction id when the message is gone already). $1 partition id, $2
// transaction id.
const deleteRowsSQL = `-- herald:delete_message
WITH m AS (
	DELETE FROM messages m WHERE m.partition_id = $1::uuid AND m.transaction_id = $2 RETURNING m.seq
), d AS (
	DELETE FROM dead_letters d
	WHERE d.partition_id = $1::uuid
	  AND (d.seq = (SELECT m.seq FROM m) OR (NOT EXISTS (SELECT 1 FROM m) AND d.transaction_id = $2))
	RETURNING 1
)
SELECT (SELECT m.seq FROM m), (SELECT count(*) FROM d)`

// deleteHoleSQL records offset $2 of partition $1 as deleted, unless it
// lies below the partition's first remaining message, and forgets the
// recorded ones that do (a registration starts after those anyway): the
// table holds only the holes between remaining messages.
const deleteHoleSQL = `-- herald:delete_message_hole
WITH lo AS (
	SELECT min(m.seq) AS first FROM messages m WHERE m.partition_id = $1::uuid
), ins AS (
	INSERT INTO message_holes (partition_id, seq) SELECT $1::uuid, $2::bigint FROM lo WHERE $2::bigint > lo.first
	ON CONFLICT DO NOTHING
)
DELETE FROM message_holes h USING lo WHERE h.partition_id = $1::uuid AND (lo.first IS NULL OR h.seq < lo.first)`

// DeleteMessage deletes one message and its dead letters. Offsets are
// dense and a cursor moves only over finished offsets, so the deleted
// offset becomes finished for every consumer group of the partition, as if
// each had acknowledged it: cursors move over it (nothing waits for it,
// and pending counts stay right), and a live lease it was the last
// unfinished message of ends. A lease that covers it otherwise goes on;
// its holder's ack of the deleted message answers "Message not found",
// the others work as before. Groups registered later start with it
// finished (message_holes). A message that does not exist, with no dead
// letter either, is ErrMessageNotFound.
//
// Cost: the partition's consumer rows, two index probes and the
// partition's holes; it locks the consumer rows for that long.
func (s *Store) DeleteMessage(ctx context.Context, partitionID, transactionID string) (*DeleteResult, error) {
	if !ValidUUID(partitionID) || transactionID == "" || validText("transactionId", transactionID) != nil {
		return nil, ErrMessageNotFound
	}
	res := &DeleteResult{}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, deleteLockSQL, partitionID)
		if err != nil {
			return fmt.Errorf("locking consumers: %w", err)
		}
		type row struct {
			group      string
			st         cursorState
			live       bool
			lastOffset int64 // the partition's
		}
		var locked []*row
		found := false
		for rows.Next() {
			var group *string
			var r row
			var cur, from, to, aseq, last *int64
			var att *int32
			var leaseID *string
			var live *bool
			if err := rows.Scan(&res.Queue, &res.Partition, &group, &cur, &r.st.done, &leaseID, &live, &from, &to,
				&att, &aseq, &last); err != nil {
				rows.Close()
				return fmt.Errorf("locking consumers: %w", err)
			}
			found = true
			if group == nil {
				continue // a partition without consumer groups
			}
			r.group, r.st.cursor, r.st.leaseID, r.live = *group, *cur, *leaseID, *live
			r.st.leaseFrom, r.st.leaseTo, r.st.attempts, r.st.attemptSeq, r.lastOffset = *from, *to, int(*att), *aseq, *last
			locked = append(locked, &r)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("locking consumers: %w", err)
		}
		if !found {
			return ErrMessageNotFound
		}
		var seq *int64
		if err := tx.QueryRow(ctx, deleteRowsSQL, partitionID, transactionID).Scan(&seq, &res.DeadLetters); err != nil {
			return fmt.Errorf("deleting message: %w", err)
		}
		if seq == nil {
			if res.DeadLetters == 0 {
				return ErrMessageNotFound
			}
			return nil // only dead letters were left: no cursor waits for it
		}
		res.Message = true
		var u consumerUpdates
		for _, r := range locked {
			if r.st.isDone(*seq) {
				continue
			}
			covered := r.live && r.st.leaseFrom <= *seq && *seq <= r.st.leaseTo
			r.st.markDone(*seq)
			if !covered {
				u.add(partitionID, r.group, &r.st, -1, "", "")
				continue
			}
			cl := CoveredLease{Group: r.group, LeaseID: r.st.leaseID}
			if r.st.leaseComplete() {
				r.st.release()
				cl.Released, cl.Pending = true, r.st.cursor < r.lastOffset
			}
			res.Leases = append(res.Leases, cl)
			u.add(partitionID, r.group, &r.st, -1, "", "")
		}
		if err := u.exec(ctx, tx); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, deleteHoleSQL, partitionID, *seq); err != nil {
			return fmt.Errorf("recording the deleted offset: %w", err)
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrMessageNotFound) {
			return nil, err
		}
		return nil, fmt.Errorf("deleting message %s of %s: %w", transactionID, partitionID, err)
	}
	// The offset counts as done: rows whose cursor it moved may be caught up.
	if err := sendReady(context.WithoutCancel(ctx), s.pool, []string{partitionID}); err != nil {
		s.log.Warn().Err(err).Msg("marking consumer rows ready after a delete")
	}
	return res, nil
}
