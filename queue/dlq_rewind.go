package queue

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// rewind makes offset seq unfinished again, and nothing else:
//
//	seq above the cursor: seq leaves done (if it was there);
//	seq at or below it:   the cursor goes back to seq − 1 and every offset
//	                      in (seq, old cursor] joins done, so they stay
//	                      finished.
//
// The next pop of the pair then reads seq first (it skips done offsets),
// and once seq is acked the cursor moves over the done run again
// (markDone). The failed attempts counted for seq start again from zero;
// those of another pending offset are left alone.
func (s *cursorState) rewind(seq int64) {
	if seq <= 0 {
		return
	}
	if seq > s.cursor {
		if i, found := slices.BinarySearch(s.done, seq); found {
			s.done = slices.Delete(s.done, i, i+1)
		}
	} else {
		done := make([]int64, 0, int(s.cursor-seq)+len(s.done))
		for o := seq + 1; o <= s.cursor; o++ {
			done = append(done, o)
		}
		s.done = append(done, s.done...)
		s.cursor = seq - 1
	}
	if s.attemptSeq == seq || s.attemptSeq == 0 || s.isDone(s.attemptSeq) {
		s.attempts, s.attemptSeq = 0, seq
	}
	s.changed = true
}

// replayRow is a consumer row a replay locked.
type replayRow struct {
	st         cursorState
	live       bool // its lease is unexpired
	retryLimit int
	dead       deadPolicy
}

// messageKey names a message.
type messageKey struct {
	partitionID string
	seq         int64
}

// replayPlan is what decideReplay made of the selection.
type replayPlan struct {
	items    []DLQOutcome
	replayed []int64         // dead letters to delete
	rows     []consumerKey   // consumer rows to write, in key order
	dead     []deadLetter    // from the expired leases it settled
	released []ReleasedLease // those leases
	deadBy   map[string]int  // and per queue
	// droppedBy: per queue, the messages those leases gave up on with no
	// dead letter kept (deadPolicy).
	droppedBy map[string]int
}

// decideReplay decides, with no database, the fate of each selected dead
// letter (refs, in id order) given what the locks found: there, the dead
// letters still present; rows, the consumer rows; msgs, the messages still
// stored. An expired lease on a row it rewinds is settled first, as the
// group's next pop would (a failed attempt of the first pending offset):
// left in place, that pop would charge the attempt to the replayed offset,
// now the first pending one.
func decideReplay(refs []dlqRef, there map[int64]bool, rows map[consumerKey]*replayRow, msgs map[messageKey]storedMessage) replayPlan {
	plan := replayPlan{items: make([]DLQOutcome, 0, len(refs))}
	touched := map[consumerKey]bool{}
	for _, r := range refs {
		o := r.DLQOutcome
		o.Status = DLQSkipped
		k := consumerKey{r.PartitionID, r.Group}
		row := rows[k]
		switch {
		case !there[r.ID]:
			o.Reason = ReasonNotFound
		case row == nil:
			o.Reason = ReasonGroupGone
		case row.live:
			o.Reason = ReasonLeased
		case !msgs[messageKey{r.PartitionID, r.seq}].stored:
			o.Reason = ReasonMessageGone
		case msgs[messageKey{r.PartitionID, r.seq}].expired:
			o.Reason = ReasonExpired
		case row.st.cursor-r.seq+int64(len(row.st.done)) > MaxReplayDistance:
			o.Reason = ReasonTooFar
		default:
			if row.st.leaseID != "" {
				c := &claimed{partitionID: r.PartitionID, partition: r.Partition, queue: r.Queue, st: row.st,
					retryLimit: row.retryLimit, dead: row.dead}
				pr := &PopResult{}
				plan.dead = append(plan.dead, expireLeases([]*claimed{c}, r.Group, pr)...)
				for q, n := range pr.DeadLettered {
					if plan.deadBy == nil {
						plan.deadBy = map[string]int{}
					}
					plan.deadBy[q] += n
				}
				for q, n := range pr.Dropped {
					if plan.droppedBy == nil {
						plan.droppedBy = map[string]int{}
					}
					plan.droppedBy[q] += n
				}
				row.st = c.st
				plan.released = append(plan.released, ReleasedLease{Queue: r.Queue, Partition: r.Partition,
					PartitionID: r.PartitionID, Group: r.Group})
			}
			row.st.rewind(r.seq)
			o.Status, o.Reason = DLQReplayed, ""
			plan.replayed = append(plan.replayed, r.ID)
			if !touched[k] {
				touched[k] = true
				plan.rows = append(plan.rows, k)
			}
		}
		plan.items = append(plan.items, o)
	}
	slices.SortFunc(plan.rows, func(a, b consumerKey) int {
		if c := cmp.Compare(a.partitionID, b.partitionID); c != 0 {
			return c
		}
		return cmp.Compare(a.group, b.group)
	})
	return plan
}

