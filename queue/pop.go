package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// PopRequest selects what to lease: a queue by name, or every queue of a
// namespace and/or task.
type PopRequest struct {
	Queue     string // one queue by name, or the queues matching
	Namespace string // a namespace,
	Task      string // a task, or both
	Partition string // zero means any partition
	Group     string // zero means DefaultGroup
	Batch     int    // messages at most; zero means 1
	// Partitions is how many partitions a wildcard pop may claim; zero means 1.
	// Batch still bounds the total.
	Partitions int
	AutoAck    bool // advance the cursor at delivery, keep no lease (at-most-once)
	// Subject is who pops (the token's sub; "" for none): the leases record
	// it, and acks and extensions by another non-admin subject are refused
	// (Ack.Holder).
	Subject string
	// QueueMatch narrows a selection by namespace and task (Queue empty)
	// to the queues whose name matches this PostgreSQL regular expression
	// (the queues a token may consume); "" narrows nothing.
	QueueMatch string
	// SubscriptionMode "new" (or SubscriptionFrom "now") makes a group that
	// is new to the queue start after the messages already in it; a non-zero
	// SubscriptionFrom starts it at that instant. Ignored for known groups.
	SubscriptionMode string
	SubscriptionFrom string // "", "now" or RFC3339
}

// Message is one delivered message.
type Message struct {
	ID            string
	TransactionID string
	TraceID       string
	Data          json.RawMessage
	ProducerSub   string
	CreatedAt     time.Time
	PartitionID   string
	Partition     string
	Queue         string
	LeaseID       string // "" with autoAck
	Group         string
	RetryCount    int
	Offset        int64
}

// PopResult is what one pop leased. Messages is empty when nothing was
// available; the other fields then are zero.
type PopResult struct {
	Queue             string
	Partition         string
	PartitionID       string
	LeaseID           string
	Group             string
	Messages          []Message
	PartitionsClaimed int
	// More is true when a partition it leased from holds messages past the
	// last one leased (as the consumer rows knew at the pop). PopAssigned
	// sets it; the poller, seeing it false, knows the partitions it claimed
	// are drained and needs no pre-flight to find that out.
	More bool
	// DeadLettered counts, per queue, the messages this pop moved to the
	// dead-letter queue because their lease expired once too often or
	// their payload failed to decrypt (they are not in Messages). Nil when
	// there were none.
	DeadLettered map[string]int

	undecryptable int // how many of DeadLettered failed to decrypt
}

// MaxBatch bounds one pop's batch, so one request cannot load a whole queue.
const MaxBatch = 10000

// MaxPartitions bounds how many partitions one pop may claim.
const MaxPartitions = 1000

// Validate checks a request as Pop would, without running it (for callers
// that hand it to the poller instead).
func (r PopRequest) Validate() error {
	_, _, err := r.normalize()
	return err
}

func (r *PopRequest) normalize() (subFrom *time.Time, subNow bool, err error) {
	if r.Group == "" {
		r.Group = DefaultGroup
	}
	if r.Batch == 0 {
		r.Batch = 1
	}
	if r.Partitions == 0 {
		r.Partitions = 1
	}
	switch {
	case r.Batch < 0 || r.Batch > MaxBatch:
		return nil, false, inputErrorf("batch must be between 1 and %d", MaxBatch)
	case r.Partitions < 0 || r.Partitions > MaxPartitions:
		return nil, false, inputErrorf("partitions must be between 1 and %d", MaxPartitions)
	case r.Queue == "" && r.Namespace == "" && r.Task == "":
		return nil, false, inputErrorf("queue, namespace or task is required")
	}
	if err := ValidateName("consumerGroup", r.Group); err != nil {
		return nil, false, err
	}
	for _, f := range []struct{ kind, v string }{{"queue", r.Queue}, {"partition", r.Partition}} {
		if f.v != "" {
			if err := ValidateName(f.kind, f.v); err != nil {
				return nil, false, err
			}
		}
	}
	if err := errors.Join(validText("namespace", r.Namespace), validText("task", r.Task),
		validText("queue match", r.QueueMatch)); err != nil {
		return nil, false, inputErrorf("%v", err)
	}
	if len(r.QueueMatch) > MaxQueueMatch {
		return nil, false, inputErrorf("a queue match is at most %d bytes", MaxQueueMatch)
	}
	// As the reference server: "new" (or new-only, the Go client's
	// spelling) starts after what is there; any other mode (all,
	// from_beginning, …) reads from the beginning.
	if r.SubscriptionMode == "new" || r.SubscriptionMode == "new-only" {
		subNow = true
	}
	switch r.SubscriptionFrom {
	case "":
	case "now":
		subNow = true
	default:
		t, perr := time.Parse(time.RFC3339Nano, r.SubscriptionFrom)
		if perr != nil {
			return nil, false, inputErrorf("subscriptionFrom must be now or an RFC3339 time")
		}
		subFrom, subNow = &t, false // a time wins over mode new
	}
	if r.Group == DefaultGroup {
		// Queue mode reads everything, whatever a request says (the
		// reference server ignores subscriptions there).
		return nil, false, nil
	}
	return subFrom, subNow, nil
}

