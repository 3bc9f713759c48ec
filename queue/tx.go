package queue

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
)

// TxOp is one operation of an atomic transaction: a push of Items, or an Ack.
type TxOp struct {
	Type  string // "push" or "ack"
	Items []PushItem
	Ack   Ack
}

// TxOpResult is the result of one operation. A push yields one per item.
type TxOpResult struct {
	// Index is the result's position in TxResult.Results: every pushed item
	// counts as one operation, as the reference server flattens push items
	// (ops [ack, push of 2 items] give indexes 0, 1, 2).
	Index int
	Type  string
	Push  *PushResult
	Ack   *AckResult
}

// TxResult reports a transaction. Success false means it was rolled back;
// Results then end with the operation that failed (for a push refused by a
// queue's maxSize: the refused item, status rejected).
type TxResult struct {
	TransactionID string
	Success       bool
	Error         string
	// Forbidden: it failed on another subject's lease (a required lease,
	// or an ack's ErrTextForeign).
	Forbidden bool
	Results   []TxOpResult
}

// txAcked is a transaction's ack result and the row it acted on.
type txAcked struct {
	res *AckResult
	key consumerKey
}

// errTxAborted rolls the transaction back after a logical failure.
var errTxAborted = errors.New("transaction aborted")

// Transaction runs pushes and acks atomically: all commit or none do. Every
// lease in requiredLeases must be live when it starts and, with a holder
// other than "", leased to it (or to no subject); its acks are made as
// holder's (Ack.Holder).
func (s *Store) Transaction(ctx context.Context, ops []TxOp, requiredLeases []string, holder string) (*TxResult, error) {
	keys, err := txPushKeys(ops)
	if err != nil {
		return nil, err
	}
	// The partitions the pushes write are found (or created) before the
	// transaction, on a connection of its own: created inside, they would
	// wait for a group registration that waits for this transaction's
	// partition locks, a cycle Postgres cannot see.
	pushParts, err := s.txPushPartitions(ctx, keys)
	if err != nil {
		return nil, err
	}
	res := &TxResult{TransactionID: NewID(), Results: []TxOpResult{}}
	var acked []txAcked
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// Then every row the operations write is locked before the first
		// runs, in the one lock order: the pushes' partitions by id, then
		// the consumer rows of those partitions (which a push may write)
		// and of the acks' (partition, group) pairs together, by key. Taken
		// op by op, an ack before a push would hold a consumer row while
		// the push waited for a partition another push held while waiting
		// for that row, and acks listed against key order would hold one row
		// while waiting for a lower one that an ExtendLease, a retention
		// step or another transaction holds while waiting for the first.
		if err := lockTxRows(ctx, tx, pushParts, ops); err != nil {
			return err
		}
		if err := checkRequiredLeases(ctx, tx, requiredLeases, holder, res); err != nil {
			return err
		}
		var err error
		acked, err = s.runTxOps(ctx, tx, ops, requiredLeases, holder, res)
		return err
	})
	switch {
	case errors.Is(err, errTxAborted):
		return res, nil
	case err != nil:
		return nil, err
	}
	s.afterTxCommit(context.WithoutCancel(ctx), ops, pushParts, acked)
	res.Success = true
	return res, nil
}

// txPushKeys checks ops and returns the partitions their pushes name.
func txPushKeys(ops []TxOp) ([]partKey, error) {
	if len(ops) == 0 {
		return nil, inputErrorf("operations array cannot be empty")
	}
	for i, op := range ops {
		if op.Type != "push" && op.Type != "ack" {
			return nil, inputErrorf("operations[%d].type must be push or ack", i)
		}
	}
	var keys []partKey
	for _, op := range ops {
		if op.Type != "push" {
			continue
		}
		if err := validatePushItems(op.Items); err != nil {
			return nil, err
		}
		for _, it := range op.Items {
			keys = append(keys, it.partKey())
		}
	}
	return keys, nil
}

