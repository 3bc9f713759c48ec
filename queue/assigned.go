package queue

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// Assignment is one (partition, group) pair a poll cycle decided to lease
// for one waiting consumer.
type Assignment struct {
	Intention   int // the caller's id for the consumer; results are keyed by it
	PartitionID string
	Group       string
	// Limit is the most messages to take from this partition; Total the
	// most the intention takes over all its assignments (its batch).
	Limit   int
	Total   int
	AutoAck bool
	LeaseID string // one per intention, shared by its assignments; ignored with AutoAck
	Subject string // who the consumer is (its token's sub); "" for none
	// Stream: leased for a stream of this instance (a WebSocket or SSE
	// subscription), which dies with the process; false: for a client that
	// holds the lease itself (a long-poll). See Store.leaseOwner.
	Stream bool
}

// popAssignedSQL leases every assigned (partition, group) and returns their
// messages, in one statement:
//
//	a       the assignments
//	locked  their consumer rows, re-checked (work, no live lease, past the
//	        window) and locked; rows another pop holds are skipped
//	st      an expired lease charged as a failed attempt of its first
//	        pending offset (one that would dead-letter never gets here: the
//	        pre-flight sends it to Pop, as a row whose next message is
//	        past the queue's ttl, nextExpired)
//	cand    up to Limit messages after each cursor, skipping offsets done
//	        out of order, cut at the first one still inside its delay (with
//	        no delay, none: a push that committed after this statement's
//	        now() but before its snapshot has a created_at after now())
//	picked  at most Total per intention, in assignment order
//	ranges  each locked row with the range picked from it (none: NULL),
//	        and, with autoAck, the cursor it moves to; one row per locked
//	        row, so that upd joins it alone (joined to st there, it was a
//	        nested loop over the ranges, a third of the statement's time)
//	upd     the new lease (or, with autoAck, the advanced cursor)
//
// #nosec G101 -- SQL text; "lease" is not a credential.
var popAssignedSQL = `-- herald:pop_assigned
WITH a AS (
	SELECT * FROM unnest($1::int[], $2::text[], $3::text[], $4::int[], $5::int[], $6::bool[], $7::text[], $9::text[],
	                     $8::text[])
	       WITH ORDINALITY AS a(intention, pid, grp, lim, total, auto, lease, subj, owner, ord)
), locked AS (
	SELECT c.partition_id, c.consumer_group, c.cursor, c.done, c.attempts, c.attempt_seq, p.last_offset,
	       (c.lease_id IS NOT NULL AND ` + leaseEnd("c") + ` > c.cursor) AS expired,
	       a.intention, a.lim, a.total, a.auto, a.lease, a.subj, a.owner, a.ord,
	       q.name AS qname, q.lease_time, q.delayed_processing, p.name AS pname
	FROM a
	JOIN consumers c ON c.partition_id = a.pid::uuid AND c.consumer_group = a.grp
	JOIN partitions p ON p.id = c.partition_id
	JOIN queues q ON q.id = p.queue_id
	WHERE c.last_offset > c.cursor
	  AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= now())
	  AND (q.window_buffer = 0 OR p.last_push_at <= now() - make_interval(secs => q.window_buffer))
	  AND NOT (c.lease_id IS NOT NULL AND ` + leaseEnd("c") + ` > c.cursor
	           AND (CASE WHEN c.attempt_seq = c.cursor + 1 THEN c.attempts ELSE 0 END) >= q.retry_limit)
	  AND NOT ` + nextExpired("q") + `
	FOR UPDATE OF c SKIP LOCKED
` + popLeaseSQL