// paramTypes mentions every selector parameter once, so Postgres can type
// the ones a filter variant does not use.
const paramTypes = "$1::text IS NOT NULL AND $2::text IS NOT NULL AND $3::text IS NOT NULL AND $4::text IS NOT NULL"

// MaxQueueMatch bounds PopRequest.QueueMatch and Target.QueueMatch.
const MaxQueueMatch = 256 << 10

// popFilter builds the WHERE fragment that selects queues. Parameters
// $1..$4 are queue name (or, selecting by namespace and task, the
// QueueMatch: see selector), namespace, task, partition name.
func popFilter(r *PopRequest) string {
	f := []string{paramTypes}
	if r.Queue != "" {
		f = append(f, "q.name = $1")
	} else {
		if r.QueueMatch != "" {
			f = append(f, "q.name ~ $1")
		}
		if r.Namespace != "" {
			f = append(f, "q.namespace = $2")
		}
		if r.Task != "" {
			f = append(f, "q.task = $3")
		}
	}
	return strings.Join(f, " AND ")
}

// selector is popFilter's $1: the queue's name, or for a selection by
// namespace and task the QueueMatch (one parameter, so every statement
// built on popFilter keeps its numbering).
func (r *PopRequest) selector() string {
	if r.Queue != "" {
		return r.Queue
	}
	return r.QueueMatch
}

// groupMissingSQL lists the queues the request selects that do not know
// the group yet. Parameters as popFilter, $5 group.
const groupMissingSQL = `-- herald:group_missing
SELECT q.id::text FROM queues q
WHERE %s AND NOT EXISTS (SELECT 1 FROM consumer_groups g WHERE g.queue_id = q.id AND g.name = $5)`

// groupLockSQL is groupMissingSQL that also locks those queues (FOR NO KEY
// UPDATE, which a partition's creation waits for: see resolvePartitions),
// in id order.
const groupLockSQL = groupMissingSQL + `
ORDER BY q.id
FOR NO KEY UPDATE OF q`

// groupPartitionsSQL share-locks the partitions of the queues being
// registered, in id order: a push in flight commits first, so the
// registration reads its last_offset; a later push sees the new rows.
const groupPartitionsSQL = `-- herald:group_partitions
SELECT count(*) FROM (SELECT 1 FROM partitions p WHERE p.queue_id = ANY($1::uuid[]) ORDER BY p.id FOR SHARE) x`

