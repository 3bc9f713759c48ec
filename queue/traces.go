package queue

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// Traces are notes a consumer attaches to one message: an event type,
// arbitrary JSON, its consumer group and trace names that follow one flow
// across queues (migration 0009). A trace is recorded only while its
// message exists, and outlives it until PruneTraces (the hygiene loop,
// Config.TraceRetention) or its partition's deletion removes it.

// Bounds and defaults of traces.
const (
	// MaxTraceLimit bounds one page of traces or trace names, and the
	// traces TracesOf returns for one message.
	MaxTraceLimit = 1000
	// TraceLimitDefault is a by-name page when the query names none.
	TraceLimitDefault = 100
	// TraceNamesLimitDefault is a page of trace names when the query names none.
	TraceNamesLimitDefault = 50
	// MaxTraceNames bounds the names of one trace.
	MaxTraceNames = 100
	// MaxTraceNameLength bounds one trace name, in bytes.
	MaxTraceNameLength = 256
	// MaxTraceData bounds a trace's data, in bytes of JSON: a note, not a
	// second payload.
	MaxTraceData = 64 << 10
	// TraceEventDefault is the event type of a trace that names none.
	TraceEventDefault = "info"
	// TraceRetentionDefault is how long traces are kept.
	TraceRetentionDefault = 7 * 24 * time.Hour
	// TracePruneBatch is how many traces one delete statement removes.
	TracePruneBatch = 5000
)

// PartitionMatchSep separates the queue and partition names a
// PartitionMatch is matched against ("queue" + sep + "partition"). Names
// hold no control characters (ValidateName), so the pair is unambiguous.
const PartitionMatchSep = "\x1f"

// NewTrace is a trace to record.
type NewTrace struct {
	PartitionID   string          // the message's partition; a UUID
	TransactionID string          // the message's transaction id
	Group         string          // the consumer group; "" means DefaultGroup
	EventType     string          // "" means TraceEventDefault
	Data          json.RawMessage // any JSON value, at most MaxTraceData bytes
	Names         []string        // duplicates collapse; stored sorted
}

// TraceRecorded is RecordTrace's outcome: the new trace's id, or Found
// false when no message has that transaction id in that partition (nothing
// recorded).
type TraceRecorded struct {
	ID    string
	Found bool
}

// Trace is one recorded trace.
type Trace struct {
	ID            string
	PartitionID   string
	TransactionID string
	Seq           int64 // the message's offset in its partition
	Group         string
	EventType     string
	Data          json.RawMessage
	WorkerID      string // the instance that recorded it (Config.InstanceID)
	CreatedAt     time.Time
	Names         []string // sorted, never nil

	// Set by TracesByName only.
	Queue, Partition string
	// MessagePayload is the message's payload, decrypted; nil when the
	// message is gone or its payload does not decrypt.
	MessagePayload json.RawMessage
}

// TraceQuery selects traces by name.
type TraceQuery struct {
	Name     string
	From, To time.Time // recorded at or after From, before To; zero: unbounded
	Limit    int       // zero means TraceLimitDefault
	Offset   int
	// PartitionMatch, when set, is a PostgreSQL regular expression that
	// "queue" + PartitionMatchSep + "partition" of a trace must match (a
	// token's rights): traces elsewhere are neither listed nor counted.
	PartitionMatch string
}

// TracePage is one page of traces, oldest first, with the total count.
type TracePage struct {
	Traces []Trace
	Total  int64
	Limit  int
	Offset int
}

// TraceNamesQuery pages through the trace names.
type TraceNamesQuery struct {
	Limit          int // zero means TraceNamesLimitDefault
	Offset         int
	PartitionMatch string // as TraceQuery's
}

// TraceName is one trace name and what carries it.
type TraceName struct {
	Name     string
	Traces   int64 // traces carrying it
	Messages int64 // distinct messages those traces are about
	LastSeen time.Time
}

// TraceNamePage is one page of trace names, most recently seen first, with
// the number of distinct names.
type TraceNamePage struct {
	Names  []TraceName
	Total  int64
	Limit  int
	Offset int
}

// validTraceName checks one trace name: non-empty, at most
// MaxTraceNameLength bytes of UTF-8, no control characters.
func validTraceName(name string) error {
	if name == "" {
		return inputErrorf("a trace name must not be empty")
	}
	if len(name) > MaxTraceNameLength {
		return inputErrorf("a trace name must be at most %d bytes", MaxTraceNameLength)
	}
	if !utf8.ValidString(name) {
		return inputErrorf("a trace name must be UTF-8")
	}
	for _, r := range name {
		if r < 0x20 || r == 0x7f {
			return inputErrorf("a trace name must not contain control characters")
		}
	}
	return nil
}