// popClaimSQL leases like popAssignedSQL for ONE intention, but claims
// its partitions straight from the queue's ready rows (one range of
// consumers_ready, as pop_lock reads it) instead of from assignments a
// pre-flight made: for a subscription that is alone on its queue and group
// and took all it could last time, the pre-flight would only have listed
// the same rows. A row whose expired lease would dead-letter is left for the
// pre-flight's path (Pop), as in popAssignedSQL.
// $1 queue, $2 group, $3 partitions, $4 per partition, $5 total, $6 autoAck,
// $7 lease id, $8 owner (Store.leaseOwner), $9 intention, $10 subject.
var popClaimSQL = `-- herald:pop_claim
WITH locked AS (
	SELECT c.partition_id, c.consumer_group, c.cursor, c.done, c.attempts, c.attempt_seq, p.last_offset,
	       (c.lease_id IS NOT NULL AND ` + leaseEnd("c") + ` > c.cursor) AS expired,
	       $9::int AS intention, $4::int AS lim, $5::int AS total, $6::bool AS auto, $7::text AS lease,
	       $10::text AS subj, $8::text AS owner,
	       row_number() OVER (ORDER BY c.lease_expires_at NULLS FIRST, c.leased_at NULLS FIRST, c.partition_id) AS ord,
	       q.name AS qname, q.lease_time, q.delayed_processing, p.name AS pname
	FROM queues q
	CROSS JOIN LATERAL (
		SELECT c.* FROM consumers c
		WHERE (c.partition_id, c.consumer_group) IN (
			-- In claim order, as many as the messages they wait with cover
			-- the total: no row is locked that could add nothing.
			SELECT w.partition_id, w.consumer_group FROM (
				SELECT c.partition_id, c.consumer_group, least(c.last_offset - c.cursor, $4) AS here,
				       sum(least(c.last_offset - c.cursor, $4))
				           OVER (ORDER BY c.lease_expires_at NULLS FIRST, c.leased_at NULLS FIRST, c.partition_id) AS upto
				FROM consumers c
				WHERE c.queue_id = q.id AND c.consumer_group = $2 AND ` + claimableRow + `
				ORDER BY c.lease_expires_at NULLS FIRST, c.leased_at NULLS FIRST, c.partition_id
				LIMIT $3
			) w WHERE w.upto - w.here < $5)
		  AND ` + claimableRow + `
		FOR UPDATE SKIP LOCKED
	) c
	JOIN partitions p ON p.id = c.partition_id
	WHERE q.name = $1
` + popLeaseSQL

// claimableRow is what popClaimSQL asks of a consumer row c of the queue q,
// before and again after it locks the row.
var claimableRow = `c.last_offset > c.cursor AND ` + leasableNow("q") + `
	AND NOT (c.lease_id IS NOT NULL AND ` + leaseEnd("c") + ` > c.cursor
	         AND (CASE WHEN c.attempt_seq = c.cursor + 1 THEN c.attempts ELSE 0 END) >= q.retry_limit)
	AND NOT ` + nextExpired("q")