// groupRegisterSQL records a group's first subscription to each queue and
// gives it a consumer row on every partition, starting after the messages
// older than its subscription, and never before the partition's first
// remaining message (retention or a delete took those below it: a cursor
// under them would wait for offsets that never come). Offsets deleted above
// the start (message_holes) are finished for the new row as they are for
// the others: the ones right after the start move its cursor, the rest go
// into done. $1 queue ids, $2 group, $3 subscribe-now, $4 subscribe-from.
const groupRegisterSQL = `-- herald:group_register
WITH g AS (
	INSERT INTO consumer_groups (queue_id, name, subscribed_from, subscription_mode)
	SELECT id, $2, CASE WHEN $3::bool THEN now() ELSE $4::timestamptz END,
	       CASE WHEN $3::bool THEN 'new' WHEN $4::timestamptz IS NOT NULL THEN 'timestamp' END
	FROM unnest($1::uuid[]) AS id ORDER BY id
	ON CONFLICT DO NOTHING
	RETURNING queue_id, subscribed_from
)
INSERT INTO consumers (partition_id, consumer_group, queue_id, last_offset, cursor, done)
SELECT p.id, $2, p.queue_id, p.last_offset, s.cursor, s.done
FROM partitions p JOIN g ON g.queue_id = p.queue_id
CROSS JOIN LATERAL (
	SELECT greatest(CASE WHEN g.subscribed_from IS NULL THEN 0 ELSE coalesce((
		SELECT m.seq FROM messages m WHERE m.partition_id = p.id AND m.created_at < g.subscribed_from
		ORDER BY m.seq DESC LIMIT 1), 0) END,
		coalesce((SELECT min(m.seq) FROM messages m WHERE m.partition_id = p.id) - 1, p.last_offset)) AS start
) s0
CROSS JOIN LATERAL (
	SELECT s0.start + count(*) FILTER (WHERE h.seq = s0.start + h.rn) AS cursor,
	       coalesce(array_agg(h.seq ORDER BY h.seq) FILTER (WHERE h.seq <> s0.start + h.rn), '{}') AS done
	FROM (SELECT h.seq, row_number() OVER (ORDER BY h.seq) AS rn
	      FROM message_holes h WHERE h.partition_id = p.id AND h.seq > s0.start) h
) s
ORDER BY p.id
ON CONFLICT DO NOTHING`

// registerGroup registers req's group on the queues it selects that do not
// know it, in a transaction of its own that takes, in order: those queues'
// locks, their partitions' share locks (a statement of its own, so that
// the insert after it starts with a snapshot holding every push committed
// before the locks), then the rows. It holds no consumer row while it
// waits, so a push waiting for one cannot deadlock with it.
func (s *Store) registerGroup(ctx context.Context, req *PopRequest, subNow bool, subFrom *time.Time) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, fmt.Sprintf(groupLockSQL, popFilter(req)),
			req.selector(), req.Namespace, req.Task, req.Partition, req.Group)
		if err != nil {
			return err
		}
		ids, err := readIDs(rows)
		if err != nil || len(ids) == 0 {
			return err
		}
		b := &pgx.Batch{}
		b.Queue(groupPartitionsSQL, ids)
		b.Queue(groupRegisterSQL, ids, req.Group, subNow, subFrom)
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return fmt.Errorf("registering consumer group %s: %w", req.Group, err)
	}
	// A group on a big queue has just added a row per partition (rare:
	// not rate-limited).
	if _, err := s.AnalyzeGrown(ctx); err != nil && ctx.Err() == nil {
		s.log.Warn().Err(err).Msg("analyzing grown tables")
	}
	return nil
}

// readIDs collects a one-column text result.
func readIDs(rows pgx.Rows) ([]string, error) {
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, id)
	}
	rows.Close()
	return out, rows.Err()
}

// popLockSQL claims (partition, group) pairs that have work, no live lease,
// are past the window buffer and whose next message is past the delay.
// Queues of higher priority go first (a pop by namespace or task selects
// several, as the reference server orders them), then the least recently
// leased, so busy partitions cannot starve others.
// Each selected queue is read as one range of consumers_ready: the cost does
// not grow with its partitions. A pop over several queues locks up to $6
// rows in each and keeps $6 (the others are free again at its commit).
// $5 group, $6 how many; %[2]s narrows to one partition by name ($4).
var popLockSQL = `-- herald:pop_lock
SELECT c.partition_id::text, p.name, q.id::text, q.name, c.cursor, c.done, c.lease_id::text,
       coalesce(c.lease_from, 0), coalesce(c.lease_to, 0), c.attempts, c.attempt_seq,
       q.lease_time, q.retry_limit, q.delayed_processing
FROM queues q
CROSS JOIN LATERAL (
	SELECT c.* FROM consumers c
	WHERE c.queue_id = q.id AND c.consumer_group = $5 AND c.last_offset > c.cursor %[2]s
	  AND ` + leasableNow("q") + `
	ORDER BY c.lease_expires_at NULLS FIRST, c.leased_at NULLS FIRST, c.partition_id
	LIMIT $6
	FOR UPDATE SKIP LOCKED
) c
JOIN partitions p ON p.id = c.partition_id
WHERE %[1]s
ORDER BY q.priority DESC, c.lease_expires_at NULLS FIRST, c.leased_at NULLS FIRST, c.partition_id
LIMIT $6`

