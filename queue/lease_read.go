package queue

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// readLeaseSQL reads what a live lease holds on one partition after an
// offset and before another, not acknowledged: the messages a push whose
// answer was lost may have handed a stream's lease (ReadLease). One row
// with NULL message columns when the lease holds none there; no row when
// the lease is not the partition's live lease for the group. A lease with
// less than half its lease time left is renewed. $1 partition
// id, $2 group, $3 lease id, $4 after, $5 before (0: none), $6 limit.
var readLeaseSQL = `-- herald:read_lease
WITH c AS (
	SELECT c.partition_id, c.consumer_group, c.done, p.name AS pname, q.name AS qname,
	       greatest(c.cursor, coalesce(c.lease_from, 1) - 1, $4::bigint) AS after,
	       CASE WHEN $5::bigint > 0 THEN least(` + leaseEnd("c") + `, $5::bigint - 1) ELSE ` + leaseEnd("c") + ` END AS upto
	FROM consumers c
	JOIN partitions p ON p.id = c.partition_id
	JOIN queues q ON q.id = p.queue_id
	WHERE c.partition_id = $1::uuid AND c.consumer_group = $2 AND c.lease_id = $3::uuid AND c.lease_expires_at > now()
), renewed AS (
	-- What is read goes to the lease's holder again: with less than half
	-- its lease time left, the lease's time starts again, as a push's
	-- hand-off to it would start it, so each message read gets at least
	-- that much. Otherwise the row is not written.
	UPDATE consumers r SET lease_expires_at = greatest(r.lease_expires_at, now() + make_interval(secs => q.lease_time))
	FROM queues q
	WHERE r.partition_id = $1::uuid AND r.consumer_group = $2 AND r.lease_id = $3::uuid AND q.id = r.queue_id
	  AND r.lease_expires_at > now() AND r.lease_expires_at <= clock_timestamp() + make_interval(secs => q.lease_time / 2.0)
)
SELECT c.upto, c.pname, c.qname, coalesce(m.seq, 0), coalesce(m.id::text, ''), coalesce(m.transaction_id, ''),
       coalesce(m.trace_id::text, ''), coalesce(m.producer_sub, ''), coalesce(m.payload::text, ''), m.created_at
FROM c LEFT JOIN LATERAL (
	SELECT * FROM messages m
	WHERE m.partition_id = c.partition_id AND m.seq > c.after AND m.seq <= c.upto AND m.seq <> ALL (c.done)
	ORDER BY m.seq LIMIT $6
) m ON true
ORDER BY m.seq`

// ReadLease reads again, in offset order, the messages that lease leaseID of
// group holds on partition partitionID after offset after and before offset
// before (0: up to the lease's end), not yet acknowledged, at most limit:
// for a stream whose lease a push extended while the push's answer was lost,
// so that the messages it may have handed are delivered under the lease
// rather than the lease given back (and what the stream holds delivered
// again). held is false when leaseID is not the partition's live lease for
// the group (it ended, expired or was never taken): nothing was read. through
// is the last offset the read covered: every message of the lease up to it
// is in res (nil for none) or acknowledged, or was undecryptable and
// dead-lettered under the lease. Nothing is written, except for such a
// message, and the lease's time, which starts again when less than half
// of it is left (each message read gets at least that much).
func (s *Store) ReadLease(ctx context.Context, partitionID, group, leaseID string, after, before int64, limit int) (
	res *PopResult, through int64, held bool, err error,
) {
	if group == "" {
		group = DefaultGroup
	}
	if !ValidUUID(partitionID) || !ValidUUID(leaseID) {
		return nil, 0, false, nil
	}
	limit = min(max(limit, 1), MaxBatch)
	rows, err := s.pool.Query(ctx, readLeaseSQL, partitionID, group, leaseID, after, before, int32(limit)) // #nosec G115 -- bounded
	if err != nil {
		return nil, 0, false, fmt.Errorf("reading a lease's messages: %w", err)
	}
	defer rows.Close()
	var bad []Message
	n := 0
	for rows.Next() {
		var upto int64
		var pname, qname, payload string
		var m Message
		var created *time.Time
		if err := rows.Scan(&upto, &pname, &qname, &m.Offset, &m.ID, &m.TransactionID, &m.TraceID, &m.ProducerSub,
			&payload, &created); err != nil {
			return nil, 0, false, fmt.Errorf("reading a lease's messages: %w", err)
		}
		held, through = true, upto
		if m.Offset == 0 {
			continue // the lease holds none there
		}
		n++
		m.PartitionID, m.Partition, m.Queue, m.LeaseID, m.Group = partitionID, pname, qname, leaseID, group
		if created != nil {
			m.CreatedAt = *created
		}
		if n == limit {
			through = m.Offset // more may follow: read from here next
		}
		plain, ok := s.open(payload, sealRef{m.PartitionID, m.TransactionID, m.ID})
		if !ok {
			bad = append(bad, m)
			continue
		}
		m.Data = json.RawMessage(plain)
		if res == nil {
			res = &PopResult{Queue: qname, Partition: pname, PartitionID: partitionID, LeaseID: leaseID, Group: group,
				PartitionsClaimed: 1}
		}
		res.Messages = append(res.Messages, m)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, false, fmt.Errorf("reading a lease's messages: %w", err)
	}
	rows.Close()
	if res != nil && n == limit {
		res.More = true
	}
	s.deadLetterUndecryptable(ctx, bad)
	return res, through, held, nil
}
