package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5"
)

// PushItem is one message to enqueue.
type PushItem struct {
	Queue     string
	Partition string // zero means DefaultPartition
	// Payload is the message body as raw JSON; nil means {} (absent), while
	// the JSON literal null is kept as null.
	Payload       json.RawMessage
	TransactionID string // zero means a server-made id; duplicates in a partition are not stored twice
	TraceID       string // optional UUID
	ProducerSub   string // optional; the authenticated producer
}

// partKey is the partition it goes to (DefaultPartition when it names none).
func (it PushItem) partKey() partKey {
	if it.Partition == "" {
		return partKey{it.Queue, DefaultPartition}
	}
	return partKey{it.Queue, it.Partition}
}

// PushStatus is the outcome of one pushed item.
type PushStatus string

// Push outcomes.
const (
	StatusQueued    PushStatus = "queued"
	StatusDuplicate PushStatus = "duplicate"
	// StatusRejected: the queue holds maxSize messages already; nothing was
	// stored (PushResult.Error says why).
	StatusRejected PushStatus = "rejected"
)

// PushResult reports one item, in item order.
type PushResult struct {
	Index         int
	TransactionID string
	Status        PushStatus
	MessageID     string // for a duplicate: the stored message's id
	PartitionID   string
	TraceID       string
	Queue         string
	Partition     string
	Error         string // why a rejected item was refused
}

// Push enqueues items in one database transaction. Offsets are assigned under
// each partition's row lock; an item whose (partition, transactionId) exists
// takes no offset and is reported as a duplicate of the stored message.
//
// Concurrent calls may share one transaction (see coalescer): the outcome
// is the same as running them one after another.
func (s *Store) Push(ctx context.Context, items []PushItem) ([]PushResult, error) {
	if len(items) == 0 {
		return []PushResult{}, nil
	}
	if err := validatePushItems(items); err != nil {
		return nil, err
	}
	req := pushReq{items: items}
	for _, it := range items {
		req.bytes += len(it.Payload)
	}
	return s.pushes.do(ctx, req)
}

// pushReq is one Push call waiting to be merged.
type pushReq struct {
	items []PushItem
	bytes int
}

// pushBatcher admits push requests in arrival order up to the item and byte
// limits. Merging keeps each request's semantics without more care: items
// keep their order, requests are numbered in arrival order, a
// transactionId seen earlier in the merged batch is a duplicate, exactly as
// if the requests had run one after another.
type pushBatcher struct{ items, bytes int }

// busy: pushes running do not hold others back (the partition locks order
// them in the database).
func (b *pushBatcher) busy(pushReq) {}

func (b *pushBatcher) offer(r pushReq) verdict {
	if b.items > 0 && (b.items+len(r.items) > coalesceMaxItems || b.bytes+r.bytes > coalesceMaxBytes) {
		return full
	}
	b.items += len(r.items)
	b.bytes += r.bytes
	return join
}

// newPushCoalescer merges pushes: run (pushNow) gets the items of every
// request of a batch in one slice.
func newPushCoalescer(flushers int, run func(context.Context, []PushItem) ([]PushResult, error)) *coalescer[pushReq, []PushResult] {
	return newCoalescer(flushers, func() batcher[pushReq] { return &pushBatcher{} },
		mergedRun(run, func(r pushReq) []PushItem { return r.items }, func(r *PushResult, i int) { r.Index = i }))
}