// leasableNow is the condition a consumer row c of the queue aliased q
// meets when it may be leased now: no live lease, its partition past the
// window buffer, its next message past the delay. Pops claim by it
// (popLockSQL).
func leasableNow(q string) string {
	return strings.ReplaceAll(`(c.lease_expires_at IS NULL OR c.lease_expires_at <= now())
	  AND ({q}.window_buffer = 0 OR (SELECT p.last_push_at FROM partitions p WHERE p.id = c.partition_id)
	       <= now() - make_interval(secs => {q}.window_buffer))
	  AND ({q}.delayed_processing = 0 OR EXISTS (
		SELECT 1 FROM messages m WHERE m.partition_id = c.partition_id AND m.seq = c.cursor + 1
		AND m.created_at <= now() - make_interval(secs => {q}.delayed_processing)))`, "{q}", q)
}

// onePartition narrows popLockSQL to the partition named $4.
const onePartition = "AND c.partition_id = (SELECT p1.id FROM partitions p1 WHERE p1.queue_id = q.id AND p1.name = $4)"

// popFetchSQL reads up to lim messages after each cursor. visible is false
// for a message still inside the queue's delay; delivery stops there so order
// holds.
const popFetchSQL = `-- herald:pop_fetch
SELECT c.ord, m.seq, m.id::text, m.transaction_id, coalesce(m.trace_id::text, ''), coalesce(m.producer_sub, ''),
       m.payload::text, m.created_at, m.created_at <= now() - make_interval(secs => c.delay) AS visible
FROM unnest($1::text[], $2::bigint[], $3::int[], $4::int[]) WITH ORDINALITY AS c(pid, cur, lim, delay, ord)
CROSS JOIN LATERAL (
	SELECT * FROM messages m WHERE m.partition_id = c.pid::uuid AND m.seq > c.cur ORDER BY m.seq LIMIT c.lim
) m
ORDER BY c.ord, m.seq`

// consumerUpdateSQL writes changed consumer rows back. A NULL ltime keeps
// the expiry (and owner and subject) of the lease the row already has.
const consumerUpdateSQL = `-- herald:consumer_update
UPDATE consumers c SET cursor = u.cur, done = u.done::bigint[], attempts = u.att, attempt_seq = u.aseq,
	lease_id = u.lease::uuid,
	lease_owner = CASE WHEN u.lease IS NULL THEN NULL ELSE coalesce(u.owner, c.lease_owner) END,
	lease_subject = CASE WHEN u.ltime IS NULL OR u.lease IS NULL THEN c.lease_subject ELSE u.subj END,
	lease_expires_at = CASE WHEN u.lease IS NULL THEN NULL
		WHEN u.ltime IS NULL THEN c.lease_expires_at ELSE now() + make_interval(secs => u.ltime) END,
	lease_from = CASE WHEN u.lease IS NULL THEN NULL ELSE u.lfrom END,
	lease_to = CASE WHEN u.lease IS NULL THEN NULL ELSE u.lto END,
	delivered_to = greatest(c.delivered_to, CASE WHEN u.lease IS NULL THEN 0 ELSE u.lto END),
	leased_at = CASE WHEN u.ltime IS NULL THEN c.leased_at ELSE now() END
FROM unnest($1::text[], $2::bigint[], $3::text[], $4::int[], $5::bigint[], $6::text[], $7::int[],
            $8::bigint[], $9::bigint[], $10::text[], $11::text[], $12::text[])
     AS u(pid, cur, done, att, aseq, lease, ltime, lfrom, lto, grp, owner, subj)
WHERE c.partition_id = u.pid::uuid AND c.consumer_group = u.grp`

