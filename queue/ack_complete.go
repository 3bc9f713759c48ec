package queue

import (
	"context"
	"fmt"
	"strings"
)

// The completion path of an ack: one statement, one round trip.
//
// A consumer that keeps up acks each message it is sent, in order, under
// the lease it was sent under: every item a completion naming its live
// lease, the next offsets after the cursor with nothing done above it.
// ackTx, which handles any ack, costs two round trips and five statements
// for that (BEGIN with the reads, then the row's write with COMMIT), and
// PostgreSQL about 420 µs of CPU per transaction on the 2-core machine of
// docs/benchmarks.md: at 1,000 msgs/s on one partition it is about a third
// of the statements a message costs. ackComplete does the same work in one
// statement that commits in the pipeline's implicit transaction (as a push
// does): it finds the messages, locks the rows in key order, checks that
// every item is such a completion, and writes the rows as decideAck and
// writeAck would. When any item is not (a repeat, an offset out of order,
// another lease, an expired one, another subject's message), it writes
// nothing, and ackNow runs the whole batch through ackTx: all or nothing,
// so a batch is never split between two commits.

// ackCompleteSQL applies a batch of completions ($1 partition ids, $2
// groups, $3 lease ids, $4 transaction ids, $5 holders, in item order)
// when each (partition, group) pair's items are the offsets cursor+1,
// cursor+2, … in item order, under the row's live lease, within its range
// (a following lease's range reaches its partition's last offset, as
// ackLockSQL reads it), with done empty and a holder that is the lease's
// subject (or none); then every pair's row is written, as
// consumerUpdateSQL writes decideAck's: the cursor over them, the
// attempts cleared once the offset they belong to is done, the lease
// released once complete (unless it follows its partition), a following
// lease renewed (its time starts again) and its range written up to the
// partition's last offset. It returns one row per pair written: the
// queue's and partition's names, whether the lease ended (rel), whether a
// following lease has all it covers done (idle), whether messages wait
// past the row's copy of last_offset (pending), and whether the row is
// caught up to that copy (mark: caughtUp's test). No row: nothing written.
var ackCompleteSQL = `-- herald:ack_complete
WITH t AS (
	SELECT t.ord, t.pid::uuid AS pid, t.grp, t.lease, t.holder,
	       (SELECT m.seq FROM messages m WHERE m.partition_id = t.pid::uuid AND m.transaction_id = t.txid) AS seq,
	       row_number() OVER (PARTITION BY t.pid::uuid, t.grp ORDER BY t.ord) AS rn
	FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) WITH ORDINALITY AS t(pid, grp, lease, txid, holder, ord)
), k AS (
	SELECT pid, grp, count(*) AS n, count(seq) AS found, count(DISTINCT lease) AS leases,
	       min(lease) AS lease, min(seq - rn) AS base, max(seq - rn) AS base_hi, max(seq) AS hi,
	       count(DISTINCT nullif(holder, '')) AS holders, min(nullif(holder, '')) AS holder
	FROM t GROUP BY pid, grp
), lk AS (
	SELECT c.partition_id, c.consumer_group, c.cursor, c.done, c.lease_id, c.lease_expires_at, c.lease_from,
	       ` + leaseEnd("c") + ` AS lto, coalesce(c.follow_lease = c.lease_id, false) AS follows,
	       c.attempts, c.attempt_seq, c.last_offset, c.lease_subject, q.lease_time, q.name AS qname, p.name AS pname,
	       k.n, k.found, k.leases, k.lease, k.base, k.base_hi, k.hi, k.holders, k.holder
	FROM k JOIN consumers c ON c.partition_id = k.pid AND c.consumer_group = k.grp
	JOIN queues q ON q.id = c.queue_id
	JOIN partitions p ON p.id = c.partition_id
	ORDER BY c.partition_id, c.consumer_group
	FOR UPDATE OF c
), x AS (
	SELECT lk.*, lk.cursor + lk.n AS cur, lk.cursor + lk.n >= lk.lto AS complete FROM lk
	WHERE lk.found = lk.n AND lk.leases = 1 AND lk.lease_id::text = lk.lease AND lk.lease_expires_at > now()
	  AND lk.done = '{}' AND lk.base = lk.cursor AND lk.base_hi = lk.cursor
	  AND lk.cursor + 1 >= lk.lease_from AND lk.hi <= lk.lto
	  AND (lk.holders = 0 OR lk.holders = 1 AND (coalesce(lk.lease_subject, '') = '' OR lk.lease_subject = lk.holder))
), w AS (
	SELECT x.*, x.complete AND NOT x.follows AS rel FROM x
	WHERE (SELECT count(*) FROM x) = (SELECT count(*) FROM k)
)
UPDATE consumers c SET cursor = w.cur,
	attempts = CASE WHEN w.attempt_seq <> 0 AND w.attempt_seq <= w.cur THEN 0 ELSE w.attempts END,
	attempt_seq = CASE WHEN w.attempt_seq <> 0 AND w.attempt_seq <= w.cur THEN 0 ELSE w.attempt_seq END,
	lease_id = CASE WHEN w.rel THEN NULL ELSE c.lease_id END,
	lease_owner = CASE WHEN w.rel THEN NULL WHEN w.follows THEN coalesce(c.lease_owner, '') ELSE c.lease_owner END,
	lease_subject = CASE WHEN w.follows THEN nullif(c.lease_subject, '') ELSE c.lease_subject END,
	lease_expires_at = CASE WHEN w.rel THEN NULL
		WHEN w.follows THEN now() + make_interval(secs => w.lease_time) ELSE c.lease_expires_at END,
	lease_from = CASE WHEN w.rel THEN NULL ELSE w.lease_from END,
	lease_to = CASE WHEN w.rel THEN NULL ELSE w.lto END,
	delivered_to = greatest(c.delivered_to, CASE WHEN w.rel THEN 0 ELSE w.lto END),
	leased_at = CASE WHEN w.follows THEN now() ELSE c.leased_at END,
	last_offset = greatest(c.last_offset, CASE WHEN w.rel THEN 0 ELSE w.lto END)
FROM w
WHERE c.partition_id = w.partition_id AND c.consumer_group = w.consumer_group
RETURNING c.partition_id::text, c.consumer_group, w.qname, w.pname, w.rel, w.complete AND w.follows,
	w.cur < w.last_offset, w.cur >= w.last_offset AND NOT w.follows`