// replayLockSQL locks the consumer rows of the selected dead letters, in
// key order, as acks lock them.
var replayLockSQL = `-- herald:dlq_replay_lock
SELECT c.partition_id::text, c.consumer_group, c.cursor, c.done, coalesce(c.lease_id::text, ''),
       coalesce(c.lease_expires_at > now(), false), coalesce(c.lease_from, 0), coalesce(` + leaseEnd("c") + `, 0),
       c.attempts, c.attempt_seq, q.retry_limit, ` + deadPolicyColumns + `
FROM (SELECT DISTINCT pid::uuid AS pid, grp FROM unnest($1::text[], $2::text[]) AS k(pid, grp)) k
JOIN consumers c ON c.partition_id = k.pid AND c.consumer_group = k.grp
JOIN queues q ON q.id = c.queue_id
ORDER BY c.partition_id, c.consumer_group
FOR UPDATE OF c`

// replayMessagesSQL finds the messages still stored, KEY SHARE locked so
// that retention (which skips locked rows) keeps them until the replay
// commits, and whether each is expired (ReasonExpired): past the queue's
// maxWaitTimeSeconds, or past its ttl (a pop would skip it, and the
// replay would delete its only copy, the dead letter).
const replayMessagesSQL = `-- herald:dlq_replay_messages
SELECT m.partition_id::text, m.seq,
       (q.max_wait_time_seconds > 0 AND m.created_at < now() - make_interval(secs => q.max_wait_time_seconds))
       OR (q.ttl > 0 AND m.created_at < now() - make_interval(secs => q.ttl))
FROM messages m
JOIN unnest($1::uuid[], $2::bigint[]) AS u(pid, seq) ON m.partition_id = u.pid AND m.seq = u.seq
JOIN partitions p ON p.id = m.partition_id
JOIN queues q ON q.id = p.queue_id
ORDER BY m.partition_id, m.seq
FOR KEY SHARE OF m`

// storedMessage is what replay learns of a selected message: that it is
// still stored, and whether its queue's maxWaitTimeSeconds or ttl has
// passed.
type storedMessage struct{ stored, expired bool }