// claimed is one locked consumer row during a pop.
type claimed struct {
	partitionID, partition, queueID, queue string
	st                                     cursorState
	leaseTime, retryLimit, delay           int
	msgs                                   []Message
}

// Pop leases messages per req. It never waits: an empty result means nothing
// is available now.
func (s *Store) Pop(ctx context.Context, req PopRequest) (*PopResult, error) {
	subFrom, subNow, err := req.normalize()
	if err != nil {
		return nil, err
	}
	var res *PopResult
	for attempt := 0; ; attempt++ {
		res = &PopResult{Group: req.Group}
		err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			return s.popTx(ctx, tx, &req, attempt == 0, res)
		})
		if !errors.Is(err, errUnregistered) {
			break
		}
		// Rare: the group is new to a queue. It is registered in a
		// transaction of its own, which holds no consumer row while it
		// waits for pushes to the queue's partitions; then the pop runs
		// again.
		if err := s.registerGroup(ctx, &req, subNow, subFrom); err != nil {
			return nil, err
		}
	}
	if err != nil {
		return nil, err
	}
	s.countDecryptFailures(res.undecryptable) // once committed
	return res, nil
}

// errUnregistered: the pop's group is not registered on a queue it selects.
var errUnregistered = errors.New("consumer group not registered on the queue")

// popTx leases in tx: claimPartitions locks the consumer rows, expireLeases
// (no database) charges the expired leases among them, fetchClaimed reads
// the messages after their cursors, decidePop (no database) leases what
// was read, and one batch writes the dead letters and the rows. With
// register, a queue that does not know the group yet fails it with
// errUnregistered (before anything is written), for Pop to register the
// group and run it again; otherwise such queues are skipped.
func (s *Store) popTx(ctx context.Context, tx pgx.Tx, req *PopRequest, register bool, res *PopResult) error {
	claims, err := claimPartitions(ctx, tx, req, register)
	if err != nil || len(claims) == 0 {
		return err
	}
	dead := expireLeases(claims, req.Group, res)
	leaseID := NewID()
	if req.AutoAck {
		leaseID = ""
	}
	bad, err := s.fetchClaimed(ctx, tx, req, claims, leaseID, res)
	if err != nil {
		return err
	}
	rows := decidePop(claims, req, leaseID, res)
	var u consumerUpdates
	for _, r := range rows {
		u.add(r.claim.partitionID, req.Group, &r.claim.st, r.leaseTime, s.cfg.InstanceID, req.Subject)
	}
	w := &pgx.Batch{}
	queueDeadLetters(w, append(dead, bad...))
	u.queue(w)
	if w.Len() == 0 {
		return nil
	}
	if err := tx.SendBatch(ctx, w).Close(); err != nil {
		return fmt.Errorf("writing the lease: %w", err)
	}
	return nil
}

