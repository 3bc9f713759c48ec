package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// AckStatus is what a consumer says about a delivered message.
type AckStatus string

// Ack statuses. StatusSuccess is a synonym of StatusCompleted.
const (
	StatusCompleted AckStatus = "completed"
	StatusSuccess   AckStatus = "success"
	StatusFailed    AckStatus = "failed" // counts an attempt; redelivered until the retry limit, then dead-lettered
	StatusRetry     AckStatus = "retry"  // released for redelivery without counting
	StatusDLQ       AckStatus = "dlq"    // dead-lettered at once
)

// ParseAckStatus validates a status; zero means completed.
func ParseAckStatus(s string) (AckStatus, error) {
	switch AckStatus(s) {
	case "":
		return StatusCompleted, nil
	case StatusCompleted, StatusSuccess, StatusFailed, StatusRetry, StatusDLQ:
		return AckStatus(s), nil
	}
	return "", inputErrorf("status must be one of completed, success, failed, retry, dlq")
}

// Ack is one acknowledgement.
type Ack struct {
	TransactionID string
	PartitionID   string
	LeaseID       string // optional; when set, the ack is refused unless this lease is live
	Status        AckStatus
	Group         string // zero means DefaultGroup
	Error         string // recorded with a dead letter
	// Holder, when set, is the subject (token sub) acking: the ack is
	// refused (ErrTextForeign) when the group's messages on the partition
	// were last leased to another subject. "" checks nothing (auth off, an
	// admin).
	Holder string
}

// Ack errors reported per item (they are results, not Go errors).
const (
	ErrTextNotFound     = "Message not found"
	ErrTextInvalidLease = "Invalid or expired lease"
	ErrTextNotLeased    = "Message was never delivered to this consumer group"
	// ErrTextOutsideLease: the named lease is live but does not cover the
	// message (it was never delivered under it).
	ErrTextOutsideLease = "Message is not part of this lease"
	// ErrTextLeaseRequired: the message's partition is leased to a consumer
	// for this group, and an ack naming no lease cannot prove it is that one.
	ErrTextLeaseRequired = "leaseId is required: the message is leased to a consumer"
	// ErrTextNoLiveLease: failed and retry give a lease back; with no live
	// lease there is nothing to give (an expired lease counted its attempt).
	ErrTextNoLiveLease = "No live lease: failed and retry need the message's live lease"
	// ErrTextReleased: an earlier item of the same request gave the message
	// back (failed or retry); it is no longer under the lease.
	ErrTextReleased = "Message was released by an earlier item of this request"
	// ErrTextForeign: the message was leased to another subject than the
	// ack's Holder.
	ErrTextForeign = "Forbidden: the message was delivered to another subject"
)

// AckResult reports one acknowledgement, in request order.
type AckResult struct {
	Index         int
	TransactionID string
	Success       bool
	Error         string // "" on success
	Queue         string
	Partition     string
	LeaseReleased bool
	// Pending, with LeaseReleased: the group has messages waiting in the
	// partition after the ack (given back, or pushed meanwhile), so a
	// waiting consumer should look. False means the lease ended with the
	// partition drained for the group.
	Pending bool
	DLQ     bool
	// Dropped: the ack gave the message up (status dlq, or failed past
	// the retry limit) on a queue that keeps no dead letter of it
	// (deadLetterQueue or dlqAfterMaxRetries false): finished for the
	// group with no copy kept. DLQ is false then.
	Dropped bool
	// LeaseID is the lease the ack was applied under: the one it named, or
	// the one its request proved it holds; "" for an ack naming none.
	LeaseID string
	// Idle, on the last item acking a lease that follows its partition:
	// all the lease covers is done and it stays (LeaseReleased false), for
	// the next push to its stream; its holder gives it back once the
	// stream stays idle (poller.Poller.FollowIdle).
	Idle bool
}