// ackCompletable reports whether every item may go to ackComplete: a
// completion naming a lease, with ids the statement can cast. The
// statement decides the rest.
func ackCompletable(acks []Ack) bool {
	for _, a := range acks {
		if a.Status != StatusCompleted && a.Status != StatusSuccess || !ValidUUID(a.LeaseID) || !ValidUUID(a.PartitionID) {
			return false
		}
	}
	return true
}

// completedPair is a (partition, group) row ackComplete wrote.
type completedPair struct {
	queue, partition string
	released, idle   bool
	pending, mark    bool
}

// ackComplete runs acks (ackCompletable) through ackCompleteSQL on q
// (a pool connection: the statement commits in its own implicit
// transaction). ok is false when it wrote nothing (an item is not a
// completion in order under its live lease): the caller runs ackTx.
func (s *Store) ackComplete(ctx context.Context, q querier, acks []Ack) (results []AckResult, ok bool, err error) {
	pids := make([]string, len(acks))
	grps := make([]string, len(acks))
	leases := make([]string, len(acks))
	txids := make([]string, len(acks))
	holders := make([]string, len(acks))
	for i, a := range acks {
		pids[i], grps[i], leases[i], txids[i], holders[i] = a.PartitionID, a.Group, a.LeaseID, a.TransactionID, a.Holder
	}
	rows, err := q.Query(ctx, ackCompleteSQL, pids, grps, leases, txids, holders)
	if err != nil {
		return nil, false, fmt.Errorf("acknowledging: %w", commitUnknown(err))
	}
	pairs := map[consumerKey]completedPair{}
	for rows.Next() {
		var k consumerKey
		var p completedPair
		if err := rows.Scan(&k.partitionID, &k.group, &p.queue, &p.partition, &p.released, &p.idle, &p.pending, &p.mark); err != nil {
			rows.Close()
			return nil, false, fmt.Errorf("acknowledging: %w", commitUnknown(err))
		}
		pairs[k] = p
	}
	rows.Close() // reads the Sync's answer: the commit's
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("acknowledging: %w", commitUnknown(err))
	}
	if len(pairs) == 0 {
		return nil, false, nil
	}
	return s.completedResults(ctx, acks, pairs), true, nil
}

// completedResults answers acks from the pairs ackComplete wrote, as
// decideAck would: every item a success under its lease; the last item of
// a pair tells of the lease it ended (LeaseReleased, Pending) or of a
// following lease left with nothing to do (Idle). Rows left caught up are
// marked after the commit, as writeAck marks them, and their marking says
// whether messages wait behind a lease that ended.
func (s *Store) completedResults(ctx context.Context, acks []Ack, pairs map[consumerKey]completedPair) []AckResult {
	out := make([]AckResult, len(acks))
	last := make(map[consumerKey]int, len(pairs))
	for i, a := range acks {
		k := consumerKey{strings.ToLower(a.PartitionID), a.Group}
		p := pairs[k]
		out[i] = AckResult{Index: i, TransactionID: a.TransactionID, Success: true, Queue: p.queue, Partition: p.partition,
			LeaseID: a.LeaseID}
		last[k] = i
	}
	var pids, groups []string
	for k, i := range last {
		p := pairs[k]
		r := &out[i]
		r.LeaseReleased, r.Idle = p.released, p.idle
		r.Pending = p.released && p.pending
		if p.mark {
			pids, groups = append(pids, k.partitionID), append(groups, k.group)
		}
	}
	if len(pids) > 0 {
		pending, ok := s.markRowsPending(context.WithoutCancel(ctx), pids, groups)
		for k, i := range last {
			if r := &out[i]; r.LeaseReleased && !r.Pending && (!ok || pending[k]) {
				r.Pending = true
			}
		}
	}
	return out
}