// claimPartitions locks the consumer rows req may lease, up to
// req.Partitions (one with req.Partition), claiming again a few times when
// rows it could have had were locked by others.
func claimPartitions(ctx context.Context, tx pgx.Tx, req *PopRequest, register bool) ([]*claimed, error) {
	filter := popFilter(req)
	args := []any{req.selector(), req.Namespace, req.Task, req.Partition, req.Group}
	limit, one := 1, onePartition
	if req.Partition == "" {
		limit, one = req.Partitions, ""
	}
	lockSQL := fmt.Sprintf(popLockSQL, filter, one)
	b := &pgx.Batch{}
	b.Queue(fmt.Sprintf(groupMissingSQL, filter), args...)
	b.Queue(lockSQL, append(args, limit)...)
	br := tx.SendBatch(ctx, b)
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, fmt.Errorf("checking consumer group: %w", err)
	}
	missing, err := readIDs(rows)
	if err != nil {
		_ = br.Close()
		return nil, fmt.Errorf("checking consumer group: %w", err)
	}
	if len(missing) > 0 && register {
		_ = br.Close()
		return nil, errUnregistered
	}
	rows, err = br.Query()
	if err != nil {
		_ = br.Close()
		return nil, fmt.Errorf("claiming partitions: %w", err)
	}
	claims, err := readClaims(rows)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("claiming partitions: %w", err)
	}
	eligible := len(claims)
	if len(claims) < limit {
		// Fewer than it may take: were rows skipped for a lock?
		if err := tx.QueryRow(ctx, popEligibleSQL(lockSQL), append(args, limit)...).Scan(&eligible); err != nil {
			return nil, fmt.Errorf("claiming partitions: %w", err)
		}
	}
	for try := 0; try < claimRetries && len(claims) < min(limit, eligible); try++ {
		// Rows were skipped for a lock: most often a push's ready marking,
		// held for microseconds. Claim again, keeping one claim per
		// partition.
		rows, err := tx.Query(ctx, lockSQL, append(args, limit)...)
		if err != nil {
			return nil, fmt.Errorf("claiming partitions: %w", err)
		}
		more, err := readClaims(rows)
		if err != nil {
			return nil, fmt.Errorf("claiming partitions: %w", err)
		}
		claims = mergeClaims(claims, more, limit)
	}
	return claims, nil
}

// claimRetries bounds how often a pop claims again after skipping rows
// other transactions held.
const claimRetries = 3

// popEligibleSQL counts what lockSQL (popLockSQL) would claim if no other
// transaction held a row, locking nothing: a pop that claimed fewer knows
// it skipped locked rows.
func popEligibleSQL(lockSQL string) string {
	return "-- herald:pop_eligible\nSELECT count(*) FROM (" +
		strings.ReplaceAll(lockSQL, "FOR UPDATE SKIP LOCKED", "") + "\n) eligible"
}

// mergeClaims adds to claims those of more on partitions it lacks, up to
// limit in all.
func mergeClaims(claims, more []*claimed, limit int) []*claimed {
	have := make(map[string]bool, len(claims))
	for _, c := range claims {
		have[c.partitionID] = true
	}
	for _, c := range more {
		if len(claims) >= limit {
			break
		}
		if !have[c.partitionID] {
			have[c.partitionID] = true
			claims = append(claims, c)
		}
	}
	return claims
}

// readClaims reads popLockSQL's rows.
func readClaims(rows pgx.Rows) ([]*claimed, error) {
	defer rows.Close()
	var claims []*claimed
	for rows.Next() {
		c := &claimed{}
		var leaseID *string
		if err := rows.Scan(&c.partitionID, &c.partition, &c.queueID, &c.queue, &c.st.cursor, &c.st.done, &leaseID,
			&c.st.leaseFrom, &c.st.leaseTo, &c.st.attempts, &c.st.attemptSeq,
			&c.leaseTime, &c.retryLimit, &c.delay); err != nil {
			return nil, err
		}
		if leaseID != nil {
			c.st.leaseID = *leaseID
		}
		claims = append(claims, c)
	}
	return claims, rows.Err()
}

// maxFetchRounds bounds how often one pop reads a partition further after
// payloads that failed to decrypt; past it the pop returns what it has.
const maxFetchRounds = 8

