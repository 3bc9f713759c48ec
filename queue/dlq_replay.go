package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Replaying and purging dead letters. A dead letter is one message that
// one consumer group gave up on; its offset is finished for that group
// (the cursor passed it, or it sits in done). Replay makes exactly that
// offset unfinished again for that group alone, so the group's next pop
// of the partition delivers it first, in its place: the offsets after it
// that the group had finished stay finished (they go into done), and once
// it is acked the cursor jumps over them again. Purge forgets dead letters
// and changes no cursor.
//
// Both take their locks in the one order (doc.go): consumer rows in key
// order, then the message rows (KEY SHARE: retention skips them, a delete
// waits), then the dead-letter rows in id order. Both are idempotent: a
// dead letter that is gone (replayed or purged before) is reported
// not_found and changes nothing.

// MaxDLQSelection bounds how many dead letters one replay or purge acts on.
const MaxDLQSelection = 10000

// MaxReplayDistance bounds the consumer row's done array a replay leaves:
// every offset between the replayed one and the cursor joins it, and each
// pop and ack of the pair reads it whole, so it must stay small (50,000
// offsets are 400 kB of bigint). Offsets already there count too, so that
// replays one after the other cannot grow it past the bound.
const MaxReplayDistance = 50000

// Replay and purge outcomes (DLQOutcome.Status, Reason).
const (
	DLQReplayed = "replayed"
	DLQPurged   = "purged"
	DLQSkipped  = "skipped"

	// ReasonNotFound: no such dead letter (replayed or purged already).
	ReasonNotFound = "not_found"
	// ReasonMessageGone: retention deleted the message; its order cannot
	// be restored. The dead letter (with its payload copy) stays.
	ReasonMessageGone = "message_gone"
	// ReasonLeased: the group holds a live lease on the partition now;
	// moving its cursor under the holder would change what its acks mean.
	// Nothing changed: retry later.
	ReasonLeased = "leased"
	// ReasonTooFar: the done array would grow past MaxReplayDistance (the
	// offset lies that far behind the group's cursor, with what is done
	// already).
	ReasonTooFar = "too_far"
	// ReasonExpired: the queue's maxWaitTimeSeconds has passed for the
	// message (put back, the next retention run would dead-letter it
	// again), or its ttl (put back, it would never be delivered, and the
	// dead letter, its only copy, would be gone).
	ReasonExpired = "expired"
	// ReasonGroupGone: the group has no position on the partition any more
	// (it was deleted); the dead letter stays.
	ReasonGroupGone = "group_gone"
)

// DLQSelection names the dead letters to act on: IDs (row ids, as
// DeadLetter.RowID), or, when IDs is nil, the first Limit (oldest first)
// that Filter matches (its Limit and Offset are ignored).
type DLQSelection struct {
	IDs    []int64
	Filter DLQQuery
	Limit  int // 1..MaxDLQSelection; zero means 1,000
	// Allow, when set, is the rights of a token, checked on what the
	// selection finds: a dead letter it does not allow is treated as one
	// that does not exist (not_found), so that a token learns nothing of
	// another tenant's dead letters, not even that an id exists.
	Allow func(queue, partition string) bool
}

// DLQOutcome is what became of one dead letter.
type DLQOutcome struct {
	ID     int64
	Status string // DLQReplayed, DLQPurged or DLQSkipped
	Reason string // why it was skipped
	// Where it was: set for every dead letter that was found.
	Queue, Partition, PartitionID, Group string
}

// DLQActResult reports a replay or a purge, one outcome per dead letter
// selected, in id order (for IDs: every distinct id asked for).
type DLQActResult struct {
	Items []DLQOutcome
	// Done counts the replayed (or purged) ones, per queue.
	Done map[string]int
	// Released are the expired leases a replay settled (as the group's
	// next pop would have), for the poller and the other instances.
	Released []ReleasedLease
	// DeadLettered counts, per queue, the messages those expired leases
	// sent to the dead-letter queue (their last attempt).
	DeadLettered map[string]int
	// Dropped counts, per queue, those they gave up on with no dead letter
	// kept (the queue's deadLetterQueue or dlqAfterMaxRetries false).
	Dropped map[string]int
}

func (sel *DLQSelection) normalize() error {
	if sel.IDs != nil {
		if len(sel.IDs) == 0 || len(sel.IDs) > MaxDLQSelection {
			return inputErrorf("ids must hold 1 to %d ids", MaxDLQSelection)
		}
		for _, id := range sel.IDs {
			if id <= 0 {
				return inputErrorf("ids must be positive integers")
			}
		}
		return nil
	}
	if sel.Limit == 0 {
		sel.Limit = 1000
	}
	if sel.Limit < 0 || sel.Limit > MaxDLQSelection {
		return inputErrorf("limit must be between 1 and %d", MaxDLQSelection)
	}
	return sel.Filter.validate()
}