// Ack applies acknowledgements in one transaction, in order: each item is
// checked against the state the items before it left (see refusal). A lease
// that a failed or retry item gives back ends after the last item, so a
// batch that fails one message and completes the others of its lease is
// applied whole; the item that gave it back may not be acked again in the
// same request. It costs two round trips: BEGIN with the reads, then the
// writes with COMMIT.
//
// Concurrent calls may share one transaction (see coalescer and
// ackBatcher): each gets exactly the results it would get alone. acks is
// normalized in place (Group and Status defaults), as callers read them
// back with the results.
func (s *Store) Ack(ctx context.Context, acks []Ack) ([]AckResult, error) {
	p, err := s.QueueAck(ctx, acks)
	if err != nil {
		return nil, err
	}
	return p.Wait()
}

// PendingAck is an Ack call queued by QueueAck.
type PendingAck struct {
	s    *Store
	call *coalescedCall[ackReq, []AckResult]
}

// Wait runs the queued acks (merged with others, as Ack does) and returns
// their results. It may be called on another goroutine than QueueAck.
func (p *PendingAck) Wait() ([]AckResult, error) {
	if p.call == nil {
		return []AckResult{}, nil
	}
	return p.s.acks.wait(p.call)
}

// QueueAck queues acks behind every ack queued before it, without waiting:
// acks of one connection queued in the order its client sent them keep
// that order (on the same (partition, group) they run one after another,
// as separate requests), while Wait runs them merged with other requests.
// Input errors come back at once.
func (s *Store) QueueAck(ctx context.Context, acks []Ack) (*PendingAck, error) {
	if len(acks) == 0 {
		return &PendingAck{s: s}, nil
	}
	if err := normalizeAcks(acks); err != nil {
		return nil, err
	}
	req := ackReq{acks: acks, keys: make([]consumerKey, 0, 1), plain: true}
	for _, a := range acks {
		req.plain = req.plain && a.LeaseID != "" && (a.Status == StatusCompleted || a.Status == StatusSuccess)
		if !ValidUUID(a.PartitionID) {
			continue // locks nothing
		}
		// ValidUUID accepts either case; the row is the same.
		k := consumerKey{strings.ToLower(a.PartitionID), a.Group}
		if n := len(req.keys); n == 0 || req.keys[n-1] != k {
			req.keys = append(req.keys, k)
		}
	}
	return &PendingAck{s: s, call: s.acks.enqueue(ctx, req)}, nil
}

// ackReq is one Ack call waiting to be merged: its items, and the
// (partition, group) pairs they lock, in no order, possibly repeated.
// plain: every item completes a message under the lease it names, so the
// call ends no lease but by finishing it (see ackBatcher).
type ackReq struct {
	acks  []Ack
	keys  []consumerKey
	plain bool
}

// ackBatcher admits into one transaction only ack requests whose
// (partition, group) pairs are disjoint from those of every request offered
// before them in the batch; a request that shares one waits for a later
// batch, and so does any later request sharing a pair with it (the pair's
// requests keep their arrival order).
//
// Why disjoint requests, rather than per-request boundaries inside ackTx:
// everything ackTx carries from one item to the next lives in the
// lockedConsumer of the item's pair (the lease live when the request
// started, the offsets given back, the item after which the lease ends),
// and Store.Ack proves no leases (proven is nil; only Transaction passes
// any, and it does not coalesce). So when no two requests share a pair,
// each lockedConsumer sees the items of one request only, and one ackTx
// over the concatenated requests computes for every item exactly what
// ackTx over its own request would: the requests write disjoint consumer
// rows and dead letters, and the message lookup only reads. Keeping the
// boundaries inside ackTx instead would mean ending a released lease
// between two requests on the same row, re-deciding which lease is live
// for the next one, and folding several requests' states into the row's
// one update: more code in the path every ack takes, for a case (one
// consumer acking one lease from two requests at once) that is rare but
// for completions, and costs it no more than one batch of waiting.
//
// Except for plain requests (ackReq.plain: completions, each naming its
// lease), which share a pair with each other: a stream that acks each
// delivery as it comes (a WebSocket subscription whose lease follows its
// partition is handed every push, a message or two, and acks each in its
// own frame) sends one request per push on one pair, and one transaction
// each, one after the other on the row's lock, bounds the pair's acks to
// a few hundred a second on a busy machine: its credit runs out and the
// stream stalls. Their items concatenated compute what each request
// would alone: a completion changes what a later one sees only by
// finishing the lease, and then every offset of that lease is done, so
// an item under it is a repeat (success) either way. The lease stays
// live for the rest of the batch (it ends after the last item) where a
// request alone would find it ended: the same answers, but for an item
// naming an offset outside the lease (ErrTextOutsideLease instead of
// ErrTextInvalidLease). A request with an item of another status, or
// naming no lease (it acts under whatever lease is live when it runs),
// shares no pair; and once a pair's request waits, every later one on the
// pair waits too (their order).
type ackBatcher struct {
	items      int
	first      []consumerKey // the first request's pairs, until a second comes
	firstPlain bool
	// seen: every pair offered so far, from the second request on, and
	// whether only plain requests joined on it (another plain one may).
	seen map[consumerKey]pairUse
}