// ReplayDeadLetters puts the selected dead letters back: each message is
// pending again for its own consumer group only, on its own partition, in
// its place (see rewind), and its dead letter is deleted. A dead letter is
// skipped, unchanged, when it is gone already (not_found: a second replay
// changes nothing), its group holds a live lease on the partition (leased),
// its message is gone (message_gone), it lies too far behind the cursor
// (too_far) or its group has no row there any more (group_gone).
//
// Cost: one transaction of five statements, whatever the selection's
// size; it holds the selected pairs' consumer rows for that long.
func (s *Store) ReplayDeadLetters(ctx context.Context, sel DLQSelection) (*DLQActResult, error) {
	if err := sel.normalize(); err != nil {
		return nil, err
	}
	var res *DLQActResult
	var written []consumerKey
	err := s.dlqTx(ctx, "replaying dead letters", func(tx pgx.Tx) error {
		written = nil
		refs, err := selectDeadLetters(ctx, tx, sel)
		if err != nil {
			return err
		}
		rows, err := lockReplayRows(ctx, tx, refs)
		if err != nil {
			return err
		}
		msgs, err := lockReplayMessages(ctx, tx, refs)
		if err != nil {
			return err
		}
		_, there, err := lockDeadLetters(ctx, tx, refs)
		if err != nil {
			return err
		}
		plan := decideReplay(refs, there, rows, msgs)
		var u consumerUpdates
		for _, k := range plan.rows {
			u.add(k.partitionID, k.group, &rows[k].st, -1, "", "")
		}
		w := &pgx.Batch{}
		queueDeadLetters(w, plan.dead)
		if len(plan.replayed) > 0 {
			w.Queue(`-- herald:dlq_replay_delete
				DELETE FROM dead_letters WHERE id = ANY ($1::bigint[])`, plan.replayed)
		}
		u.queue(w)
		if w.Len() > 0 {
			if err := tx.SendBatch(ctx, w).Close(); err != nil {
				return fmt.Errorf("writing the replay: %w", err)
			}
		}
		written = plan.rows
		res = &DLQActResult{Items: withMissing(sel, plan.items), Done: map[string]int{}, Released: plan.released,
			DeadLettered: plan.deadBy, Dropped: plan.droppedBy}
		for _, o := range plan.items {
			if o.Status == DLQReplayed {
				res.Done[o.Queue]++
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// The expired leases a replay settles may dead-letter their first
	// message and move the cursor past the row's copy of last_offset (a
	// lower bound): mark the rows written, as an ack marks its rows, so a
	// waiting consumer finds them at once rather than at the next repair.
	pids, groups := make([]string, len(written)), make([]string, len(written))
	for i, k := range written {
		pids[i], groups[i] = k.partitionID, k.group
	}
	s.markRows(context.WithoutCancel(ctx), pids, groups)
	return res, nil
}

func lockReplayRows(ctx context.Context, tx pgx.Tx, refs []dlqRef) (map[consumerKey]*replayRow, error) {
	pids := make([]string, len(refs))
	grps := make([]string, len(refs))
	for i, r := range refs {
		pids[i], grps[i] = r.PartitionID, r.Group
	}
	rows, err := tx.Query(ctx, replayLockSQL, pids, grps)
	if err != nil {
		return nil, fmt.Errorf("locking consumers: %w", err)
	}
	defer rows.Close()
	out := map[consumerKey]*replayRow{}
	for rows.Next() {
		var k consumerKey
		r := &replayRow{}
		if err := rows.Scan(&k.partitionID, &k.group, &r.st.cursor, &r.st.done, &r.st.leaseID, &r.live,
			&r.st.leaseFrom, &r.st.leaseTo, &r.st.attempts, &r.st.attemptSeq, &r.retryLimit,
			&r.dead.drop, &r.dead.dropExhausted); err != nil {
			return nil, fmt.Errorf("locking consumers: %w", err)
		}
		out[k] = r
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("locking consumers: %w", err)
	}
	return out, nil
}

func lockReplayMessages(ctx context.Context, tx pgx.Tx, refs []dlqRef) (map[messageKey]storedMessage, error) {
	pids := make([]string, len(refs))
	seqs := make([]int64, len(refs))
	for i, r := range refs {
		pids[i], seqs[i] = r.PartitionID, r.seq
	}
	rows, err := tx.Query(ctx, replayMessagesSQL, pids, seqs)
	if err != nil {
		return nil, fmt.Errorf("locking messages: %w", err)
	}
	defer rows.Close()
	out := map[messageKey]storedMessage{}
	for rows.Next() {
		var k messageKey
		var expired bool
		if err := rows.Scan(&k.partitionID, &k.seq, &expired); err != nil {
			return nil, fmt.Errorf("locking messages: %w", err)
		}
		out[k] = storedMessage{stored: true, expired: expired}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("locking messages: %w", err)
	}
	return out, nil
}
