package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// MessageDetail is one message with its payload.
type MessageDetail struct {
	MessageInfo
	// Data is the payload, decrypted; nil when it failed to decrypt.
	Data      json.RawMessage
	Encrypted bool // stored encrypted
	// ErrorMessage and RetryCount come from its latest dead letter.
	ErrorMessage *string
	RetryCount   *int
	// Removed: the message itself is gone (retention, a delete) and this
	// is its dead-lettered copy.
	Removed bool
	Options Options
	Groups  []MessageGroup
}

// MessageGroup is one consumer group's state for a message.
type MessageGroup struct {
	Group          string
	State          string
	LeaseExpiresAt *time.Time
}

// browseMessageSQL reads one message by partition and transaction id, or
// its latest dead letter when the message row is gone. $1 partition id, $2
// transaction id. Cost: the unique index (partition_id, transaction_id),
// dead_letters_message for the partition, the partition's consumer rows.
var browseMessageSQL = `-- herald:browse_message
WITH msg AS (
	SELECT m.seq, m.id, m.transaction_id, m.trace_id, m.producer_sub, m.payload, m.created_at, false AS removed
	FROM messages m WHERE m.partition_id = $1::uuid AND m.transaction_id = $2
	UNION ALL
	(SELECT d.seq, d.message_id, d.transaction_id, d.trace_id, d.producer_sub, d.payload, d.created_at, true
	 FROM dead_letters d
	 WHERE d.partition_id = $1::uuid AND d.transaction_id = $2
	   AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.partition_id = $1::uuid AND m.transaction_id = $2)
	 ORDER BY d.id DESC LIMIT 1)
)
SELECT msg.id::text, msg.transaction_id, coalesce(msg.trace_id::text, ''), coalesce(msg.producer_sub, ''),
       p.id::text, p.name, q.name, q.namespace, q.task, q.priority, msg.seq, msg.created_at,
       ` + stateSQL + `, g.qm, g.dlq, g.bus_done, g.bus_groups, g.lease_expires_at,
       msg.payload::text, msg.removed, dl.error, dl.retry_count,
       q.lease_time, q.retry_limit, q.retry_delay, q.ttl, q.encryption_enabled
FROM msg JOIN partitions p ON p.id = $1::uuid JOIN queues q ON q.id = p.queue_id
LEFT JOIN LATERAL (
	SELECT d.error, d.retry_count FROM dead_letters d
	WHERE d.partition_id = $1::uuid AND d.seq = msg.seq ORDER BY d.id DESC LIMIT 1
) dl ON true
CROSS JOIN LATERAL ` + messageState("$1::uuid", "msg.seq") + ` g`

// messageGroupsSQL is each group's state for the message at $2 of
// partition $1.
const messageGroupsSQL = `-- herald:message_groups
SELECT c.consumer_group,
       CASE WHEN $2 <= c.cursor OR $2 = ANY (c.done) THEN 2
            WHEN c.lease_expires_at > now() AND $2 BETWEEN c.lease_from AND c.lease_to THEN 1 ELSE 0 END,
       c.lease_expires_at
FROM consumers c WHERE c.partition_id = $1::uuid
ORDER BY c.consumer_group`

// BrowseMessage reads one message with its payload, decrypted as pops
// decrypt it. A message that does not exist is ErrMessageNotFound.
func (s *Store) BrowseMessage(ctx context.Context, partitionID, transactionID string) (*MessageDetail, error) {
	if !ValidUUID(partitionID) || transactionID == "" || validText("transactionId", transactionID) != nil {
		return nil, ErrMessageNotFound
	}
	d := &MessageDetail{Groups: []MessageGroup{}}
	err := s.browse(ctx, func(tx pgx.Tx) error {
		var qm *int32
		var dlq []string
		var payload string
		var errText *string
		var retries *int32
		o := &d.Options
		m := &d.MessageInfo
		err := tx.QueryRow(ctx, browseMessageSQL, partitionID, transactionID).Scan(&m.ID, &m.TransactionID, &m.TraceID,
			&m.ProducerSub, &m.PartitionID, &m.Partition, &m.Queue, &m.Namespace, &m.Task, &m.Priority, &m.Offset,
			&m.CreatedAt, &m.State, &qm, &dlq, &m.ConsumedBy, &m.BusGroups, &m.LeaseExpiresAt, &payload, &d.Removed,
			&errText, &retries, &o.LeaseTime, &o.RetryLimit, &o.RetryDelay, &o.TTL, &o.EncryptionEnabled)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrMessageNotFound
		}
		if err != nil {
			return fmt.Errorf("reading message: %w", err)
		}
		o.Priority = m.Priority
		m.QueueState = queueModeState(qm, dlq)
		d.ErrorMessage = errText
		if retries != nil {
			n := int(*retries)
			d.RetryCount = &n
		}
		plain, ok := s.open(payload, sealRef{m.PartitionID, m.TransactionID, m.ID})
		d.Encrypted = !ok || plain != payload
		if ok {
			d.Data = json.RawMessage(plain)
		}
		rows, err := tx.Query(ctx, messageGroupsSQL, partitionID, m.Offset)
		if err != nil {
			return fmt.Errorf("reading message groups: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var g MessageGroup
			var st int32
			var exp *time.Time
			if err := rows.Scan(&g.Group, &st, &exp); err != nil {
				return fmt.Errorf("reading message groups: %w", err)
			}
			g.State = StatePending
			switch st {
			case 2:
				g.State = StateCompleted
			case 1:
				g.State, g.LeaseExpiresAt = StateProcessing, exp
			}
			if slices.Contains(dlq, g.Group) {
				g.State = StateDeadLetter
			}
			d.Groups = append(d.Groups, g)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return d, nil
}