// dlqRef is a selected dead letter: where it is and which offset.
type dlqRef struct {
	DLQOutcome
	seq int64
}

// dlqSelectSQL finds the selected dead letters, oldest first: by id
// ($7 not null) or by the filter $1..$6, up to $8.
const dlqSelectSQL = `-- herald:dlq_select
SELECT d.id, d.partition_id::text, d.seq, d.consumer_group, q.name, p.name
` + dlqWhere + `
  AND ($7::bigint[] IS NULL OR d.id = ANY ($7))
ORDER BY d.id
LIMIT $8`

func selectDeadLetters(ctx context.Context, q querier, sel DLQSelection) ([]dlqRef, error) {
	args := sel.Filter.args()
	limit := sel.Limit
	var ids []int64
	if sel.IDs != nil {
		args = DLQQuery{}.args()
		ids, limit = sel.IDs, len(sel.IDs)
	}
	rows, err := q.Query(ctx, dlqSelectSQL, append(args, ids, limit)...)
	if err != nil {
		return nil, fmt.Errorf("selecting dead letters: %w", err)
	}
	defer rows.Close()
	var out []dlqRef
	for rows.Next() {
		var r dlqRef
		if err := rows.Scan(&r.ID, &r.PartitionID, &r.seq, &r.Group, &r.Queue, &r.Partition); err != nil {
			return nil, fmt.Errorf("selecting dead letters: %w", err)
		}
		if sel.Allow != nil && !sel.Allow(r.Queue, r.Partition) {
			continue // as if it did not exist
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("selecting dead letters: %w", err)
	}
	return out, nil
}

// withMissing adds, for IDs, a not_found outcome for every id asked for
// that found is missing, and sorts the outcomes by id.
func withMissing(sel DLQSelection, found []DLQOutcome) []DLQOutcome {
	have := make(map[int64]bool, len(found))
	for _, o := range found {
		have[o.ID] = true
	}
	for _, id := range sel.IDs {
		if !have[id] {
			have[id] = true
			found = append(found, DLQOutcome{ID: id, Status: DLQSkipped, Reason: ReasonNotFound})
		}
	}
	slices.SortFunc(found, func(a, b DLQOutcome) int { return cmp.Compare(a.ID, b.ID) })
	return found
}

// dlqLockSQL locks the selected dead letters still there, in id order.
const dlqLockSQL = `-- herald:dlq_lock
SELECT d.id FROM dead_letters d WHERE d.id = ANY ($1::bigint[]) ORDER BY d.id FOR UPDATE`

// lockDeadLetters locks the dead letters of refs that are still there:
// their ids, in refs' order, and which of them it found.
func lockDeadLetters(ctx context.Context, q querier, refs []dlqRef) (ids []int64, there map[int64]bool, err error) {
	ids = make([]int64, len(refs))
	for i, r := range refs {
		ids[i] = r.ID
	}
	rows, err := q.Query(ctx, dlqLockSQL, ids)
	if err != nil {
		return nil, nil, fmt.Errorf("locking dead letters: %w", err)
	}
	defer rows.Close()
	there = make(map[int64]bool, len(ids))
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, nil, fmt.Errorf("locking dead letters: %w", err)
		}
		there[id] = true
	}
	return ids, there, rows.Err()
}

// PurgeDeadLetters deletes the selected dead letters. The messages stay
// finished for their groups. A dead letter already gone is not_found.
func (s *Store) PurgeDeadLetters(ctx context.Context, sel DLQSelection) (*DLQActResult, error) {
	if err := sel.normalize(); err != nil {
		return nil, err
	}
	var res *DLQActResult
	err := s.dlqTx(ctx, "purging dead letters", func(tx pgx.Tx) error {
		res = &DLQActResult{Done: map[string]int{}}
		refs, err := selectDeadLetters(ctx, tx, sel)
		if err != nil {
			return err
		}
		ids, there, err := lockDeadLetters(ctx, tx, refs)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `-- herald:dlq_purge
			DELETE FROM dead_letters WHERE id = ANY ($1::bigint[])`, ids); err != nil {
			return fmt.Errorf("deleting dead letters: %w", err)
		}
		items := make([]DLQOutcome, 0, len(refs))
		for _, r := range refs {
			o := r.DLQOutcome
			o.Status = DLQPurged
			if !there[r.ID] {
				o.Status, o.Reason = DLQSkipped, ReasonNotFound
			} else {
				res.Done[r.Queue]++
			}
			items = append(items, o)
		}
		res.Items = withMissing(sel, items)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// dlqTx runs f in a transaction, again (up to three times) when
// PostgreSQL broke a deadlock: a message deleted while its dead letters
// are purged may lock the same rows in another order.
func (s *Store) dlqTx(ctx context.Context, what string, f func(pgx.Tx) error) error {
	var err error
	for try := 0; try < 3; try++ {
		err = pgx.BeginFunc(ctx, s.pool, f)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "40P01" {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}