// validMessageRef checks a (partition id, transaction id) pair.
func validMessageRef(partitionID, transactionID string) error {
	if !ValidUUID(partitionID) {
		return inputErrorf("partitionId must be a UUID")
	}
	if transactionID == "" {
		return inputErrorf("transactionId must not be empty")
	}
	if len(transactionID) > 1024 {
		return inputErrorf("transactionId must be at most 1024 bytes")
	}
	return validText("transactionId", transactionID)
}

// validPartitionMatch bounds a PartitionMatch.
func validPartitionMatch(m string) error {
	if len(m) > MaxQueueMatch {
		return inputErrorf("a partition match is at most %d bytes", MaxQueueMatch)
	}
	return validText("partition match", m)
}

// validTraceData checks a trace's data: one JSON value, at most
// MaxTraceData bytes, with no NUL character in any string (jsonb cannot
// store one; refused here with a clear text rather than by the database).
func validTraceData(data json.RawMessage) error {
	if len(data) == 0 {
		return inputErrorf("data is required")
	}
	if len(data) > MaxTraceData {
		return inputErrorf("data must be at most %d bytes of JSON", MaxTraceData)
	}
	if !json.Valid(data) {
		return inputErrorf("data must be JSON")
	}
	if !bytes.Contains(data, []byte(`\u0000`)) {
		return nil // the only way a NUL gets into valid JSON
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return inputErrorf("data must be JSON")
		}
		if s, ok := tok.(string); ok && strings.IndexByte(s, 0) >= 0 {
			return inputErrorf("data must not contain NUL characters")
		}
	}
}

// normalizeTraceNames validates names and returns them sorted without
// duplicates (never nil).
func normalizeTraceNames(names []string) ([]string, error) {
	out := make([]string, 0, len(names))
	for _, n := range names {
		if err := validTraceName(n); err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) > MaxTraceNames {
		return nil, inputErrorf("a trace carries at most %d names", MaxTraceNames)
	}
	return out, nil
}

// recordTraceSQL inserts a trace about the message with transaction id $3
// in partition $2, if there is one: no row comes back otherwise.
const recordTraceSQL = `-- herald:record_trace
INSERT INTO traces (id, partition_id, seq, transaction_id, consumer_group, event_type, data, worker_id, trace_names)
SELECT $1::uuid, m.partition_id, m.seq, m.transaction_id, $4, $5, $6::jsonb, $7, $8::text[]
FROM messages m WHERE m.partition_id = $2::uuid AND m.transaction_id = $3
RETURNING id::text`

// RecordTrace records a trace about the message with t.TransactionID in
// partition t.PartitionID. A message that does not exist (never pushed,
// or deleted) is a result, Found false, and nothing is recorded.
func (s *Store) RecordTrace(ctx context.Context, t NewTrace) (TraceRecorded, error) {
	if err := validMessageRef(t.PartitionID, t.TransactionID); err != nil {
		return TraceRecorded{}, err
	}
	if t.Group == "" {
		t.Group = DefaultGroup
	}
	if t.EventType == "" {
		t.EventType = TraceEventDefault
	}
	if err := errors.Join(ValidateName("consumerGroup", t.Group), ValidateName("eventType", t.EventType),
		validTraceData(t.Data)); err != nil {
		return TraceRecorded{}, err
	}
	names, err := normalizeTraceNames(t.Names)
	if err != nil {
		return TraceRecorded{}, err
	}
	var id string
	err = s.pool.QueryRow(ctx, recordTraceSQL, NewID(), t.PartitionID, t.TransactionID, t.Group, t.EventType,
		string(t.Data), s.cfg.InstanceID, names).Scan(&id)
	switch {
	case err == nil:
		return TraceRecorded{ID: id, Found: true}, nil
	case errors.Is(err, pgx.ErrNoRows), isForeignKeyViolation(err):
		// No such message; or its partition was deleted under the insert.
		return TraceRecorded{}, nil
	default:
		return TraceRecorded{}, fmt.Errorf("recording a trace: %w", err)
	}
}

const traceColumns = `t.id::text, t.partition_id::text, t.transaction_id, t.seq, t.consumer_group, t.event_type,
	t.data::text, t.worker_id, t.created_at, t.trace_names`

// traceDest are the scan destinations of traceColumns.
func traceDest(t *Trace, data *string) []any {
	return []any{&t.ID, &t.PartitionID, &t.TransactionID, &t.Seq, &t.Group, &t.EventType, data, &t.WorkerID,
		&t.CreatedAt, &t.Names}
}