// pairUse is how a pair was offered in a batch so far.
type pairUse uint8

const (
	pairShared pairUse = iota + 1 // only plain requests joined on it
	pairClosed                    // any later request on it waits
)

// busy marks the pairs of a request still running: a request on one of
// them runs after it.
func (b *ackBatcher) busy(r ackReq) {
	b.remember()
	for _, k := range r.keys {
		b.seen[k] = pairClosed
	}
}

// remember moves the first request's pairs into seen, once a second
// request (or a running one) is to be compared with them.
func (b *ackBatcher) remember() {
	if b.seen == nil {
		b.seen = make(map[consumerKey]pairUse, 2*len(b.first))
		use := pairClosed
		if b.firstPlain {
			use = pairShared
		}
		for _, k := range b.first {
			b.seen[k] = use
		}
	}
}

func (b *ackBatcher) offer(r ackReq) verdict {
	if b.items > 0 && b.items+len(r.acks) > coalesceMaxItems {
		return full
	}
	if b.items == 0 && b.seen == nil {
		b.first, b.firstPlain, b.items = r.keys, r.plain, len(r.acks)
		return join
	}
	b.remember()
	v := join
	for _, k := range r.keys {
		if u := b.seen[k]; u == pairClosed || u == pairShared && !r.plain {
			v = wait
			break
		}
	}
	use := pairClosed
	if v == join && r.plain {
		use = pairShared
	}
	for _, k := range r.keys {
		b.seen[k] = use
	}
	if v == join {
		b.items += len(r.acks)
	}
	return v
}

// newAckCoalescer merges acks: run (ackNow) gets the items of every request
// of a batch in one slice.
func newAckCoalescer(flushers int, run func(context.Context, []Ack) ([]AckResult, error)) *coalescer[ackReq, []AckResult] {
	return newCoalescer(flushers, func() batcher[ackReq] { return &ackBatcher{} },
		mergedRun(run, func(r ackReq) []Ack { return r.acks }, func(r *AckResult, i int) { r.Index = i }))
}

// ackNow runs one ack transaction on a connection of its own.
func (s *Store) ackNow(ctx context.Context, acks []Ack) ([]AckResult, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acknowledging: %w", err)
	}
	defer conn.Release()
	out, err := s.ackTx(ctx, conn, acks, nil, true)
	if err != nil {
		rollbackIfOpen(ctx, conn)
	}
	return out, err
}

// normalizeAcks validates acks and fills in their defaults, in place.
func normalizeAcks(acks []Ack) error {
	for i := range acks {
		a := &acks[i]
		if a.Group == "" {
			a.Group = DefaultGroup
		}
		if err := ValidateName("consumerGroup", a.Group); err != nil {
			return err
		}
		if err := errors.Join(validText("transactionId", a.TransactionID), validText("error", a.Error)); err != nil {
			return inputErrorf("%v", err)
		}
		if a.Status == "" {
			a.Status = StatusCompleted
		}
	}
	return nil
}