// popLeaseSQL is what popAssignedSQL and popClaimSQL share once their
// consumer rows are locked (CTE locked, with each row's subj and lease
// owner).
const popLeaseSQL = `), st AS (
	SELECT l.*,
	       CASE WHEN l.expired THEN (CASE WHEN l.attempt_seq = l.cursor + 1 THEN l.attempts + 1 ELSE 1 END)
	            ELSE l.attempts END AS att,
	       CASE WHEN l.expired THEN l.cursor + 1 ELSE l.attempt_seq END AS aseq
	FROM locked l
), cand AS (
	SELECT s.intention, s.ord, s.total, m.seq, m.id, m.transaction_id, m.trace_id, m.producer_sub, m.payload,
	       m.created_at, CASE WHEN m.seq = s.aseq THEN s.att ELSE 0 END AS retry_count,
	       bool_and(s.delayed_processing = 0 OR m.created_at <= now() - make_interval(secs => s.delayed_processing))
	           OVER (PARTITION BY s.ord ORDER BY m.seq) AS visible
	FROM st s CROSS JOIN LATERAL (
		SELECT * FROM messages m
		WHERE m.partition_id = s.partition_id AND m.seq > s.cursor AND m.seq <> ALL (s.done)
		ORDER BY m.seq LIMIT s.lim
	) m
), picked AS (
	SELECT * FROM (
		SELECT c.*, row_number() OVER (PARTITION BY c.intention ORDER BY c.ord, c.seq) AS n FROM cand c WHERE c.visible
	) c WHERE c.n <= c.total
), ranges AS MATERIALIZED (
	SELECT s.partition_id, s.consumer_group, s.expired, s.auto, s.att, s.aseq, s.lease, s.subj, s.owner, s.lease_time,
	       r.ord, r.lfrom, r.lto,
	       CASE WHEN s.auto AND r.ord IS NOT NULL THEN r.lto + coalesce((SELECT count(*) FROM (
	           SELECT d, row_number() OVER (ORDER BY d) AS rn FROM unnest(s.done) d WHERE d > r.lto) x
	           WHERE x.d = r.lto + x.rn), 0) END AS auto_cursor
	FROM st s LEFT JOIN (SELECT ord, min(seq) AS lfrom, max(seq) AS lto FROM picked GROUP BY ord) r ON r.ord = s.ord
), upd AS (
	UPDATE consumers c SET
		attempts = CASE WHEN r.auto AND r.ord IS NOT NULL AND r.aseq <= r.auto_cursor THEN 0 ELSE r.att END,
		attempt_seq = CASE WHEN r.auto AND r.ord IS NOT NULL AND r.aseq <= r.auto_cursor THEN 0 ELSE r.aseq END,
		cursor = CASE WHEN r.auto AND r.ord IS NOT NULL THEN r.auto_cursor ELSE c.cursor END,
		done = CASE WHEN r.auto AND r.ord IS NOT NULL
		            THEN ARRAY(SELECT d FROM unnest(c.done) d WHERE d > r.auto_cursor ORDER BY d) ELSE c.done END,
		lease_id = CASE WHEN r.ord IS NULL OR r.auto THEN NULL ELSE r.lease::uuid END,
		lease_owner = CASE WHEN r.ord IS NULL OR r.auto THEN NULL ELSE r.owner END,
		lease_subject = CASE WHEN r.ord IS NULL OR r.auto THEN c.lease_subject ELSE r.subj END,
		lease_expires_at = CASE WHEN r.ord IS NULL OR r.auto THEN NULL ELSE now() + make_interval(secs => r.lease_time) END,
		lease_from = CASE WHEN r.ord IS NULL OR r.auto THEN NULL ELSE r.lfrom END,
		lease_to = CASE WHEN r.ord IS NULL OR r.auto THEN NULL ELSE r.lto END,
		delivered_to = greatest(c.delivered_to, CASE WHEN r.ord IS NULL OR r.auto THEN 0 ELSE r.lto END),
		leased_at = CASE WHEN r.ord IS NULL THEN c.leased_at ELSE now() END
	FROM ranges r
	WHERE c.partition_id = r.partition_id AND c.consumer_group = r.consumer_group
	  AND (r.ord IS NOT NULL OR r.expired) -- a row given nothing and charged nothing stays as it was
)
SELECT p.intention, s.partition_id::text, s.pname, s.qname, s.consumer_group, CASE WHEN s.auto THEN '' ELSE s.lease END,
       p.seq, p.id::text, p.transaction_id, coalesce(p.trace_id::text, ''), coalesce(p.producer_sub, ''),
       p.payload::text, p.created_at, p.retry_count, s.last_offset
FROM picked p JOIN st s ON s.ord = p.ord
ORDER BY p.intention, p.ord, p.seq`

// PopAssigned leases every assignment in one statement and returns the
// messages per intention. An assignment whose partition turned out to be
// taken, empty or blocked since the pre-flight yields nothing; an intention
// with no messages is absent from the result. The caller guarantees that no
// (partition, group) appears twice.
func (s *Store) PopAssigned(ctx context.Context, as []Assignment) (map[int]*PopResult, error) {
	if len(as) == 0 {
		return nil, nil
	}
	// The same pair twice in one statement would read the same messages
	// twice: keep the first, whatever the caller promised.
	type pair struct{ pid, group string }
	seen := make(map[pair]bool, len(as))
	uniq := as[:0:0]
	for _, a := range as {
		g := a.Group
		if g == "" {
			g = DefaultGroup
		}
		if k := (pair{a.PartitionID, g}); !seen[k] {
			seen[k] = true
			uniq = append(uniq, a)
		}
	}
	as = uniq
	n := len(as)
	intention, lim, total := make([]int32, n), make([]int32, n), make([]int32, n)
	pid, grp, lease := make([]string, n), make([]string, n), make([]string, n)
	auto, subj, owner := make([]bool, n), make([]*string, n), make([]string, n)
	for i, a := range as {
		g := a.Group
		if g == "" {
			g = DefaultGroup
		}
		intention[i], pid[i], grp[i], lim[i], total[i], auto[i], lease[i], subj[i] =
			int32(a.Intention), a.PartitionID, g, int32(a.Limit), int32(a.Total), a.AutoAck, a.LeaseID, optString(a.Subject)
		owner[i] = s.leaseOwner(a.Stream)
		if a.AutoAck {
			lease[i] = NewID() // unused, but keeps the uuid cast valid
		}
	}
	rows, err := s.pool.Query(ctx, popAssignedSQL, intention, pid, grp, lim, total, auto, lease, owner, subj)
	if err != nil {
		return nil, fmt.Errorf("popping assigned partitions: %w", err)
	}
	out, err := s.readLeased(ctx, rows)
	if err == nil {
		s.markMoved(ctx, out, slices.Contains(auto, true))
	}
	return out, err
}