// txPushPartitions finds or creates the partitions of keys: their ids,
// each once, sorted (the lock order).
func (s *Store) txPushPartitions(ctx context.Context, keys []partKey) ([]string, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	refs, err := s.resolvePartitions(ctx, keys)
	if err != nil {
		return nil, err
	}
	var ids []string
	seen := map[string]bool{}
	for _, r := range refs {
		if !seen[r.partitionID] {
			seen[r.partitionID] = true
			ids = append(ids, r.partitionID)
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// checkRequiredLeases aborts the transaction (errTxAborted, res.Error
// said why) unless every required lease is live and, with a holder, its
// own.
func checkRequiredLeases(ctx context.Context, tx pgx.Tx, requiredLeases []string, holder string, res *TxResult) error {
	for _, l := range requiredLeases {
		var live, foreign bool
		if ValidUUID(l) {
			if err := tx.QueryRow(ctx, `SELECT count(*) > 0, coalesce(bool_or(lease_subject <> $2), false)
				FROM consumers WHERE lease_id = $1::uuid AND lease_expires_at > now()`,
				l, holder).Scan(&live, &foreign); err != nil {
				return fmt.Errorf("checking required lease: %w", err)
			}
		}
		if holder != "" && foreign {
			res.Error, res.Forbidden = "Required lease is held by another subject: "+l, true
			return errTxAborted
		}
		if !live {
			res.Error = "Required lease is not valid: " + l
			return errTxAborted
		}
	}
	return nil
}

// runTxOps runs the operations in order into res; the first that fails
// aborts them all (errTxAborted). It returns the acks, for their marking.
func (s *Store) runTxOps(ctx context.Context, tx pgx.Tx, ops []TxOp, requiredLeases []string, holder string, res *TxResult) ([]txAcked, error) {
	var acked []txAcked
	for _, op := range ops {
		if op.Type == "push" {
			prs, err := s.pushTx(ctx, tx, op.Items)
			if err != nil {
				return nil, err
			}
			for j := range prs {
				res.Results = append(res.Results, TxOpResult{Index: len(res.Results), Type: "push", Push: &prs[j]})
				// All or none: an item refused for maxSize fails the
				// whole transaction, however many others fitted.
				if prs[j].Status == StatusRejected {
					res.Error = "PUSH operation failed: " + prs[j].Error
					return nil, errTxAborted
				}
			}
			continue
		}
		// requiredLeases prove the request holds them: an ack naming no
		// lease acts under the one its message is in (Queen's clients name
		// the lease only there).
		a := op.Ack
		a.Holder = holder
		ars, err := s.ackTx(ctx, tx, []Ack{a}, requiredLeases, false)
		if err != nil {
			return nil, err
		}
		ar := ars[0]
		res.Results = append(res.Results, TxOpResult{Index: len(res.Results), Type: "ack", Ack: &ar})
		if a.Group == "" {
			a.Group = DefaultGroup
		}
		acked = append(acked, txAcked{&ar, consumerKey{strings.ToLower(a.PartitionID), a.Group}})
		if !ar.Success {
			res.Error, res.Forbidden = "ACK operation failed: "+ar.Error, ar.Error == ErrTextForeign
			return nil, errTxAborted
		}
	}
	return acked, nil
}

// afterTxCommit marks what a committed transaction changed: the pushed
// partitions' consumer rows, as a push does after its commit, and the
// rows its acks may have left caught up, as an ack does; that marking
// completes the Pending of the leases they ended (ackPlan.settlePending).
func (s *Store) afterTxCommit(ctx context.Context, ops []TxOp, pushParts []string, acked []txAcked) {
	if len(pushParts) > 0 {
		s.markReady(ctx, pushParts, nil)
	}
	var ackParts, ackGroups []string
	for _, op := range ops {
		if op.Type == "ack" && ValidUUID(op.Ack.PartitionID) {
			g := op.Ack.Group
			if g == "" {
				g = DefaultGroup
			}
			ackParts, ackGroups = append(ackParts, op.Ack.PartitionID), append(ackGroups, g)
		}
	}
	pending, ok := s.markRowsPending(ctx, ackParts, ackGroups)
	for _, a := range acked {
		if a.res.LeaseReleased && !a.res.Pending {
			a.res.Pending = !ok || pending[a.key]
		}
	}
}

// txLockPartitionsSQL and txLockConsumersSQL lock what a transaction's
// operations write, in the lock order every statement follows: partitions
// by id, then consumer rows by (partition, group). FOR UPDATE, as an ack's
// own lock (ackLockSQL) takes them.
const txLockPartitionsSQL = `-- herald:tx_lock_partitions
SELECT count(*) FROM (SELECT 1 FROM partitions WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE) x`

const txLockConsumersSQL = `-- herald:tx_lock_consumers
SELECT count(*) FROM (
	SELECT 1 FROM consumers c
	-- The first condition lets the primary key's index find the rows (the
	-- OR alone read the whole table).
	WHERE c.partition_id = ANY($1::uuid[] || $2::uuid[])
	  AND ((c.partition_id = ANY($1::uuid[]) AND c.last_offset <= c.cursor) -- what the push's statement locks
	       OR (c.partition_id, c.consumer_group) IN (SELECT * FROM unnest($2::uuid[], $3::text[])))
	ORDER BY c.partition_id, c.consumer_group
	FOR UPDATE OF c
) x`

// lockTxRows locks the partitions pushParts (sorted) and the consumer rows
// of those partitions and of the acks of ops, in one round trip. An ack
// whose partition id is not a UUID locks nothing here (it finds no message).
func lockTxRows(ctx context.Context, tx pgx.Tx, pushParts []string, ops []TxOp) error {
	var ackParts, ackGroups []string
	for _, op := range ops {
		if op.Type != "ack" || !ValidUUID(op.Ack.PartitionID) {
			continue
		}
		g := op.Ack.Group
		if g == "" {
			g = DefaultGroup
		}
		ackParts, ackGroups = append(ackParts, op.Ack.PartitionID), append(ackGroups, g)
	}
	if len(pushParts) == 0 && len(ackParts) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	if len(pushParts) > 0 {
		b.Queue(txLockPartitionsSQL, pushParts)
	}
	b.Queue(txLockConsumersSQL, pushParts, ackParts, ackGroups)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("locking the transaction's rows: %w", err)
	}
	return nil
}