// ackResolveSQL finds each acked message by (partition, transaction id).
// The lookup is a scalar subquery so that it always probes the unique
// (partition_id, transaction_id) index: as a join, the generic plan may
// scan the whole partition by the primary key and filter, which costs
// O(partition size) per ack.
const ackResolveSQL = `-- herald:ack_resolve
SELECT t.ord, coalesce(q.name, ''), coalesce(p.name, ''),
       (SELECT m.seq FROM messages m WHERE m.partition_id = p.id AND m.transaction_id = t.txid)
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(pid, txid, ord)
LEFT JOIN partitions p ON p.id = t.pid::uuid
LEFT JOIN queues q ON q.id = p.queue_id
ORDER BY t.ord`

var ackLockSQL = `-- herald:ack_lock
SELECT c.partition_id::text, c.consumer_group, c.cursor, c.done, coalesce(c.lease_id::text, ''),
       coalesce(c.lease_expires_at > now(), false), coalesce(c.lease_from, 0), coalesce(` + leaseEnd("c") + `, 0),
       c.attempts, c.attempt_seq, c.delivered_to, c.last_offset, q.retry_limit, coalesce(c.lease_subject, ''),
       c.seek_from, c.seek_to, ` + deadPolicyColumns + `,
       coalesce(c.follow_lease = c.lease_id, false), q.lease_time, coalesce(c.lease_owner, '')
FROM (SELECT DISTINCT pid::uuid AS pid, grp FROM unnest($1::text[], $2::text[]) AS k(pid, grp)) k
JOIN consumers c ON c.partition_id = k.pid AND c.consumer_group = k.grp
JOIN queues q ON q.id = c.queue_id -- the row's own copy: no partitions probe per row (a quarter of the statement)
ORDER BY c.partition_id, c.consumer_group
FOR UPDATE OF c`

// ackTx acknowledges on q in three steps: readAck locks the consumer rows
// and finds the messages, decideAck (no database) applies the items to the
// rows in memory, writeAck writes what changed. standalone opens and
// commits its own transaction in the same round trips as the reads and
// writes; otherwise q is a transaction the caller owns. proven are lease
// ids the request showed it holds (a transaction's requiredLeases): an ack
// naming no lease acts under one of them as if it had named it.
func (s *Store) ackTx(ctx context.Context, q querier, acks []Ack, proven []string, standalone bool) ([]AckResult, error) {
	if len(acks) == 0 {
		return []AckResult{}, nil
	}
	if err := normalizeAcks(acks); err != nil {
		return nil, err
	}
	st, err := readAck(ctx, q, acks, standalone)
	if err != nil {
		return nil, err
	}
	plan, err := decideAck(st, acks, proven)
	if err != nil {
		return nil, err
	}
	if err := s.writeAck(ctx, q, plan, standalone); err != nil {
		return nil, err
	}
	return plan.results, nil
}

// readAck is ackTx's one read round trip (BEGIN first when standalone): it
// finds each item's message and locks the consumer rows the items name,
// in key order.
func readAck(ctx context.Context, q querier, acks []Ack, standalone bool) (ackState, error) {
	pids := make([]*string, len(acks))
	txids := make([]string, len(acks))
	var lockP, lockG []string
	for i := range acks {
		a := &acks[i]
		txids[i] = a.TransactionID
		// A malformed id cannot match; NULL keeps it from becoming a cast error.
		if ValidUUID(a.PartitionID) {
			pids[i] = &a.PartitionID
			lockP = append(lockP, a.PartitionID)
			lockG = append(lockG, a.Group)
		}
	}
	b := &pgx.Batch{}
	if standalone {
		b.Queue("BEGIN")
	}
	b.Queue(ackResolveSQL, pids, txids)
	// A nack may end a lease that follows its partition: the partitions'
	// share locks wait for a push in flight there, which may be handing
	// that lease messages without touching the row (pushes wait for the
	// nack in turn), so the lease's end read below covers them.
	// Partitions before consumer rows: the push's lock order.
	nacked := nackedPartitions(acks)
	if len(nacked) > 0 {
		b.Queue(readyLockSQL, nacked)
	}
	b.Queue(ackLockSQL, lockP, lockG)
	br := q.SendBatch(ctx, b)
	st, err := readAckResults(br, len(acks), standalone, len(nacked) > 0)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("locking consumers: %w", cerr)
	}
	return st, err
}