// Claim is what PopClaim leases for one intention: up to Partitions of a
// queue's ready partitions for Group, Limit messages from each, Total in all.
type Claim struct {
	Intention  int
	Queue      string
	Group      string
	Partitions int
	Limit      int
	Total      int
	AutoAck    bool
	LeaseID    string // ignored with AutoAck
	Subject    string // who the consumer is (its token's sub); "" for none
	Stream     bool   // leased for a stream of this instance (Assignment.Stream)
}

// PopClaim leases for one intention in one statement, claiming partitions
// from the queue's ready rows in the order a pop claims them, with no
// pre-flight (popClaimSQL). The result is keyed by c.Intention, absent when
// nothing was leased. A partition whose expired lease would dead-letter is
// never claimed here: the caller's pre-flight path handles it.
func (s *Store) PopClaim(ctx context.Context, c Claim) (map[int]*PopResult, error) {
	g := c.Group
	if g == "" {
		g = DefaultGroup
	}
	lease := c.LeaseID
	if c.AutoAck || lease == "" {
		lease = NewID() // unused with autoAck, but keeps the uuid cast valid
	}
	n := min(max(c.Partitions, 1), MaxPartitions)
	rows, err := s.pool.Query(ctx, popClaimSQL, c.Queue, g, int32(n), int32(max(c.Limit, 1)), // #nosec G115 -- bounded
		int32(max(c.Total, 1)), c.AutoAck, lease, s.leaseOwner(c.Stream), int32(c.Intention), // #nosec G115 -- a small id
		optString(c.Subject))
	if err != nil {
		return nil, fmt.Errorf("claiming partitions: %w", err)
	}
	out, err := s.readLeased(ctx, rows)
	if err == nil {
		s.markMoved(ctx, out, c.AutoAck)
	}
	return out, err
}

// readLeased reads what popLeaseSQL returns, per intention: the messages in
// order, the partitions each claimed, and whether one it leased from holds
// more.
func (s *Store) readLeased(ctx context.Context, rows pgx.Rows) (map[int]*PopResult, error) {
	defer rows.Close()
	out := map[int]*PopResult{}
	seenPart := map[int]map[string]bool{}
	// Rows come in offset order per assignment, one partition each: the
	// last one read of a run tells whether its partition holds more.
	var tail struct {
		res  *PopResult
		pid  string
		more bool
	}
	endRun := func() {
		if tail.res != nil && tail.more {
			tail.res.More = true
		}
	}
	var bad []Message
	for rows.Next() {
		var id int32
		var m Message
		var payload string
		var lastOffset int64
		if err := rows.Scan(&id, &m.PartitionID, &m.Partition, &m.Queue, &m.Group, &m.LeaseID, &m.Offset, &m.ID,
			&m.TransactionID, &m.TraceID, &m.ProducerSub, &payload, &m.CreatedAt, &m.RetryCount, &lastOffset); err != nil {
			return nil, fmt.Errorf("reading assigned messages: %w", err)
		}
		plain, ok := s.open(payload, sealRef{m.PartitionID, m.TransactionID, m.ID})
		if !ok {
			bad = append(bad, m)
			continue
		}
		m.Data = json.RawMessage(plain)
		res := out[int(id)]
		if res == nil {
			res = &PopResult{Queue: m.Queue, Partition: m.Partition, PartitionID: m.PartitionID, LeaseID: m.LeaseID, Group: m.Group}
			out[int(id)] = res
			seenPart[int(id)] = map[string]bool{}
		}
		if !seenPart[int(id)][m.PartitionID] {
			seenPart[int(id)][m.PartitionID] = true
			res.PartitionsClaimed++
		}
		res.Messages = append(res.Messages, m)
		if tail.res != res || tail.pid != m.PartitionID {
			endRun()
		}
		tail.res, tail.pid, tail.more = res, m.PartitionID, lastOffset > m.Offset
	}
	endRun()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading assigned messages: %w", err)
	}
	rows.Close()
	s.deadLetterUndecryptable(ctx, bad)
	return out, nil
}