// pushNow runs one push statement pair, retrying once when a cached
// partition id turned out to belong to a deleted queue.
func (s *Store) pushNow(ctx context.Context, items []PushItem) ([]PushResult, error) {
	for attempt := 0; ; attempt++ {
		plan, err := s.planPush(ctx, s.pool, items)
		if err == nil {
			// A pipelined batch runs as one implicit transaction.
			br := s.pool.SendBatch(ctx, plan.batch())
			err = plan.read(br)
			if cerr := br.Close(); err == nil && cerr != nil {
				err = fmt.Errorf("pushing: %w", cerr)
			}
		}
		if err != nil && attempt == 0 && (errors.Is(err, errRaced) || isForeignKeyViolation(err)) {
			for _, it := range items {
				s.forgetQueue(it.Queue)
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		return plan.results, nil
	}
}

// pushTx enqueues items inside an open transaction (the transaction endpoint).
// Queues and partitions are created outside it, so a rollback leaves them.
func (s *Store) pushTx(ctx context.Context, tx pgx.Tx, items []PushItem) ([]PushResult, error) {
	if len(items) == 0 {
		return []PushResult{}, nil
	}
	// The room left under maxSize is counted inside tx, so pushes of
	// earlier operations of the same transaction take their places.
	plan, err := s.planPush(ctx, tx, items)
	if err != nil {
		return nil, err
	}
	br := tx.SendBatch(ctx, plan.batch())
	err = plan.read(br)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("pushing: %w", cerr)
	}
	if err != nil {
		return nil, err
	}
	return plan.results, nil
}

// pushPlan holds one push request's rows, ready for the two statements.
type pushPlan struct {
	results    []PushResult
	partIDs    []string // distinct, sorted: the lock order
	rowIdx     []int    // index into results of each row sent
	rowPart    []string
	rowTx      []string
	rowID      []string
	rowPayload []string
	rowTrace   []*string
	rowSub     []*string
	dupOf      map[int]int // item index → earlier item index with the same (partition, txid)
}

// validatePushItems checks names and ids before anything reaches the database.
func validatePushItems(items []PushItem) error {
	for _, it := range items {
		if err := ValidateName("queue", it.Queue); err != nil {
			return err
		}
		if it.Partition != "" {
			if err := ValidateName("partition", it.Partition); err != nil {
				return err
			}
		}
		if it.TraceID != "" && !ValidUUID(it.TraceID) {
			return inputErrorf("traceId must be a UUID")
		}
		if len(it.TransactionID) > 1024 {
			return inputErrorf("transactionId must be at most 1024 bytes")
		}
		if err := validText("transactionId", it.TransactionID); err != nil {
			return err
		}
		if err := validText("producerSub", it.ProducerSub); err != nil {
			return err
		}
	}
	return nil
}

// planPush resolves partitions, counts the room of limited queues with q
// and seals payloads; nothing is written yet.
func (s *Store) planPush(ctx context.Context, q querier, items []PushItem) (*pushPlan, error) {
	if err := validatePushItems(items); err != nil {
		return nil, err
	}
	keys := make([]partKey, len(items))
	for i, it := range items {
		keys[i] = it.partKey()
	}
	refs, err := s.resolvePartitions(ctx, keys)
	if err != nil {
		return nil, err
	}
	room, sealed, err := s.queueRoom(ctx, q, items, keys, refs)
	if err != nil {
		return nil, err
	}
	plan := &pushPlan{results: make([]PushResult, len(items)), dupOf: map[int]int{}}
	firstByTx := map[[2]string]int{}
	partSet := map[string]bool{}
	for i, it := range items {
		ref := refs[keys[i]]
		txid := it.TransactionID
		if txid == "" {
			txid = NewID()
		}
		r := &plan.results[i]
		*r = PushResult{Index: i, TransactionID: txid, Status: StatusQueued, MessageID: NewID(),
			PartitionID: ref.partitionID, TraceID: it.TraceID, Queue: it.Queue, Partition: keys[i].partition}
		k := [2]string{ref.partitionID, txid}
		if j, ok := firstByTx[k]; ok {
			plan.dupOf[i] = j
			continue
		}
		if left, limited := room[it.Queue]; limited {
			if left.n <= 0 {
				r.Status, r.MessageID = StatusRejected, ""
				r.Error = fmt.Sprintf("queue %s is full: it holds its maxSize of %d messages", it.Queue, left.max)
				continue
			}
			left.n--
			room[it.Queue] = left
		}
		firstByTx[k] = i
		partSet[ref.partitionID] = true
		payload := string(it.Payload)
		if it.Payload == nil {
			payload = "{}"
		}
		if sealed[it.Queue] {
			if payload, err = s.sealer.seal(payload, sealRef{ref.partitionID, txid, r.MessageID}); err != nil {
				return nil, fmt.Errorf("encrypting a payload: %w", err)
			}
		}
		plan.rowIdx = append(plan.rowIdx, i)
		plan.rowPart = append(plan.rowPart, ref.partitionID)
		plan.rowTx = append(plan.rowTx, txid)
		plan.rowID = append(plan.rowID, r.MessageID)
		plan.rowPayload = append(plan.rowPayload, payload)
		plan.rowTrace = append(plan.rowTrace, optString(it.TraceID))
		plan.rowSub = append(plan.rowSub, optString(it.ProducerSub))
	}
	for p := range partSet {
		plan.partIDs = append(plan.partIDs, p)
	}
	sort.Strings(plan.partIDs)
	return plan, nil
}

// room is how many more messages a queue with a maxSize may take.
type room struct{ n, max int }

// queueRoom reads, for each queue of the push whose settings have a
// maxSize, how many messages it may still take: one bounded count per such
// queue (it stops at maxSize). Queues without a limit are absent. The count
// is taken before the insert: pushes racing to the last free places may
// overshoot by what they carry together. sealed lists the queues whose
// payloads are stored encrypted.
func (s *Store) queueRoom(ctx context.Context, q querier, items []PushItem, keys []partKey, refs map[partKey]partRef) (
	out map[string]room, sealed map[string]bool, err error) {
	out, sealed = map[string]room{}, map[string]bool{}
	seen := map[string]bool{}
	for i, it := range items {
		if seen[it.Queue] {
			continue
		}
		seen[it.Queue] = true
		info, ok := s.CachedConfig(it.Queue)
		if !ok {
			if info, ok, err = s.QueueConfig(ctx, it.Queue); err != nil {
				return nil, nil, err
			}
		}
		if ok && info.Options.EncryptionEnabled {
			if s.sealer == nil {
				return nil, nil, fmt.Errorf("queue %s has encryptionEnabled but this server has no encryption key", it.Queue)
			}
			sealed[it.Queue] = true
		}
		if !ok || info.Options.MaxSize <= 0 {
			continue
		}
		var n int
		if err := q.QueryRow(ctx, `-- herald:queue_size
			SELECT count(*) FROM (SELECT 1 FROM messages m JOIN partitions p ON p.id = m.partition_id
			WHERE p.queue_id = $1::uuid LIMIT $2) x`, refs[keys[i]].queueID, info.Options.MaxSize).Scan(&n); err != nil {
			return nil, nil, fmt.Errorf("counting queue %s: %w", it.Queue, err)
		}
		out[it.Queue] = room{n: info.Options.MaxSize - n, max: info.Options.MaxSize}
	}
	return out, sealed, nil
}

func optString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// pushLockSQL takes the partition row locks in id order (no deadlocks between
// pushes to overlapping partitions), then their consumer rows in key order,
// as acks take them (see lock_for_push in the migrations). The statement
// after it then starts with a snapshot taken after the locks, so it sees
// every committed duplicate and every consumer row of the partitions. NO
// KEY UPDATE: the locks do not block the key-share locks a dead-letter
// insert takes on the partition.
const pushLockSQL = `-- herald:push_lock
SELECT lock_for_push($1::uuid[])`

// pushInsertSQL finds duplicates, numbers the fresh rows densely per
// partition from last_offset, bumps last_offset, copies it to the
// partition's consumer rows (which puts them in consumers_ready) and
// inserts, in one statement.
const pushInsertSQL = `-- herald:push_insert
WITH input AS (
	SELECT t.pid::uuid AS partition_id, t.txid, t.id::uuid AS id, t.payload::jsonb AS payload,
	       t.trace::uuid AS trace_id, t.sub AS producer_sub, t.ord
	FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
	     WITH ORDINALITY AS t(pid, txid, id, payload, trace, sub, ord)
), dups AS (
	-- A scalar subquery cannot be flattened into a join, so this stays one
	-- index probe per item even when statistics are stale (a hash join
	-- would scan the whole table on every push).
	SELECT x.ord, x.id FROM (
		SELECT i.ord, (SELECT m.id FROM messages m
		               WHERE m.partition_id = i.partition_id AND m.transaction_id = i.txid) AS id
		FROM input i
	) x WHERE x.id IS NOT NULL
), fresh AS (
	SELECT i.*, row_number() OVER (PARTITION BY i.partition_id ORDER BY i.ord) AS rn
	FROM input i WHERE NOT EXISTS (SELECT 1 FROM dups d WHERE d.ord = i.ord)
), counts AS (
	SELECT partition_id, count(*) AS n FROM fresh GROUP BY partition_id
), bumped AS (
	UPDATE partitions p SET last_offset = p.last_offset + c.n, last_push_at = now()
	FROM counts c WHERE p.id = c.partition_id
	RETURNING p.id, p.last_offset, p.last_offset - c.n AS base
), ready AS (
	UPDATE consumers c SET last_offset = b.last_offset FROM bumped b WHERE c.partition_id = b.id
), inserted AS (
	INSERT INTO messages (partition_id, seq, id, transaction_id, trace_id, producer_sub, payload)
	SELECT f.partition_id, b.base + f.rn, f.id, f.txid, f.trace_id, f.producer_sub, f.payload
	FROM fresh f JOIN bumped b ON b.id = f.partition_id
	RETURNING 1
)
SELECT d.ord, d.id::text, (SELECT count(*) FROM inserted) FROM dups d`

func (p *pushPlan) batch() *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue(pushLockSQL, p.partIDs)
	b.Queue(pushInsertSQL, p.rowPart, p.rowTx, p.rowID, p.rowPayload, p.rowTrace, p.rowSub)
	return b
}

func (p *pushPlan) read(br pgx.BatchResults) error {
	var locked int64
	if err := br.QueryRow().Scan(&locked); err != nil {
		return fmt.Errorf("locking partitions: %w", err)
	}
	if locked != int64(len(p.partIDs)) {
		return fmt.Errorf("locking partitions: %w", errRaced)
	}
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("inserting messages: %w", err)
	}
	for rows.Next() {
		var ord int64
		var id string
		var n int64
		if err := rows.Scan(&ord, &id, &n); err != nil {
			rows.Close()
			return fmt.Errorf("inserting messages: %w", err)
		}
		r := &p.results[p.rowIdx[ord-1]]
		r.Status = StatusDuplicate
		r.MessageID = id
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("inserting messages: %w", err)
	}
	for i, j := range p.dupOf {
		r := &p.results[i]
		if first := p.results[j]; first.Status == StatusRejected {
			r.Status, r.MessageID, r.Error = StatusRejected, "", first.Error
			continue
		}
		r.Status = StatusDuplicate
		r.MessageID = p.results[j].MessageID
	}
	return nil
}