// TracesOf returns the traces recorded about the message with
// transactionID in partition partitionID, oldest first: at most
// MaxTraceLimit, the oldest. They outlive the message (until retention), so
// this may list traces of a message that is gone; none is an empty list.
func (s *Store) TracesOf(ctx context.Context, partitionID, transactionID string) ([]Trace, error) {
	if err := validMessageRef(partitionID, transactionID); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `-- herald:traces_of
SELECT `+traceColumns+` FROM traces t
WHERE t.partition_id = $1::uuid AND t.transaction_id = $2
ORDER BY t.created_at, t.id LIMIT $3`, partitionID, transactionID, MaxTraceLimit)
	if err != nil {
		return nil, fmt.Errorf("reading a message's traces: %w", err)
	}
	defer rows.Close()
	out := []Trace{}
	for rows.Next() {
		var t Trace
		var data string
		if err := rows.Scan(traceDest(&t, &data)...); err != nil {
			return nil, fmt.Errorf("reading a message's traces: %w", err)
		}
		t.Data = json.RawMessage(data)
		if t.Names == nil {
			t.Names = []string{}
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading a message's traces: %w", err)
	}
	return out, nil
}

// pageBounds applies a page's default limit and checks its bounds.
func pageBounds(limit, offset, def int) (int, error) {
	if limit == 0 {
		limit = def
	}
	if limit < 0 || limit > MaxTraceLimit {
		return 0, inputErrorf("limit must be between 1 and %d", MaxTraceLimit)
	}
	if offset < 0 {
		return 0, inputErrorf("offset must not be negative")
	}
	return limit, nil
}

// tracesByNameFrom and tracesByNameWhere select the traces of one name
// ($1) recorded in [$2, $3) (NULL: unbounded) on partitions whose
// "queue<sep>partition" matches $4 (an empty $4: any).
const (
	tracesByNameFrom  = `traces t JOIN partitions p ON p.id = t.partition_id JOIN queues q ON q.id = p.queue_id`
	tracesByNameWhere = `
WHERE t.trace_names @> ARRAY[$1::text]
  AND ($2::timestamptz IS NULL OR t.created_at >= $2) AND ($3::timestamptz IS NULL OR t.created_at < $3)
  AND ($4 = '' OR q.name || chr(31) || p.name ~ $4)`
)

