package queue

import (
	"context"
	"encoding/json"
	"fmt"
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
}

// popAssignedSQL leases every assigned (partition, group) and returns their
// messages, in one statement:
//
//	a       the assignments
//	locked  their consumer rows, re-checked (work, no live lease, past the
//	        window) and locked; rows another pop holds are skipped
//	st      an expired lease charged as a failed attempt of its first
//	        pending offset (one that would dead-letter never gets here: the
//	        pre-flight sends it to Pop)
//	cand    up to Limit messages after each cursor, skipping offsets done
//	        out of order, cut at the first one still inside its delay
//	picked  at most Total per intention, in assignment order
//	upd     the new lease (or, with autoAck, the advanced cursor)
//
// #nosec G101 -- SQL text; "lease" is not a credential.
const popAssignedSQL = `-- herald:pop_assigned
WITH a AS (
	SELECT * FROM unnest($1::int[], $2::text[], $3::text[], $4::int[], $5::int[], $6::bool[], $7::text[])
	       WITH ORDINALITY AS a(intention, pid, grp, lim, total, auto, lease, ord)
), locked AS (
	SELECT c.partition_id, c.consumer_group, c.cursor, c.done, c.attempts, c.attempt_seq, c.last_offset,
	       (c.lease_id IS NOT NULL AND c.lease_to > c.cursor) AS expired,
	       a.intention, a.lim, a.total, a.auto, a.lease, a.ord,
	       q.name AS qname, q.lease_time, q.delayed_processing, p.name AS pname
	FROM a
	JOIN consumers c ON c.partition_id = a.pid::uuid AND c.consumer_group = a.grp
	JOIN partitions p ON p.id = c.partition_id
	JOIN queues q ON q.id = p.queue_id
	WHERE c.last_offset > c.cursor
	  AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= now())
	  AND (q.window_buffer = 0 OR p.last_push_at <= now() - make_interval(secs => q.window_buffer))
	  AND NOT (c.lease_id IS NOT NULL AND c.lease_to > c.cursor
	           AND (CASE WHEN c.attempt_seq = c.cursor + 1 THEN c.attempts ELSE 0 END) >= q.retry_limit)
	FOR UPDATE OF c SKIP LOCKED
), st AS (
	SELECT l.*,
	       CASE WHEN l.expired THEN (CASE WHEN l.attempt_seq = l.cursor + 1 THEN l.attempts + 1 ELSE 1 END)
	            ELSE l.attempts END AS att,
	       CASE WHEN l.expired THEN l.cursor + 1 ELSE l.attempt_seq END AS aseq
	FROM locked l
), cand AS (
	SELECT s.intention, s.ord, s.total, m.seq, m.id, m.transaction_id, m.trace_id, m.producer_sub, m.payload,
	       m.created_at, CASE WHEN m.seq = s.aseq THEN s.att ELSE 0 END AS retry_count,
	       bool_and(m.created_at <= now() - make_interval(secs => s.delayed_processing))
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
	SELECT r.ord, r.lfrom, r.lto,
	       r.lto + coalesce((SELECT count(*) FROM (
	           SELECT d, row_number() OVER (ORDER BY d) AS rn FROM unnest(s.done) d WHERE d > r.lto) x
	           WHERE x.d = r.lto + x.rn), 0) AS auto_cursor
	FROM (SELECT ord, min(seq) AS lfrom, max(seq) AS lto FROM picked GROUP BY ord) r
	JOIN st s ON s.ord = r.ord
), upd AS (
	UPDATE consumers c SET
		attempts = CASE WHEN s.auto AND r.ord IS NOT NULL AND s.aseq <= r.auto_cursor THEN 0 ELSE s.att END,
		attempt_seq = CASE WHEN s.auto AND r.ord IS NOT NULL AND s.aseq <= r.auto_cursor THEN 0 ELSE s.aseq END,
		cursor = CASE WHEN s.auto AND r.ord IS NOT NULL THEN r.auto_cursor ELSE c.cursor END,
		done = CASE WHEN s.auto AND r.ord IS NOT NULL
		            THEN ARRAY(SELECT d FROM unnest(c.done) d WHERE d > r.auto_cursor ORDER BY d) ELSE c.done END,
		lease_id = CASE WHEN r.ord IS NULL OR s.auto THEN NULL ELSE s.lease::uuid END,
		lease_owner = CASE WHEN r.ord IS NULL OR s.auto THEN NULL ELSE $8 END,
		lease_expires_at = CASE WHEN r.ord IS NULL OR s.auto THEN NULL ELSE now() + make_interval(secs => s.lease_time) END,
		lease_from = CASE WHEN r.ord IS NULL OR s.auto THEN NULL ELSE r.lfrom END,
		lease_to = CASE WHEN r.ord IS NULL OR s.auto THEN NULL ELSE r.lto END,
		delivered_to = greatest(c.delivered_to, CASE WHEN r.ord IS NULL OR s.auto THEN 0 ELSE r.lto END),
		leased_at = CASE WHEN r.ord IS NULL THEN c.leased_at ELSE now() END
	FROM st s LEFT JOIN ranges r ON r.ord = s.ord
	WHERE c.partition_id = s.partition_id AND c.consumer_group = s.consumer_group
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
	auto := make([]bool, n)
	for i, a := range as {
		g := a.Group
		if g == "" {
			g = DefaultGroup
		}
		intention[i], pid[i], grp[i], lim[i], total[i], auto[i], lease[i] =
			int32(a.Intention), a.PartitionID, g, int32(a.Limit), int32(a.Total), a.AutoAck, a.LeaseID
		if a.AutoAck {
			lease[i] = NewID() // unused, but keeps the uuid cast valid
		}
	}
	rows, err := s.pool.Query(ctx, popAssignedSQL, intention, pid, grp, lim, total, auto, lease, s.cfg.InstanceID)
	if err != nil {
		return nil, fmt.Errorf("popping assigned partitions: %w", err)
	}
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
	if err := insertDeadLetters(ctx, s.pool, copied); err != nil {
		s.log.Error().Err(err).Msg("dead-lettering undecryptable auto-acked messages failed")
	} else {
		n += len(copied)
	}
	if len(acks) > 0 {
		res, err := s.Ack(ctx, acks)
		if err != nil {
			s.log.Error().Err(err).Msg("dead-lettering undecryptable messages failed")
		}
		for _, r := range res {
			if r.Success {
				n++
			} else {
				s.log.Error().Str("transactionId", r.TransactionID).Str("error", r.Error).
					Msg("dead-lettering an undecryptable message was refused")
			}
		}
	}
	s.countDecryptFailures(n)
}

// ReleaseLease gives the (partition, group) pairs held under leaseID back at
// once, without counting a failed attempt: for a consumer that went away
// before it received what was leased for it.
func (s *Store) ReleaseLease(ctx context.Context, leaseID string) error {
	if !ValidUUID(leaseID) {
		return nil
	}
	_, err := s.pool.Exec(ctx, `-- herald:release_lease
		UPDATE consumers SET lease_id = NULL, lease_owner = NULL, lease_expires_at = NULL, lease_from = NULL, lease_to = NULL
		WHERE lease_id = $1::uuid`, leaseID)
	if err != nil {
		return fmt.Errorf("releasing lease %s: %w", leaseID, err)
	}
	return nil
}