// nackedPartitions lists the partitions of the items that give a lease
// back (failed, retry), for readAck's share locks.
func nackedPartitions(acks []Ack) []string {
	var out []string
	for _, a := range acks {
		if (a.Status == StatusFailed || a.Status == StatusRetry) && ValidUUID(a.PartitionID) {
			out = append(out, a.PartitionID)
		}
	}
	return out
}

// readAckResults reads readAck's batch.
func readAckResults(br pgx.BatchResults, n int, standalone, nacked bool) (ackState, error) {
	st := ackState{msgs: make([]ackedMessage, n), locked: map[consumerKey]*lockedConsumer{}}
	if standalone {
		if _, err := br.Exec(); err != nil {
			return st, fmt.Errorf("beginning: %w", err)
		}
	}
	rows, err := br.Query()
	if err != nil {
		return st, fmt.Errorf("resolving acked messages: %w", err)
	}
	for rows.Next() {
		var ord int64
		var m ackedMessage
		if err := rows.Scan(&ord, &m.queue, &m.partition, &m.seq); err != nil {
			rows.Close()
			return st, fmt.Errorf("resolving acked messages: %w", err)
		}
		st.msgs[ord-1] = m
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return st, fmt.Errorf("resolving acked messages: %w", err)
	}
	if nacked {
		if _, err := br.Exec(); err != nil {
			return st, fmt.Errorf("locking nacked partitions: %w", err)
		}
	}
	rows, err = br.Query()
	if err != nil {
		return st, fmt.Errorf("locking consumers: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k consumerKey
		lc := &lockedConsumer{}
		var live bool
		if err := rows.Scan(&k.partitionID, &k.group, &lc.st.cursor, &lc.st.done, &lc.st.leaseID, &live,
			&lc.st.leaseFrom, &lc.st.leaseTo, &lc.st.attempts, &lc.st.attemptSeq, &lc.deliveredTo, &lc.lastOffset, &lc.retryLimit,
			&lc.subject, &lc.seekFrom, &lc.seekTo, &lc.dead.drop, &lc.dead.dropExhausted,
			&lc.follows, &lc.leaseTime, &lc.owner); err != nil {
			return st, fmt.Errorf("locking consumers: %w", err)
		}
		if live {
			lc.liveLease = lc.st.leaseID
		}
		// A following lease covers the partition's last offset: the row's
		// copy of it is written with the lease's new end.
		lc.follows = lc.follows && live
		if lc.follows {
			lc.lastOffset = max(lc.lastOffset, lc.st.leaseTo)
		}
		st.locked[k] = lc
	}
	if err := rows.Err(); err != nil {
		return st, fmt.Errorf("locking consumers: %w", err)
	}
	return st, nil
}

// writeAck is ackTx's one write round trip: the dead letters, the changed
// consumer rows, and COMMIT when standalone.
func (s *Store) writeAck(ctx context.Context, q querier, plan ackPlan, standalone bool) error {
	var u consumerUpdates
	for _, r := range plan.rows {
		if r.renew >= 0 {
			// A following lease's time starts again with each ack.
			u.add(r.key.partitionID, r.key.group, r.st, r.renew, r.owner, r.subject)
			continue
		}
		u.add(r.key.partitionID, r.key.group, r.st, -1, s.cfg.InstanceID, "")
	}
	w := &pgx.Batch{}
	queueDeadLetters(w, plan.dead)
	u.queue(w)
	if standalone {
		w.Queue("COMMIT")
		if pids, groups := caughtUp(plan.rows); len(pids) > 0 {
			// Errors of the marking come after the acks committed: not theirs.
			n := w.Len()
			queueReady(w, pids, readyRowsPendingSQL, pids, groups)
			br := q.SendBatch(ctx, w)
			for range n {
				if _, err := br.Exec(); err != nil {
					_ = br.Close()
					return fmt.Errorf("applying acknowledgements: %w", err)
				}
			}
			pending, err := readMarked(br)
			if cerr := br.Close(); err == nil {
				err = cerr
			}
			ok := err == nil
			if !ok {
				// The marking's transaction may be left open: end it.
				_, _ = q.Exec(context.WithoutCancel(ctx), "ROLLBACK")
				pending, ok = s.markRowsPending(context.WithoutCancel(ctx), pids, groups)
			}
			plan.settlePending(pending, ok)
			return nil
		}
	}
	if w.Len() == 0 {
		return nil
	}
	if err := q.SendBatch(ctx, w).Close(); err != nil {
		if standalone {
			err = commitUnknown(err) // it carried the COMMIT
		}
		return fmt.Errorf("applying acknowledgements: %w", err)
	}
	return nil
}

// deadLetter is a message to copy into dead_letters, if its queue keeps
// it (deadPolicy).
type deadLetter struct {
	partitionID string
	seq         int64
	group, err  string
	retries     int
	exhausted   bool // it failed past its queue's retry limit
}

// deadPolicy is what a queue does with a message a consumer group gives up
// on (Options.DeadLetterQueue, Options.DLQAfterMaxRetries): it keeps a
// dead letter of it, or drops it (finished for the group all the same,
// with no copy kept). The zero value keeps everything, as the defaults do:
// a row read without the queue's flags never drops a message.
type deadPolicy struct {
	drop          bool // deadLetterQueue false: no dead letter is kept
	dropExhausted bool // dlqAfterMaxRetries false: none for a message past its retry limit
}

// deadPolicyColumns read a deadPolicy from the queue row q.
const deadPolicyColumns = `NOT q.dead_letter_queue, NOT q.dlq_after_max_retries`

// keeps reports whether a message given up on is dead-lettered (true) or
// dropped; exhausted: it failed past the retry limit.
func (p deadPolicy) keeps(exhausted bool) bool {
	return !p.drop && (!exhausted || !p.dropExhausted)
}

const deadLetterSQL = `-- herald:dead_letter
INSERT INTO dead_letters (queue_id, partition_id, seq, message_id, transaction_id, trace_id, producer_sub,
                          payload, created_at, consumer_group, error, retry_count)
SELECT p.queue_id, m.partition_id, m.seq, m.id, m.transaction_id, m.trace_id, m.producer_sub,
       m.payload, m.created_at, d.grp, nullif(d.err, ''), d.retries
FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::int[], $6::bool[])
     AS d(pid, seq, grp, err, retries, exhausted)
JOIN messages m ON m.partition_id = d.pid::uuid AND m.seq = d.seq
JOIN partitions p ON p.id = m.partition_id
JOIN queues q ON q.id = p.queue_id
WHERE q.dead_letter_queue AND (q.dlq_after_max_retries OR NOT d.exhausted) -- deadPolicy.keeps`

func insertDeadLetters(ctx context.Context, q querier, dead []deadLetter) error {
	if len(dead) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	queueDeadLetters(b, dead)
	if err := q.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("dead-lettering %d messages: %w", len(dead), err)
	}
	return nil
}

// queueDeadLetters adds the dead-letter insert for dead to b.
func queueDeadLetters(b *pgx.Batch, dead []deadLetter) {
	if len(dead) == 0 {
		return
	}
	pids := make([]string, len(dead))
	seqs := make([]int64, len(dead))
	grps := make([]string, len(dead))
	errs := make([]string, len(dead))
	retries := make([]int32, len(dead))
	exhausted := make([]bool, len(dead))
	for i, d := range dead {
		pids[i], seqs[i], grps[i], errs[i], retries[i] = d.partitionID, d.seq, d.group, d.err, int32(d.retries)
		exhausted[i] = d.exhausted
	}
	b.Queue(deadLetterSQL, pids, seqs, grps, errs, retries, exhausted)
}