// deadLetterUndecryptable moves messages the coalesced pop leased (or, with
// autoAck, passed) but could not decrypt to the dead-letter queue, so they
// are never delivered as data. A leased one is acked with status dlq under
// its lease; an auto-acked one is past the cursor already and only copied.
// A failure is logged, not returned: the decrypted messages of the same
// statement are delivered, and a leased one comes back when its lease
// expires and is dead-lettered then.
func (s *Store) deadLetterUndecryptable(ctx context.Context, bad []Message) {
	if len(bad) == 0 {
		return
	}
	var acks []Ack
	var copied []deadLetter
	for _, m := range bad {
		s.log.Warn().Str("queue", m.Queue).Str("partitionId", m.PartitionID).Str("messageId", m.ID).
			Int64("offset", m.Offset).Str("group", m.Group).Msg("payload failed to decrypt: dead-lettered, not delivered")
		if m.LeaseID == "" {
			copied = append(copied, deadLetter{partitionID: m.PartitionID, seq: m.Offset, group: m.Group, err: DecryptError,
				retries: m.RetryCount})
			continue
		}
		acks = append(acks, Ack{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID,
			Status: StatusDLQ, Group: m.Group, Error: DecryptError})
	}
	n := 0
	var given PopResult // what Config.OnGivenUp is told, as of a Pop's
	if err := insertDeadLetters(ctx, s.pool, copied); err != nil {
		s.log.Error().Err(err).Msg("dead-lettering undecryptable auto-acked messages failed")
	} else {
		n += len(copied)
		for _, m := range bad {
			if m.LeaseID == "" {
				given.DeadLettered = countIn(given.DeadLettered, m.Queue)
			}
		}
	}
	if len(acks) > 0 {
		res, err := s.Ack(ctx, acks)
		if err != nil {
			s.log.Error().Err(err).Msg("dead-lettering undecryptable messages failed")
		}
		for _, r := range res {
			switch {
			case !r.Success:
				s.log.Error().Str("transactionId", r.TransactionID).Str("error", r.Error).
					Msg("dead-lettering an undecryptable message was refused")
				continue
			case r.DLQ:
				given.DeadLettered = countIn(given.DeadLettered, r.Queue)
			case r.Dropped:
				given.Dropped = countIn(given.Dropped, r.Queue)
			}
			n++
		}
	}
	s.countDecryptFailures(n)
	if f := s.cfg.OnGivenUp; f != nil && given.gaveUp() {
		f(&given)
	}
}

// releaseLeaseSQL ends lease $1 on every row it spans, locking them in
// key order first (as extendLeaseSQL, and for the same deadlock). A row
// whose lease followed its partition (pushes here handed it their
// messages without writing the row) takes the partition's last offset as
// its copy, so the messages after its cursor are ready for a pop;
// releaseLeaseLockSQL runs first.
const releaseLeaseSQL = `-- herald:release_lease
WITH lk AS (
	SELECT c.partition_id, c.consumer_group FROM consumers c WHERE c.lease_id = $1::uuid
	ORDER BY c.partition_id, c.consumer_group
	FOR NO KEY UPDATE OF c
)
UPDATE consumers c SET lease_id = NULL, lease_owner = NULL, lease_expires_at = NULL, lease_from = NULL, lease_to = NULL,
	` + copyLastOffset + `
FROM lk
WHERE c.partition_id = lk.partition_id AND c.consumer_group = lk.consumer_group AND c.lease_id = $1::uuid`

// copyLastOffset sets the copy of its partition's last offset of a row c
// whose lease ends, when the lease followed the partition.
const copyLastOffset = `last_offset = CASE WHEN c.follow_lease = c.lease_id THEN greatest(c.last_offset,
		(SELECT lp.last_offset FROM partitions lp WHERE lp.id = c.partition_id)) ELSE c.last_offset END`

// releaseLeaseLockSQL share-locks the partitions lease $1 spans, in id
// order, before releaseLeaseSQL (a statement of its own, so that the
// release reads their last offsets after the lock): a push in flight on
// one, which may be handing the lease messages without writing its row,
// commits first. Partitions before consumer rows: the push's lock order.
const releaseLeaseLockSQL = `-- herald:release_lease_lock
SELECT count(*) FROM (SELECT 1 FROM partitions WHERE id IN (SELECT partition_id FROM consumers WHERE lease_id = $1::uuid)
	ORDER BY id FOR SHARE) x`

// ReleaseLease gives the (partition, group) pairs held under leaseID back at
// once, without counting a failed attempt: for a consumer that went away
// before it received what was leased for it.
func (s *Store) ReleaseLease(ctx context.Context, leaseID string) error {
	if !ValidUUID(leaseID) {
		return nil
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(releaseLeaseLockSQL, leaseID)
		b.Queue(releaseLeaseSQL, leaseID)
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return fmt.Errorf("releasing lease %s: %w", leaseID, err)
	}
	return nil
}