// TracesByName lists the traces carrying a name, oldest first, with their
// queue, partition and message payload.
func (s *Store) TracesByName(ctx context.Context, qry TraceQuery) (*TracePage, error) {
	limit, err := pageBounds(qry.Limit, qry.Offset, TraceLimitDefault)
	if err != nil {
		return nil, err
	}
	if err := errors.Join(validTraceName(qry.Name), validPartitionMatch(qry.PartitionMatch)); err != nil {
		return nil, err
	}
	page := &TracePage{Traces: []Trace{}, Limit: limit, Offset: qry.Offset}
	from, to := optTime(qry.From), optTime(qry.To)
	filter := []any{qry.Name, from, to, qry.PartitionMatch}
	if err := s.pool.QueryRow(ctx, `-- herald:traces_by_name_count
SELECT count(*) FROM `+tracesByNameFrom+tracesByNameWhere, filter...).Scan(&page.Total); err != nil {
		return nil, fmt.Errorf("counting traces by name: %w", err)
	}
	if page.Total <= int64(qry.Offset) {
		return page, nil
	}
	// The message is the one the trace was recorded about: its offset,
	// which is never reused in a partition.
	rows, err := s.pool.Query(ctx, `-- herald:traces_by_name
SELECT `+traceColumns+`, q.name, p.name, coalesce(m.id::text, ''), m.payload::text
FROM `+tracesByNameFrom+`
LEFT JOIN messages m ON m.partition_id = t.partition_id AND m.seq = t.seq AND m.transaction_id = t.transaction_id`+
		tracesByNameWhere+`
ORDER BY t.created_at, t.id LIMIT $5 OFFSET $6`, append(filter, limit, qry.Offset)...)
	if err != nil {
		return nil, fmt.Errorf("listing traces by name: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var t Trace
		var data, messageID string
		var payload *string
		if err := rows.Scan(append(traceDest(&t, &data), &t.Queue, &t.Partition, &messageID, &payload)...); err != nil {
			return nil, fmt.Errorf("listing traces by name: %w", err)
		}
		t.Data = json.RawMessage(data)
		if t.Names == nil {
			t.Names = []string{}
		}
		if payload != nil {
			if plain, ok := s.open(*payload, sealRef{t.PartitionID, t.TransactionID, messageID}); ok {
				t.MessagePayload = json.RawMessage(plain)
			}
		}
		page.Traces = append(page.Traces, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing traces by name: %w", err)
	}
	return page, nil
}

// traceNamesFrom unnests the names of the traces on partitions whose
// "queue<sep>partition" matches $1 (an empty $1: any).
const traceNamesFrom = `traces t CROSS JOIN LATERAL unnest(t.trace_names) AS u(name)
WHERE $1 = '' OR EXISTS (SELECT 1 FROM partitions p JOIN queues q ON q.id = p.queue_id
                         WHERE p.id = t.partition_id AND q.name || chr(31) || p.name ~ $1)`

// TraceNames lists the distinct trace names, most recently seen first
// (then by name), with how many traces and messages carry each.
func (s *Store) TraceNames(ctx context.Context, qry TraceNamesQuery) (*TraceNamePage, error) {
	limit, err := pageBounds(qry.Limit, qry.Offset, TraceNamesLimitDefault)
	if err != nil {
		return nil, err
	}
	if err := validPartitionMatch(qry.PartitionMatch); err != nil {
		return nil, err
	}
	page := &TraceNamePage{Names: []TraceName{}, Limit: limit, Offset: qry.Offset}
	// One scan gives the page and, by the window over the groups, the
	// number of names; only a page past the end needs a count of its own.
	rows, err := s.pool.Query(ctx, `-- herald:trace_names
SELECT u.name, count(*), count(DISTINCT (t.partition_id, t.seq)), max(t.created_at), count(*) OVER ()
FROM `+traceNamesFrom+`
GROUP BY u.name ORDER BY max(t.created_at) DESC, u.name LIMIT $2 OFFSET $3`, qry.PartitionMatch, limit, qry.Offset)
	if err != nil {
		return nil, fmt.Errorf("listing trace names: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var n TraceName
		if err := rows.Scan(&n.Name, &n.Traces, &n.Messages, &n.LastSeen, &page.Total); err != nil {
			return nil, fmt.Errorf("listing trace names: %w", err)
		}
		page.Names = append(page.Names, n)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing trace names: %w", err)
	}
	if len(page.Names) == 0 && qry.Offset > 0 {
		if err := s.pool.QueryRow(ctx, `-- herald:trace_names_count
SELECT count(DISTINCT u.name) FROM `+traceNamesFrom, qry.PartitionMatch).Scan(&page.Total); err != nil {
			return nil, fmt.Errorf("counting trace names: %w", err)
		}
	}
	return page, nil
}

// pruneTracesSQL deletes up to $2 traces recorded more than $1 seconds ago,
// oldest first, skipping rows another instance's run holds. The ids go
// through an array so the delete finds them by primary key: "id IN
// (SELECT ...)" was planned as a hash join over the whole table.
const pruneTracesSQL = `-- herald:prune_traces
DELETE FROM traces WHERE id = ANY (ARRAY(
	SELECT id FROM traces WHERE created_at < now() - make_interval(secs => $1)
	ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED))`

// PruneTraces deletes the traces recorded more than olderThan ago, in
// statements of at most batch traces (0: TracePruneBatch), each its own
// short transaction; after each full batch it rests as long as the batch
// took, leaving half the database to the live load, as retention does. It
// returns how many it deleted. Instances pruning at once skip each other's
// rows.
func (s *Store) PruneTraces(ctx context.Context, olderThan time.Duration, batch int) (int64, error) {
	if olderThan <= 0 {
		return 0, errors.New("queue: PruneTraces needs a positive age")
	}
	if batch <= 0 {
		batch = TracePruneBatch
	}
	var total int64
	for {
		began := time.Now()
		tag, err := s.pool.Exec(ctx, pruneTracesSQL, olderThan.Seconds(), batch)
		if err != nil {
			return total, fmt.Errorf("deleting old traces: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
		select {
		case <-ctx.Done():
			return total, ctx.Err()
		case <-time.After(time.Since(began)):
		}
	}
}

// pruneTraces runs PruneTraces for the hygiene loop: with the configured
// retention, logging what it deleted or why it failed.
func (s *Store) pruneTraces(ctx context.Context) {
	if s.cfg.TraceRetention <= 0 {
		return // kept forever
	}
	start := time.Now()
	n, err := s.PruneTraces(ctx, s.cfg.TraceRetention, 0)
	if err != nil && ctx.Err() == nil {
		s.log.Warn().Err(err).Msg("deleting old traces")
	}
	if n > 0 {
		s.log.Info().Int64("deleted", n).Dur("took", time.Since(start)).Dur("retention", s.cfg.TraceRetention).
			Msg("deleted traces past their retention")
	}
}