// fetchClaimed reads the messages of the claimed partitions into their
// msgs, in offset order, up to req.Batch in all. Rows are fetched enough
// per partition to fill the batch after skipping offsets done out of order.
// A payload that fails to decrypt is not delivered: the message is marked
// done and returned in bad, to be dead-lettered for the group
// (DecryptError), and the partition is read further so that the batch
// still fills in order.
func (s *Store) fetchClaimed(ctx context.Context, tx pgx.Tx, req *PopRequest, claims []*claimed, leaseID string,
	res *PopResult) (bad []deadLetter, err error) {
	remaining := req.Batch
	stopped := make([]bool, len(claims))
	after := make([]int64, len(claims)) // the next read starts after this offset
	for i, c := range claims {
		after[i] = c.st.cursor
	}
	for round := 0; round < maxFetchRounds && remaining > 0; round++ {
		var idx []int // claims read this round
		var pids []string
		var curs []int64
		var lims, delays []int32
		for i, c := range claims {
			if !stopped[i] {
				idx = append(idx, i)
				pids, curs = append(pids, c.partitionID), append(curs, after[i])
				lims = append(lims, int32(remaining+len(c.st.done)))
				delays = append(delays, int32(c.delay))
			}
		}
		if len(idx) == 0 {
			break
		}
		rows, err := tx.Query(ctx, popFetchSQL, pids, curs, lims, delays)
		if err != nil {
			return nil, fmt.Errorf("reading messages: %w", err)
		}
		read := make([]int, len(idx))
		failed := 0
		for rows.Next() {
			var ord int64
			var m Message
			var payload string
			var visible bool
			if err := rows.Scan(&ord, &m.Offset, &m.ID, &m.TransactionID, &m.TraceID, &m.ProducerSub, &payload, &m.CreatedAt, &visible); err != nil {
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
			if !visible || remaining == 0 {
				stopped[i] = true
				continue
			}
			plain, ok := s.open(payload, sealRef{c.partitionID, m.TransactionID, m.ID})
			if !ok {
				s.log.Warn().Str("queue", c.queue).Str("partitionId", c.partitionID).Str("messageId", m.ID).
					Int64("offset", m.Offset).Str("group", req.Group).Msg("payload failed to decrypt: dead-lettered, not delivered")
				bad = append(bad, deadLetter{partitionID: c.partitionID, seq: m.Offset, group: req.Group, err: DecryptError,
					retries: c.st.retryCount(m.Offset)})
				c.st.markDone(m.Offset)
				if res.DeadLettered == nil {
					res.DeadLettered = map[string]int{}
				}
				res.DeadLettered[c.queue]++
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

// consumerUpdates batches consumer rows to write with consumerUpdateSQL.
type consumerUpdates struct {
	pid, done, lease, grp, owner, subj []*string
	cur, aseq, lfrom, lto              []int64
	att                                []int32
	ltime                              []*int32
}

// add queues a row. leaseTime ≥ 0 starts a new lease of that many seconds,
// held by owner for subject; -1 keeps the expiry of an existing lease.
func (u *consumerUpdates) add(partitionID, group string, st *cursorState, leaseTime int, owner, subject string) {
	u.pid = append(u.pid, &partitionID)
	u.grp = append(u.grp, &group)
	u.cur = append(u.cur, st.cursor)
	d := st.doneLiteral()
	u.done = append(u.done, &d)
	u.att = append(u.att, int32(st.attempts))
	u.aseq = append(u.aseq, st.attemptSeq)
	u.lease = append(u.lease, optString(st.leaseID))
	u.lfrom = append(u.lfrom, st.leaseFrom)
	u.lto = append(u.lto, st.leaseTo)
	if leaseTime >= 0 {
		lt := int32(leaseTime)
		u.ltime = append(u.ltime, &lt)
		u.owner = append(u.owner, &owner)
		u.subj = append(u.subj, optString(subject))
	} else {
		u.ltime = append(u.ltime, nil)
		u.owner = append(u.owner, nil)
		u.subj = append(u.subj, nil)
	}
}

func (u *consumerUpdates) exec(ctx context.Context, q querier) error {
	if len(u.pid) == 0 {
		return nil
	}
	_, err := q.Exec(ctx, consumerUpdateSQL,
		u.pid, u.cur, u.done, u.att, u.aseq, u.lease, u.ltime, u.lfrom, u.lto, u.grp, u.owner, u.subj)
	if err != nil {
		return fmt.Errorf("updating consumers: %w", err)
	}
	return nil
}

// queue adds the update to b instead of running it.
func (u *consumerUpdates) queue(b *pgx.Batch) {
	if len(u.pid) == 0 {
		return
	}
	b.Queue(consumerUpdateSQL, u.pid, u.cur, u.done, u.att, u.aseq, u.lease, u.ltime, u.lfrom, u.lto, u.grp, u.owner, u.subj)
}
