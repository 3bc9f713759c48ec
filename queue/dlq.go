package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// DLQQuery filters the dead-letter listing.
type DLQQuery struct {
	Queue     string    // zero: all queues
	Group     string    // zero: all groups
	Partition string    // zero: all partitions
	From, To  time.Time // failed at or after From, before To; zero: unbounded
	Limit     int       // zero means 100
	Offset    int
}

// DeadLetter is one dead-lettered message.
type DeadLetter struct {
	ID            string
	TransactionID string
	TraceID       string
	PartitionID   string
	Queue         string
	Partition     string
	Group         string
	ErrorMessage  string
	RetryCount    int
	Data          json.RawMessage
	ProducerSub   string
	CreatedAt     time.Time
	FailedAt      time.Time
	// DecryptFailed: the stored payload is an encrypted one that does not
	// decrypt; Data is then null, never the stored envelope.
	DecryptFailed bool
}

// DLQPage is one page of dead letters, newest first, with the total count.
type DLQPage struct {
	Messages []DeadLetter
	Total    int64
	Limit    int
	Offset   int
}

// MaxDLQLimit bounds one DLQ page.
const MaxDLQLimit = 1000

const dlqWhere = `FROM dead_letters d JOIN queues q ON q.id = d.queue_id JOIN partitions p ON p.id = d.partition_id
WHERE ($1 = '' OR q.name = $1) AND ($2 = '' OR d.consumer_group = $2) AND ($3 = '' OR p.name = $3)
  AND ($4::timestamptz IS NULL OR d.failed_at >= $4) AND ($5::timestamptz IS NULL OR d.failed_at < $5)`

// DLQ lists dead letters.
func (s *Store) DLQ(ctx context.Context, qry DLQQuery) (*DLQPage, error) {
	if qry.Limit == 0 {
		qry.Limit = 100
	}
	if qry.Limit < 0 || qry.Limit > MaxDLQLimit {
		return nil, inputErrorf("limit must be between 1 and %d", MaxDLQLimit)
	}
	if qry.Offset < 0 {
		return nil, inputErrorf("offset must not be negative")
	}
	if err := errors.Join(validText("queue", qry.Queue), validText("consumerGroup", qry.Group),
		validText("partition", qry.Partition)); err != nil {
		return nil, inputErrorf("%v", err)
	}
	page := &DLQPage{Messages: []DeadLetter{}, Limit: qry.Limit, Offset: qry.Offset}
	var from, to *time.Time
	if !qry.From.IsZero() {
		from = &qry.From
	}
	if !qry.To.IsZero() {
		to = &qry.To
	}
	filter := []any{qry.Queue, qry.Group, qry.Partition, from, to}
	if err := s.pool.QueryRow(ctx, `SELECT count(*) `+dlqWhere, filter...).Scan(&page.Total); err != nil {
		return nil, fmt.Errorf("counting dead letters: %w", err)
	}
	rows, err := s.pool.Query(ctx, `
		SELECT d.message_id::text, d.transaction_id, coalesce(d.trace_id::text, ''), d.partition_id::text, q.name, p.name,
		       d.consumer_group, coalesce(d.error, ''), d.retry_count, d.payload::text, coalesce(d.producer_sub, ''),
		       d.created_at, d.failed_at
		`+dlqWhere+` ORDER BY d.id DESC LIMIT $6 OFFSET $7`, append(filter, qry.Limit, qry.Offset)...)
	if err != nil {
		return nil, fmt.Errorf("listing dead letters: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var d DeadLetter
		var payload string
		if err := rows.Scan(&d.ID, &d.TransactionID, &d.TraceID, &d.PartitionID, &d.Queue, &d.Partition, &d.Group,
			&d.ErrorMessage, &d.RetryCount, &payload, &d.ProducerSub, &d.CreatedAt, &d.FailedAt); err != nil {
			return nil, fmt.Errorf("listing dead letters: %w", err)
		}
		plain, ok := s.open(payload, sealRef{d.PartitionID, d.TransactionID, d.ID})
		if !ok {
			plain, d.DecryptFailed = "null", true
		}
		d.Data = json.RawMessage(plain)
		page.Messages = append(page.Messages, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing dead letters: %w", err)
	}
	return page, nil
}
