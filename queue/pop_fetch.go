package queue

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// popFetchSQL reads up to lim messages after each cursor. visible is false
// for a message still inside the queue's delay; delivery stops there so order
// holds. With no delay every message read is visible, whatever its
// created_at (the push's clock_timestamp()) says against now(): a push that
// committed after this transaction began, before its snapshot, is read
// with a created_at after now(). expired is true for a message older than the queue's ttl: it is
// never delivered.
const popFetchSQL = `-- herald:pop_fetch
SELECT c.ord, m.seq, m.id::text, m.transaction_id, coalesce(m.trace_id::text, ''), coalesce(m.producer_sub, ''),
       m.payload::text, m.created_at, c.delay = 0 OR m.created_at <= now() - make_interval(secs => c.delay) AS visible,
       c.ttl > 0 AND m.created_at < now() - make_interval(secs => c.ttl) AS expired
FROM unnest($1::text[], $2::bigint[], $3::int[], $4::int[], $5::int[]) WITH ORDINALITY AS c(pid, cur, lim, delay, ttl, ord)
CROSS JOIN LATERAL (
	SELECT * FROM messages m WHERE m.partition_id = c.pid::uuid AND m.seq > c.cur ORDER BY m.seq LIMIT c.lim
) m
ORDER BY c.ord, m.seq`

// maxFetchRounds bounds how often one pop reads a partition further after
// payloads that failed to decrypt; past it the pop returns what it has.
const maxFetchRounds = 8

// fetchClaimed reads the messages of the claimed partitions into their
// msgs, in offset order, up to req.Batch in all. Rows are fetched enough
// per partition to fill the batch after skipping offsets done out of order.
// A payload that fails to decrypt is not delivered: the message is marked
// done and returned in bad, to be dead-lettered for the group
// (DecryptError), and the partition is read further so that the batch
// still fills in order. A message older than its queue's ttl is skipped
// the same way, with no dead letter: marked done and counted in
// res.Expired.
func (s *Store) fetchClaimed(ctx context.Context, tx pgx.Tx, req *PopRequest, claims []*claimed, leaseID string,
	res *PopResult) (bad []deadLetter, err error) {
	remaining := req.Batch
	stopped := make([]bool, len(claims))
	after := make([]int64, len(claims)) // the next read starts after this offset
	for i, c := range claims {
		after[i] = c.st.cursor
	}
	for round := 0; round < maxFetchRounds && remaining > 0; round++ {
		idx, pids, curs, lims, delays, ttls := fetchArgs(claims, stopped, after, remaining)
		if len(idx) == 0 {
			break
		}
		rows, err := tx.Query(ctx, popFetchSQL, pids, curs, lims, delays, ttls)
		if err != nil {
			return nil, fmt.Errorf("reading messages: %w", err)
		}
		read := make([]int, len(idx))
		failed := 0
		for rows.Next() {
			var ord int64
			var m Message
			var payload string
			var visible, expired bool
			if err := rows.Scan(&ord, &m.Offset, &m.ID, &m.TransactionID, &m.TraceID, &m.ProducerSub, &payload, &m.CreatedAt,
				&visible, &expired); err != nil {
				rows.Close()
				return nil, fmt.Errorf("reading messages: %w", err)
			}
			k := int(ord - 1)
			i := idx[k]
			c := claims[i]
			read[k]++
			after[i] = m.Offset
			if stopped[i] || c.st.isDone(m.Offset) {
				continue
			}
			if remaining == 0 || (!visible && !expired) {
				stopped[i] = true
				continue
			}
			if expired {
				c.st.markDone(m.Offset)
				res.Expired = countIn(res.Expired, c.queue)
				failed++
				continue
			}
			plain, ok := s.open(payload, sealRef{c.partitionID, m.TransactionID, m.ID})
			if !ok {
				bad = append(bad, s.undecryptable(c, &m, req.Group, res))
				failed++
				continue
			}
			m.Data = json.RawMessage(plain)
			m.PartitionID, m.Partition, m.Queue = c.partitionID, c.partition, c.queue
			m.LeaseID, m.Group = leaseID, req.Group
			m.RetryCount = c.st.retryCount(m.Offset)
			c.msgs = append(c.msgs, m)
			remaining--
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("reading messages: %w", err)
		}
		if failed == 0 {
			break // as many rows as one read can give
		}
		for k, i := range idx {
			if read[k] < int(lims[k]) {
				stopped[i] = true // nothing more in the partition
			}
		}
	}
	res.undecryptable += len(bad)
	return bad, nil
}

// fetchArgs are one read's arguments: the claims not stopped (their
// indexes), each with its partition, the offset to read after, how many
// rows to read (what is left to take, plus the rows already done that the
// read passes over), its delay and its ttl.
func fetchArgs(claims []*claimed, stopped []bool, after []int64, remaining int) (idx []int, pids []string, curs []int64,
	lims, delays, ttls []int32) {
	for i, c := range claims {
		if !stopped[i] {
			idx = append(idx, i)
			pids, curs = append(pids, c.partitionID), append(curs, after[i])
			lims = append(lims, int32(remaining+len(c.st.done)))
			delays, ttls = append(delays, int32(c.delay)), append(ttls, int32(c.ttl))
		}
	}
	return idx, pids, curs, lims, delays, ttls
}

// undecryptable dead-letters a message whose payload does not open (it is
// never delivered) and counts it in res.
func (s *Store) undecryptable(c *claimed, m *Message, group string, res *PopResult) deadLetter {
	s.log.Warn().Str("queue", c.queue).Str("partitionId", c.partitionID).Str("messageId", m.ID).
		Int64("offset", m.Offset).Str("group", group).Msg("payload failed to decrypt: dead-lettered, not delivered")
	dl := deadLetter{partitionID: c.partitionID, seq: m.Offset, group: group, err: DecryptError,
		retries: c.st.retryCount(m.Offset)}
	c.st.markDone(m.Offset)
	if c.dead.keeps(false) {
		res.DeadLettered = countIn(res.DeadLettered, c.queue)
	} else {
		res.Dropped = countIn(res.Dropped, c.queue)
	}
	return dl
}
