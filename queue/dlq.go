package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// DLQQuery filters the dead-letter listing.
type DLQQuery struct {
	Queue     string // zero: all queues
	Group     string // zero: all groups
	Partition string // zero: all partitions
	// Error keeps the dead letters whose error text contains it, in any
	// case; zero: all.
	Error    string
	From, To time.Time // failed at or after From, before To; zero: unbounded
	Limit    int       // zero means 100
	Offset   int
}

// DeadLetter is one dead-lettered message.
type DeadLetter struct {
	// RowID is the dead letter's own id (its dead_letters row): replay and
	// purge name it. One message dead-lettered by two groups has two.
	RowID         string
	ID            string // the message's id
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
  AND ($4::timestamptz IS NULL OR d.failed_at >= $4) AND ($5::timestamptz IS NULL OR d.failed_at < $5)
  AND ($6 = '' OR strpos(lower(coalesce(d.error, '')), lower($6)) > 0)`

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
	if err := qry.validate(); err != nil {
		return nil, err
	}
	page := &DLQPage{Messages: []DeadLetter{}, Limit: qry.Limit, Offset: qry.Offset}
	filter := qry.args()
	if err := s.pool.QueryRow(ctx, `SELECT count(*) `+dlqWhere, filter...).Scan(&page.Total); err != nil {
		return nil, fmt.Errorf("counting dead letters: %w", err)
	}
	rows, err := s.pool.Query(ctx, `
		SELECT `+dlqColumns+`
		`+dlqWhere+` ORDER BY d.id DESC LIMIT $7 OFFSET $8`, append(filter, qry.Limit, qry.Offset)...)
	if err != nil {
		return nil, fmt.Errorf("listing dead letters: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		d, err := s.scanDeadLetter(rows)
		if err != nil {
			return nil, fmt.Errorf("listing dead letters: %w", err)
		}
		page.Messages = append(page.Messages, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing dead letters: %w", err)
	}
	return page, nil
}

// validate checks the filter's texts (the page bounds are the caller's).
func (qry DLQQuery) validate() error {
	if err := errors.Join(validText("queue", qry.Queue), validText("consumerGroup", qry.Group),
		validText("partition", qry.Partition), validText("error", qry.Error)); err != nil {
		return inputErrorf("%v", err)
	}
	if len(qry.Error) > MaxDLQErrorFilter {
		return inputErrorf("error must be at most %d bytes", MaxDLQErrorFilter)
	}
	return nil
}

// MaxDLQErrorFilter bounds DLQQuery.Error.
const MaxDLQErrorFilter = 1024

// args are dlqWhere's parameters $1..$6.
func (qry DLQQuery) args() []any {
	return []any{qry.Queue, qry.Group, qry.Partition, optTime(qry.From), optTime(qry.To), qry.Error}
}

// dlqColumns are what scanDeadLetter reads, from dead_letters d,
// partitions p and queues q.
const dlqColumns = `d.id::text, d.message_id::text, d.transaction_id, coalesce(d.trace_id::text, ''), d.partition_id::text,
       q.name, p.name, d.consumer_group, coalesce(d.error, ''), d.retry_count, d.payload::text,
       coalesce(d.producer_sub, ''), d.created_at, d.failed_at`

func (s *Store) scanDeadLetter(row pgx.Row) (DeadLetter, error) {
	var d DeadLetter
	var payload string
	if err := row.Scan(&d.RowID, &d.ID, &d.TransactionID, &d.TraceID, &d.PartitionID, &d.Queue, &d.Partition, &d.Group,
		&d.ErrorMessage, &d.RetryCount, &payload, &d.ProducerSub, &d.CreatedAt, &d.FailedAt); err != nil {
		return d, err
	}
	plain, ok := s.open(payload, sealRef{d.PartitionID, d.TransactionID, d.ID})
	if !ok {
		plain, d.DecryptFailed = "null", true
	}
	d.Data = json.RawMessage(plain)
	return d, nil
}

// DeadLetterByID reads one dead letter by its row id (DeadLetter.RowID);
// ErrNotFound when there is none (replayed, purged, or never).
func (s *Store) DeadLetterByID(ctx context.Context, id int64) (*DeadLetter, error) {
	d, err := s.scanDeadLetter(s.pool.QueryRow(ctx, `-- herald:dlq_one
		SELECT `+dlqColumns+`
		FROM dead_letters d JOIN queues q ON q.id = d.queue_id JOIN partitions p ON p.id = d.partition_id
		WHERE d.id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("reading dead letter %d: %w", id, err)
	}
	return &d, nil
}
