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
	// Stream: the leases are for a stream of this instance (a WebSocket or
	// SSE subscription), given back when the instance restarts; false (an
	// HTTP pop): the client holds them, and they end by ack or expiry only.
	Stream bool
	// QueueMatch narrows a selection by namespace and task (Queue empty)
	// to the queues whose name matches this PostgreSQL regular expression
	// (the queues a token may consume); "" narrows nothing.
	QueueMatch string
	// SubscriptionMode "new" (or SubscriptionFrom "now") makes a group that
	// is new to the queue start after the messages already in it; a non-zero
	// SubscriptionFrom starts it at that instant. Ignored for known groups.
	SubscriptionMode string
	SubscriptionFrom string // "", "now" or RFC3339
	// LeaseID is the lease id to lease under (a UUID, NewID); "" means a
	// new one. Ignored with AutoAck. A caller that sets it can give the
	// lease back (ReleaseLease) when the pop fails with an unknown outcome
	// (OutcomeUnknown: its commit may have landed while its answer was
	// lost), rather than leave the messages leased to nobody until the
	// lease expires.
	LeaseID string
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
	// Dropped counts, per queue, the messages this pop gave up on as it
	// would have dead-lettered them, on a queue that keeps no dead letter
	// of them (deadLetterQueue or dlqAfterMaxRetries false). Nil when none.
	Dropped map[string]int
	// Expired counts, per queue, the messages this pop skipped because
	// they were older than their queue's ttl: finished for the group, not
	// delivered, no dead letter. Nil when none.
	Expired map[string]int

	undecryptable int // how many of DeadLettered failed to decrypt
	// moved: the rows whose cursor the pop moved (autoAck, dead letters),
	// marked after its commit (markRows).
	movedPids, movedGroups []string
}

// gaveUp reports whether the pop gave any message up or skipped one
// (what Config.OnGivenUp is told of).
func (r *PopResult) gaveUp() bool {
	return r.DeadLettered != nil || r.Dropped != nil || r.Expired != nil
}

// markMoved marks, after its commit, the rows a pop moved the cursor of
// (autoAck, dead letters): each may be caught up now.
func (s *Store) markMoved(ctx context.Context, res map[int]*PopResult, auto bool) {
	if !auto {
		return
	}
	type pair struct{ pid, group string }
	seen := map[pair]bool{}
	var pids, groups []string
	for _, r := range res {
		for _, m := range r.Messages {
			if k := (pair{m.PartitionID, m.Group}); !seen[k] {
				seen[k] = true
				pids, groups = append(pids, m.PartitionID), append(groups, m.Group)
			}
		}
	}
	s.markRows(context.WithoutCancel(ctx), pids, groups)
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
	case r.LeaseID != "" && !ValidUUID(r.LeaseID):
		return nil, false, inputErrorf("leaseId must be a UUID")
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
       coalesce(c.lease_from, 0), coalesce(` + leaseEnd("c") + `, 0), c.attempts, c.attempt_seq,
       q.lease_time, q.retry_limit, q.delayed_processing, q.ttl, ` + deadPolicyColumns + `
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

// nextExpired is the condition a consumer row c of the queue aliased q
// meets when its next stored message is older than the queue's ttl. Only
// Pop serves such a row (fetchClaimed skips what expired): the statements
// that lease for the poller (popAssignedSQL, popClaimSQL) leave it, and the
// pre-flight sends it to Pop, as a row whose expired lease gives a message
// up. The first message after the cursor, not the offset after it: that
// one may be gone (retention deleted it while the group's live lease kept
// the cursor from moving), with an expired one behind it. One index probe,
// for a queue with a ttl only.
func nextExpired(q string) string {
	return strings.ReplaceAll(`({q}.ttl > 0 AND coalesce((
		SELECT m.created_at FROM messages m WHERE m.partition_id = c.partition_id AND m.seq > c.cursor
		ORDER BY m.seq LIMIT 1) < now() - make_interval(secs => {q}.ttl), false))`, "{q}", q)
}

// onePartition narrows popLockSQL to the partition named $4.
const onePartition = "AND c.partition_id = (SELECT p1.id FROM partitions p1 WHERE p1.queue_id = q.id AND p1.name = $4)"

// claimed is one locked consumer row during a pop.
type claimed struct {
	partitionID, partition, queueID, queue string
	st                                     cursorState
	leaseTime, retryLimit, delay, ttl      int
	dead                                   deadPolicy
	msgs                                   []Message
}

// Pop leases messages per req. It never waits: an empty result means nothing
// is available now.
func (s *Store) Pop(ctx context.Context, req PopRequest) (*PopResult, error) {
	subFrom, subNow, err := req.normalize()
	if err != nil {
		return nil, err
	}
	// The group is reading (written at most every GroupSeenEvery; before
	// the pop, so that its answer waits for nothing after the commit).
	s.seen(ctx, [5][]string{{req.Queue}, {req.Namespace}, {req.Task}, {req.QueueMatch}, {req.Group}})
	var res *PopResult
	for attempt := 0; ; attempt++ {
		res = &PopResult{Group: req.Group}
		err = beginFunc(ctx, s.pool, func(tx pgx.Tx) error {
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
	s.markRows(context.WithoutCancel(ctx), res.movedPids, res.movedGroups)
	if f := s.cfg.OnGivenUp; f != nil && res.gaveUp() {
		f(res)
	}
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
	leaseID := req.LeaseID
	switch {
	case req.AutoAck:
		leaseID = ""
	case leaseID == "":
		leaseID = NewID()
	}
	bad, err := s.fetchClaimed(ctx, tx, req, claims, leaseID, res)
	if err != nil {
		return err
	}
	rows := decidePop(claims, req, leaseID, res)
	var u consumerUpdates
	for _, r := range rows {
		u.add(r.claim.partitionID, req.Group, &r.claim.st, r.leaseTime, s.leaseOwner(req.Stream), req.Subject)
		if req.AutoAck || len(dead) > 0 || len(bad) > 0 || res.Expired != nil {
			res.movedPids, res.movedGroups = append(res.movedPids, r.claim.partitionID), append(res.movedGroups, req.Group)
		}
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
			&c.leaseTime, &c.retryLimit, &c.delay, &c.ttl, &c.dead.drop, &c.dead.dropExhausted); err != nil {
			return nil, err
		}
		if leaseID != nil {
			c.st.leaseID = *leaseID
		}
		claims = append(claims, c)
	}
	return claims, rows.Err()
}
