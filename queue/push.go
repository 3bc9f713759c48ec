package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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

// pushNow runs one push (runPush), leasing to the consumers the HandOff
// reserves, and retries once when a cached partition id turned out to
// belong to a deleted queue.
func (s *Store) pushNow(ctx context.Context, items []PushItem) ([]PushResult, error) {
	for attempt := 0; ; attempt++ {
		plan, err := s.planPush(ctx, s.pool, items)
		if err == nil {
			s.reserve(plan)
			err = s.runPush(ctx, plan)
			plan.settle(err, items)
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

// runPush sends plan's transaction, in one round trip. Its statement
// marks every row that needs it: a row an ack or pop leaves caught up
// after the statement read it is marked by that ack or pop after its
// commit, which waits for this push's partition locks (queueReady).
//
// The transaction is the pipeline's own, with no BEGIN or COMMIT
// statement: the extended protocol runs every statement before a Sync (pgx
// sends one per batch) in one implicit transaction, committed at the Sync
// and rolled back whole when a statement fails (an error skips the
// statements after it). Two statements fewer per push, each a bind and
// execute in PostgreSQL and an encode and decode here.
func (s *Store) runPush(ctx context.Context, plan *pushPlan) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("pushing: %w", err)
	}
	defer conn.Release()
	// The commit's answer comes with the Sync's, which Close reads.
	if err := plan.send(ctx, conn, s.leaseOwner, "committing the push"); err != nil {
		rollbackIfOpen(ctx, conn)
		return err
	}
	return nil
}

// rollbackIfOpen leaves conn clean for the pool (which closes a connection
// returned inside a transaction) after a batch that failed midway.
func rollbackIfOpen(ctx context.Context, conn *pgxpool.Conn) {
	if conn.Conn().PgConn().TxStatus() != 'I' {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
	}
}

// readyUpdateSQL copies each partition's last_offset to its consumer rows
// that are caught up (last_offset <= cursor) and lag behind it (of the
// rows filter selects), which puts them in consumers_ready; lock is the
// rows' locking clause. A row already ready is left alone: its copy is a
// lower bound, and whoever leaves it caught up marks it again. A row only
// ever moves forward, and rows are locked in key order, as acks lock them.
func readyUpdateSQL(name, from, filter, lock string) string {
	return "-- herald:" + name + `
WITH l AS (
	SELECT c.partition_id, c.consumer_group, p.last_offset
	FROM ` + from + `
	WHERE ` + filter + ` c.last_offset <= c.cursor AND c.last_offset < p.last_offset
	ORDER BY c.partition_id, c.consumer_group
	` + lock + `
)
UPDATE consumers c SET last_offset = l.last_offset FROM l
WHERE c.partition_id = l.partition_id AND c.consumer_group = l.consumer_group AND c.last_offset < l.last_offset`
}

const readyFromPartitions = `partitions p JOIN consumers c ON c.partition_id = p.id`

// readySQL marks the caught-up rows of the partitions $1 after a
// statement moved their cursors, or after a transaction's pushes.
var readySQL = readyUpdateSQL("ready", readyFromPartitions, "p.id = ANY($1::uuid[]) AND", "FOR NO KEY UPDATE OF c")

// readyRowsSQL is readySQL for the rows ($1 partition ids, $2 groups) an
// ack or a pop may have left caught up.
var readyRowsSQL = readyUpdateSQL("ready_rows", `unnest($1::text[], $2::text[]) AS k(pid, grp)
	JOIN consumers c ON c.partition_id = k.pid::uuid AND c.consumer_group = k.grp
	JOIN partitions p ON p.id = c.partition_id`, "", "FOR NO KEY UPDATE OF c")

// readyRowsPendingSQL is readyRowsSQL returning the rows it marked and
// whether their group has messages waiting now (the partition's
// last_offset, read under the marking's share lock, above the cursor): a
// push leaves the row of a group that is behind alone, so the copy an ack
// read cannot say whether messages came meanwhile, and the marking, which
// reads the partition anyway, can. A row it leaves alone was marked by a
// push after the ack's commit, and that push wakes its consumers itself.
var readyRowsPendingSQL = readyRowsSQL + `
RETURNING c.partition_id::text, c.consumer_group, c.last_offset > c.cursor`

// repairReadySQL is readySQL over every partition, skipping rows others
// hold (whoever holds one now marks it after its commit, or the next
// repair sees it).
var repairReadySQL = readyUpdateSQL("ready_repair", readyFromPartitions, "", "FOR NO KEY UPDATE OF c SKIP LOCKED")

// readyLockSQL share-locks the partitions $1 in id order before a
// marking: a push in flight on one of them (which holds its lock until its
// commit) commits first, and the marking, a statement after the lock, reads
// its last_offset. Without the wait, an ack that left a row caught up
// while such a push ran could miss it: the push read the row as ready
// (before the ack's commit), and the marking read the partition before the
// push's commit. Partitions before consumer rows: the push's lock order.
const readyLockSQL = `-- herald:ready_lock
SELECT count(*) FROM (SELECT 1 FROM partitions WHERE id = ANY($1::uuid[]) ORDER BY id FOR SHARE) x`

// queueReady adds to b, after the caller's COMMIT, a marking (readySQL or
// readyRowsSQL with args, of the partitions pids) in a transaction of its
// own that commits without waiting for its WAL flush: it copies what
// committed data says, and RepairReady redoes whatever a crash loses. It
// writes nothing, and so commits nothing, when every row it selects is
// marked already.
func queueReady(b *pgx.Batch, pids []string, sql string, args ...any) {
	b.Queue("BEGIN")
	b.Queue("SET LOCAL synchronous_commit = off")
	b.Queue(readyLockSQL, pids)
	b.Queue(sql, args...)
	b.Queue("COMMIT")
}

// sendReady runs the ready marking of partIDs on q.
func sendReady(ctx context.Context, q querier, partIDs []string) error {
	b := &pgx.Batch{}
	queueReady(b, partIDs, readySQL, partIDs)
	if err := q.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("marking consumer rows ready: %w", err)
	}
	return nil
}

// markRows marks the rows (pids[i], groups[i]) after a commit that may have
// left them caught up (an ack, a pop with autoAck, a dead letter). A
// failure is logged: RepairReady, run by the hygiene loop, catches up.
func (s *Store) markRows(ctx context.Context, pids, groups []string) {
	if len(pids) == 0 {
		return
	}
	b := &pgx.Batch{}
	queueReady(b, pids, readyRowsSQL, pids, groups)
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		s.logMarkingFailed(err, len(pids))
	}
}

func (s *Store) logMarkingFailed(err error, rows int) {
	s.log.Error().Err(err).Int("rows", rows).
		Msg("marking consumer rows ready failed: their messages wait for the next push or repair")
}

// markRowsPending is markRows telling which rows have messages waiting
// once marked (readyRowsPendingSQL). ok is false when the marking failed
// (logged): the caller then cannot tell, and counts every row as pending.
func (s *Store) markRowsPending(ctx context.Context, pids, groups []string) (pending map[consumerKey]bool, ok bool) {
	if len(pids) == 0 {
		return nil, true
	}
	b := &pgx.Batch{}
	queueReady(b, pids, readyRowsPendingSQL, pids, groups)
	br := s.pool.SendBatch(ctx, b)
	pending, err := readMarked(br)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		s.logMarkingFailed(err, len(pids))
		return nil, false
	}
	return pending, true
}

// readMarked reads the results queueReady added with readyRowsPendingSQL:
// the rows it marked that have messages waiting.
func readMarked(br pgx.BatchResults) (map[consumerKey]bool, error) {
	for range 3 { // BEGIN, SET LOCAL, the partitions' share lock
		if _, err := br.Exec(); err != nil {
			return nil, err
		}
	}
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	pending := map[consumerKey]bool{}
	for rows.Next() {
		var k consumerKey
		var waiting bool
		if err := rows.Scan(&k.partitionID, &k.group, &waiting); err != nil {
			rows.Close()
			return nil, err
		}
		if waiting {
			pending[k] = true
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	_, err = br.Exec() // COMMIT
	return pending, err
}

// markReady runs the ready marking of partIDs on a connection of its own:
// after a transaction's pushes committed, or again after it failed with
// first. A failure is logged (RepairReady, run by the hygiene loop,
// catches up).
func (s *Store) markReady(ctx context.Context, partIDs []string, first error) {
	if err := sendReady(ctx, s.pool, partIDs); err != nil {
		s.log.Error().Err(err).AnErr("first", first).Int("partitions", len(partIDs)).
			Msg("marking pushed partitions ready failed: their messages wait for the next repair")
	}
}

// RepairReady marks ready every consumer row whose partition got messages
// it was not marked for: after a crash lost a push's marking (it commits
// without waiting for its flush) or a marking failed. It scans every
// partition, so it runs at start and in the hygiene loop, not per push. It
// returns how many rows it marked.
func (s *Store) RepairReady(ctx context.Context) (int64, error) {
	tag, err := s.pool.Exec(ctx, repairReadySQL)
	if err != nil {
		return 0, fmt.Errorf("repairing ready consumer rows: %w", err)
	}
	n := tag.RowsAffected()
	if n > 0 {
		s.log.Warn().Int64("rows", n).Msg("marked consumer rows ready that a push had not marked (a crash or a failed marking)")
	}
	return n, nil
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
	if err := plan.send(ctx, tx, s.leaseOwner, "pushing"); err != nil {
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

	// The hand-off (see HandOff): the reservations the statement may
	// lease to, what it leased, and when the leased messages were stored.
	handOff  HandOff
	reserved []Reservation
	handed   map[consumerKey]handedLease
	created  map[string]map[int64]time.Time
}

// ValidatePushItems checks items as Push does before it touches the
// database: names, trace ids, transaction ids, producer subjects. A push
// buffered on disk (push maintenance) is checked with it, so that what is
// accepted then is what Push would have accepted.
func ValidatePushItems(items []PushItem) error { return validatePushItems(items) }

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

// pushLockSQL takes the partition row locks in id order (no deadlocks
// between pushes to overlapping partitions) and counts the partitions it
// locked: fewer than the push names means one is gone (its queue was
// deleted since the id was cached), and then the push statement
// (pushStatements) writes nothing (bumped finds no partition to bump, or
// its guard across partitions holds back the others) and pushPlan.read
// reports errRaced, so the caller retries with fresh ids. The statement
// after it starts with a snapshot taken after the locks, so it sees every
// committed duplicate. NO KEY UPDATE: the locks do not block the key-share
// locks a dead-letter insert takes on the partition. Plain SQL: the lock_partitions function
// (migration 0007), which raised instead, cost PostgreSQL about three
// times the CPU of this statement per push (a PL/pgSQL call with its own
// search_path).
const pushLockSQL = `-- herald:push_lock
SELECT count(*) FROM (SELECT 1 FROM partitions WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE) x`

// renewingSQL, in the push statement's lk (consumer row c, bumped partition b):
// c's lease follows the partition, is live and this instance's, and a
// reservation of its stream names it (Reservation.Extend) with the credit
// for all the push's messages: the push hands them to it, renewing it.
const renewingSQL = `(coalesce(c.follow_lease = c.lease_id, false) AND c.lease_expires_at > clock_timestamp()
	       AND EXISTS (SELECT 1 FROM handoff h WHERE h.pid = c.partition_id AND h.grp = c.consumer_group
	                   AND h.ext = c.lease_id AND NOT h.auto AND h.owner = c.lease_owner AND b.base + h.lim >= b.last_offset))`

// pushForm is which of the hand-off's steps a push statement has: those
// that can matter for the push's reservations.
type pushForm int

const (
	// pushPlain: no reservation (no HandOff installed, nobody of this
	// instance waiting for the push's partitions, a transaction's push).
	// pushExtending with empty hand-off arrays has handoff and followed
	// empty, lk's renewing false (it needs a reservation naming the
	// lease), renewed, handed and extended writing nothing, and the
	// duplicates alone in its answer; this form leaves those steps out and
	// takes $1–$6 only. What a push does for consumers it does all the
	// same: closed ends a following lease it does not hand its messages
	// to, woke marks the caught-up rows.
	pushPlain pushForm = iota
	// pushLeasing: reservations, none naming a stream's lease to extend
	// (Reservation.Extend: long-polls, SSE subscriptions, a stream with no
	// lease on the partition). followed, renewing (and so renewed) and
	// extended need a reservation's lease (h.ext): this form leases
	// caught-up rows (handed) and nothing else.
	pushLeasing
	// pushExtending: a reservation names a stream's lease; every step.
	pushExtending
)

// pushOps are the forms' op names (the statements' "-- herald:" tag).
var pushOps = [...]string{pushPlain: "push_insert_lean", pushLeasing: "push_insert_lease", pushExtending: "push_insert"}

// pushStatements are the push statement's forms (pushStatement), by
// pushForm and by whether they have bumped's all-or-nothing guard, which a
// push to one partition does without: it only tells partitions apart (one
// partition gone is not bumped, guard or none). A push sends the one whose
// steps can matter for it (pushPlan.queue): each step left out cost
// PostgreSQL its executor start and end even with no row to touch; per
// push in a tight loop, the plain form about 100 µs less than the
// extending one, the leasing form about 55 µs less, the guard 10–25 µs
// (bench/results/lean-push-statement-cpu-tight-loop.txt).
//
// The statement finds duplicates, numbers the fresh rows densely per
// partition from last_offset, bumps last_offset and inserts. It marks
// ready the consumer rows of its partitions that are caught up
// (last_offset <= cursor: the partial index consumers_caught_up), and only
// those: a row already ready stays ready whatever its copy of last_offset
// (a lower bound), so groups that are not reading cost the push nothing.
// No pop can take anything from a caught-up row before this commits, so
// holding it does not hide work. It leases to the consumers a HandOff
// reserved ($7–$10, $11 the leases' owners, $12 their subjects, $13
// autoAck): a reserved group's row gets the lease of the partition's new
// messages (with autoAck: its cursor moves past them) if it is caught up
// to them (its cursor at the old last offset, nothing done above it, no
// lease) on a queue with no delay and no window. Rows: kind 0 a duplicate
// (ord, message id), kind 1 a lease taken (partition, group, range), kind
// 2 a leased message's offset and created_at.
var pushStatements = func() (out [3][2]string) {
	for f := range out {
		out[f] = [2]string{pushStatement(pushForm(f), false), pushStatement(pushForm(f), true)}
	}
	return out
}()

// pushStatement assembles the push statement of form f from the steps
// every push runs (pushRowsSQL, pushLockedSQL, pushClosedSQL, pushWokeSQL,
// pushInsertedSQL, pushDupRowsSQL), the hand-off's its form has, and with
// guarded bumped's guard (pushGuardSQL).
func pushStatement(f pushForm, guarded bool) string {
	rows := pushRowsSQL("")
	if guarded {
		rows = pushRowsSQL(pushGuardSQL)
	}
	head := "-- herald:" + pushOps[f] + "\n" + rows
	switch f {
	case pushPlain:
		return head + pushLockedSQL("false", "") + pushClosedSQL + pushWokeSQL("") + pushInsertedSQL + pushDupRowsSQL
	case pushLeasing:
		return head + pushReservedSQL + pushLockedSQL("false", "") + pushClosedSQL + pushHandedSQL + pushHandLeasedSQL +
			pushWokeSQL(pushNotHandedSQL) + pushInsertedSQL + pushDupRowsSQL + pushHandRowsSQL
	default:
		return head + pushReservedSQL + pushFollowedSQL + pushLockedSQL(renewingSQL, pushNotFollowedSQL) + pushClosedSQL +
			pushRenewedSQL + pushHandedSQL + pushExtendedSQL + pushHandSQL + pushWokeSQL(pushNotHandedSQL) + pushInsertedSQL +
			pushDupRowsSQL + pushHandRowsSQL
	}
}

// pushNotFollowedSQL, in lk: not a row followed read.
const pushNotFollowedSQL = `
	  AND NOT EXISTS (SELECT 1 FROM followed f WHERE f.partition_id = c.partition_id AND f.consumer_group = c.consumer_group)`

// pushNotHandedSQL, in woke: not a row handed leased.
const pushNotHandedSQL = `
	  AND NOT EXISTS (SELECT 1 FROM handed h WHERE h.partition_id = c.partition_id AND h.consumer_group = c.consumer_group)`

// pushGuardSQL: bumped's all-or-nothing guard, for a push to more than
// one partition (pushStatements).
const pushGuardSQL = `
	  AND (SELECT count(*) FROM partitions x WHERE x.id IN (SELECT partition_id FROM counts)) = (SELECT count(*) FROM counts)`

// pushRowsSQL: the push's rows (input), the duplicates among them, the
// fresh ones numbered per partition, and the partitions bumped;
// guard is pushGuardSQL or empty.
func pushRowsSQL(guard string) string {
	return `WITH input AS (
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
	-- follow_xid: the follow order's key (migration 0015), never lower
	-- than the partition's previous one nor this transaction's id. All or
	-- nothing: with a partition of the push gone (pushLockSQL locked
	-- fewer), no partition is bumped, so nothing below writes (the guard,
	-- pushGuardSQL, across partitions: one gone is bumped by neither form).
	UPDATE partitions p SET last_offset = p.last_offset + c.n, last_push_at = now(),
		follow_xid = greatest(p.follow_xid, pg_current_xact_id())
	FROM counts c WHERE p.id = c.partition_id` + guard + `
	RETURNING p.id, p.last_offset, p.last_offset - c.n AS base, p.queue_id, p.follow_xid
)`
}

// pushReservedSQL: the reservations ($7–$15).
const pushReservedSQL = `, handoff AS (
	SELECT h.pid::uuid AS pid, h.grp, h.lease::uuid AS lease, h.lim, h.subj, h.auto, h.owner, h.ext::uuid AS ext, h.fol
	FROM unnest($7::text[], $8::text[], $9::text[], $10::int[], $12::text[], $13::bool[], $11::text[], $14::text[], $15::bool[])
	     AS h(pid, grp, lease, lim, subj, auto, owner, ext, fol)
)`

// pushFollowedSQL: the following leases the push hands its messages to by
// reading their rows.
const pushFollowedSQL = `, followed AS (
	-- A stream's lease that follows the partition (follow_lease, migration
	-- 0022: every message since its lease_to went to its stream) takes the
	-- push's messages when its stream's credit covers them all: read, not
	-- written, so the push waits for no ack holding the row, while at
	-- least half its lease time is left: each message it is handed gets
	-- that much from its hand-off, and the lease outlives the push's
	-- commit (an expiry meanwhile would not count what it was handed).
	-- With less left, the push renews it (lk, renewed).
	SELECT c.partition_id, c.consumer_group, b.base + 1 AS lfrom, b.last_offset AS lto, 1 AS ext
	FROM handoff h JOIN bumped b ON b.id = h.pid
	JOIN consumers c ON c.partition_id = h.pid AND c.consumer_group = h.grp
	JOIN queues q ON q.id = c.queue_id
	WHERE h.ext IS NOT NULL AND NOT h.auto AND c.lease_id = h.ext AND c.follow_lease = h.ext
	  AND c.lease_owner = h.owner AND c.lease_expires_at > clock_timestamp() + make_interval(secs => q.lease_time / 2.0)
	  AND b.base + h.lim >= b.last_offset
)`

// pushLockedSQL: the consumer rows the statement may write; renewing is
// the condition for a following lease the push renews (renewingSQL, or
// false with no reservation), notFollowed leaves out the rows followed
// read.
func pushLockedSQL(renewing, notFollowed string) string {
	return `, lk AS (
	-- The rows this statement may write, locked in key order: the caught-up
	-- ones (consumers_caught_up; a reserved group's row that can be handed
	-- off is one of them, its cursor at the old last offset), and those
	-- whose lease follows the partition but was not read above: handed
	-- this push's messages with its time renewed (renewing: live, this
	-- instance's, its stream's credit covers them), or not handed them
	-- (closing). Read again once locked (an ack or a nack may have held
	-- the row).
	SELECT c.partition_id, c.consumer_group,
	       coalesce(c.follow_lease = c.lease_id, false) AND NOT ` + renewing + ` AS closing,
	       ` + renewing + ` AS renewing
	FROM bumped b JOIN consumers c ON c.partition_id = b.id
	WHERE (c.last_offset <= c.cursor AND c.last_offset < b.last_offset AND NOT coalesce(c.follow_lease = c.lease_id, false)
	       OR c.follow_lease = c.lease_id)` + notFollowed + `
	ORDER BY c.partition_id, c.consumer_group
	FOR NO KEY UPDATE OF c
)`
}

// pushClosedSQL: following leases the push does not hand its messages to.
const pushClosedSQL = `, closed AS (
	-- A following lease this push does not hand its messages to (its
	-- stream lacks the credit, is on another instance or gone) stops
	-- following: it covers what its stream was sent, every message up to
	-- the old last offset, and ends if all of that is done; the row is
	-- marked for the rest, which a pop takes once the lease ends.
	UPDATE consumers c SET
		follow_lease = NULL,
		lease_id = CASE WHEN c.cursor >= b.base AND c.done = '{}' THEN NULL ELSE c.lease_id END,
		lease_owner = CASE WHEN c.cursor >= b.base AND c.done = '{}' THEN NULL ELSE c.lease_owner END,
		lease_expires_at = CASE WHEN c.cursor >= b.base AND c.done = '{}' THEN NULL ELSE c.lease_expires_at END,
		lease_from = CASE WHEN c.cursor >= b.base AND c.done = '{}' THEN NULL ELSE c.lease_from END,
		lease_to = CASE WHEN c.cursor >= b.base AND c.done = '{}' THEN NULL ELSE greatest(c.lease_to, b.base) END,
		delivered_to = greatest(c.delivered_to, b.base),
		last_offset = greatest(c.last_offset, b.last_offset)
	FROM lk JOIN bumped b ON b.id = lk.partition_id
	WHERE lk.closing AND c.partition_id = lk.partition_id AND c.consumer_group = lk.consumer_group
	  AND c.follow_lease = c.lease_id
)`

// pushRenewedSQL: following leases renewed as the push hands them its
// messages.
const pushRenewedSQL = `, renewed AS (
	-- A following lease with less than half its lease time left takes the
	-- push's messages with its time started again, as an ack starts it:
	-- every message it is handed gets at least half its lease time, and
	-- the row is written about once per half lease time while it follows.
	UPDATE consumers c SET
		lease_expires_at = greatest(c.lease_expires_at, now() + make_interval(secs => q.lease_time)),
		lease_to = greatest(c.lease_to, b.last_offset),
		delivered_to = greatest(c.delivered_to, b.last_offset),
		last_offset = greatest(c.last_offset, b.last_offset)
	FROM lk JOIN bumped b ON b.id = lk.partition_id, queues q
	WHERE lk.renewing AND c.partition_id = lk.partition_id AND c.consumer_group = lk.consumer_group
	  AND q.id = c.queue_id AND c.follow_lease = c.lease_id
	RETURNING c.partition_id, c.consumer_group, b.base + 1 AS lfrom, b.last_offset AS lto, 1 AS ext
)`

// pushHandedSQL: the caught-up rows leased to their reservations.
const pushHandedSQL = `, handed AS (
	UPDATE consumers c SET
		lease_id = CASE WHEN h.auto THEN NULL ELSE h.lease END,
		lease_owner = CASE WHEN h.auto THEN NULL ELSE h.owner END,
		lease_subject = CASE WHEN h.auto THEN c.lease_subject ELSE h.subj END,
		lease_expires_at = CASE WHEN h.auto THEN NULL ELSE now() + make_interval(secs => q.lease_time) END,
		lease_from = CASE WHEN h.auto THEN NULL ELSE b.base + 1 END,
		lease_to = CASE WHEN h.auto THEN NULL ELSE least(b.last_offset, b.base + h.lim) END,
		-- A stream's lease that took every message follows the partition.
		follow_lease = CASE WHEN h.fol AND NOT h.auto AND b.base + h.lim >= b.last_offset THEN h.lease END,
		cursor = CASE WHEN h.auto THEN least(b.last_offset, b.base + h.lim) ELSE c.cursor END,
		delivered_to = greatest(c.delivered_to, CASE WHEN h.auto THEN 0 ELSE least(b.last_offset, b.base + h.lim) END),
		leased_at = now(), last_offset = greatest(c.last_offset, b.last_offset), attempts = 0, attempt_seq = 0
	FROM handoff h JOIN bumped b ON b.id = h.pid JOIN lk ON lk.partition_id = h.pid AND lk.consumer_group = h.grp, queues q
	WHERE c.partition_id = h.pid AND c.consumer_group = h.grp AND q.id = c.queue_id AND NOT lk.closing AND NOT lk.renewing
	  AND c.cursor = b.base AND c.done = '{}' AND c.lease_id IS NULL
	  AND q.delayed_processing = 0 AND q.window_buffer = 0
	RETURNING c.partition_id, c.consumer_group, b.base + 1 AS lfrom, least(b.last_offset, b.base + h.lim) AS lto
)`

// pushExtendedSQL: the leases grown over the push (Reservation.Extend).
const pushExtendedSQL = `, extended AS (
	-- A stream's lease that covers every message of the partition so far
	-- (its lease_to at the old last offset), live and this instance's,
	-- grows over the push's (Reservation.Extend), and follows the partition
	-- from now on when it took them all; its time starts again. lk never
	-- holds such a row (its lease is unacked). An ack that ends that lease
	-- while this runs leaves the row caught up (the row is read again once
	-- its lock is free): it is then leased afresh, as handed does with a
	-- row caught up before.
	UPDATE consumers c SET
		lease_id = coalesce(c.lease_id, h.lease),
		lease_owner = h.owner,
		lease_subject = CASE WHEN c.lease_id IS NULL THEN h.subj ELSE c.lease_subject END,
		lease_expires_at = CASE WHEN c.lease_id IS NULL THEN now() + make_interval(secs => q.lease_time)
			ELSE greatest(c.lease_expires_at, now() + make_interval(secs => q.lease_time)) END,
		lease_from = CASE WHEN c.lease_id IS NULL THEN b.base + 1 ELSE c.lease_from END,
		lease_to = least(b.last_offset, b.base + h.lim),
		follow_lease = CASE WHEN b.base + h.lim >= b.last_offset THEN coalesce(c.lease_id, h.lease) END,
		delivered_to = greatest(c.delivered_to, least(b.last_offset, b.base + h.lim)),
		leased_at = CASE WHEN c.lease_id IS NULL THEN now() ELSE c.leased_at END,
		attempts = CASE WHEN c.lease_id IS NULL THEN 0 ELSE c.attempts END,
		attempt_seq = CASE WHEN c.lease_id IS NULL THEN 0 ELSE c.attempt_seq END,
		last_offset = greatest(c.last_offset, b.last_offset)
	FROM handoff h JOIN bumped b ON b.id = h.pid, queues q
	WHERE h.ext IS NOT NULL AND NOT h.auto AND c.partition_id = h.pid AND c.consumer_group = h.grp AND q.id = c.queue_id
	  AND (c.lease_id = h.ext AND c.lease_owner = h.owner AND c.lease_to = b.base AND c.lease_expires_at > now()
	       AND NOT coalesce(c.follow_lease = c.lease_id, false)
	       OR c.lease_id IS NULL AND c.cursor = b.base AND c.done = '{}')
	  AND q.delayed_processing = 0 AND q.window_buffer = 0
	  AND NOT EXISTS (SELECT 1 FROM lk WHERE lk.partition_id = c.partition_id AND lk.consumer_group = c.consumer_group)` +
	pushNotFollowedSQL + `
	RETURNING c.partition_id, c.consumer_group, b.base + 1 AS lfrom, least(b.last_offset, b.base + h.lim) AS lto,
		(c.lease_id = h.ext)::int AS ext
)`

// pushHandSQL: every lease the push hands its messages to.
const pushHandSQL = `, hand AS (
	SELECT h.*, 0 AS ext FROM handed h UNION ALL SELECT * FROM extended UNION ALL SELECT * FROM followed
	UNION ALL SELECT * FROM renewed
)`

// pushHandLeasedSQL is pushHandSQL with no reservation extending (no
// followed, renewed or extended).
const pushHandLeasedSQL = `, hand AS (
	SELECT h.*, 0 AS ext FROM handed h
)`

// pushWokeSQL: the caught-up rows marked ready; notHanded leaves out the
// rows the push leased to.
func pushWokeSQL(notHanded string) string {
	return `, woke AS (
	UPDATE consumers c SET last_offset = b.last_offset
	FROM lk JOIN bumped b ON b.id = lk.partition_id
	WHERE c.partition_id = lk.partition_id AND c.consumer_group = lk.consumer_group AND c.last_offset < b.last_offset
	  AND NOT lk.closing AND NOT lk.renewing` + notHanded + `
)`
}

// pushInsertedSQL: the fresh rows stored.
const pushInsertedSQL = `, inserted AS (
	INSERT INTO messages (partition_id, seq, id, transaction_id, trace_id, producer_sub, payload, queue_id, follow_xid)
	SELECT f.partition_id, b.base + f.rn, f.id, f.txid, f.trace_id, f.producer_sub, f.payload, b.queue_id, b.follow_xid
	FROM fresh f JOIN bumped b ON b.id = f.partition_id
	RETURNING partition_id, seq, created_at
)
`

// pushDupRowsSQL: the answer's duplicates (kind 0).
const pushDupRowsSQL = `SELECT 0, d.ord, d.id::text, '', 0::bigint, 0::bigint, NULL::timestamptz FROM dups d`

// pushHandRowsSQL: the answer's leases (kind 1) and their messages'
// offsets and creation times (kind 2).
const pushHandRowsSQL = `
UNION ALL
SELECT 1, h.ext, h.partition_id::text, h.consumer_group, h.lfrom, h.lto, NULL FROM hand h
UNION ALL
SELECT 2, 0, i.partition_id::text, '', i.seq, 0, i.created_at FROM inserted i
WHERE EXISTS (SELECT 1 FROM hand h WHERE h.partition_id = i.partition_id AND i.seq BETWEEN h.lfrom AND h.lto)`

// batchSender is what a push plan is sent on: a pool connection (the
// push's own pipeline, runPush) or an open transaction (pushTx).
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// send sends the push's two statements on c in one round trip and reads
// their answers (owner as queue's). A failure of the batch's Close, which
// reads the Sync's answer, is wrapped with closing.
func (p *pushPlan) send(ctx context.Context, c batchSender, owner func(stream bool) string, closing string) error {
	b := &pgx.Batch{}
	p.queue(b, owner)
	br := c.SendBatch(ctx, b)
	err := p.read(br)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("%s: %w", closing, cerr)
	}
	return err
}

// form is the push statement's form for p's reservations.
func (p *pushPlan) form() pushForm {
	if len(p.reserved) == 0 {
		return pushPlain
	}
	for _, r := range p.reserved {
		if r.Extend != "" {
			return pushExtending
		}
	}
	return pushLeasing
}

// queue adds the push's two statements to b; owner names the owner of a
// lease it hands off (Store.leaseOwner). The push statement has the steps
// that can matter for the push (pushStatements).
func (p *pushPlan) queue(b *pgx.Batch, owner func(stream bool) string) {
	b.Queue(pushLockSQL, p.partIDs)
	form, guarded := p.form(), 0
	if len(p.partIDs) > 1 {
		guarded = 1
	}
	sql := pushStatements[form][guarded]
	if form == pushPlain {
		b.Queue(sql, p.rowPart, p.rowTx, p.rowID, p.rowPayload, p.rowTrace, p.rowSub)
		return
	}
	hp, hg, hl, hn, hs, ha, ho, he, hf := p.handOffArgs(owner)
	b.Queue(sql, p.rowPart, p.rowTx, p.rowID, p.rowPayload, p.rowTrace, p.rowSub, hp, hg, hl, hn, ho, hs, ha, he, hf)
}

func (p *pushPlan) read(br pgx.BatchResults) error {
	var locked int64
	if err := br.QueryRow().Scan(&locked); err != nil {
		return fmt.Errorf("locking partitions: %w", err)
	}
	if locked != int64(len(p.partIDs)) {
		// A partition is gone: the insert wrote nothing (bumped's guard).
		_, _ = br.Exec()
		return fmt.Errorf("locking partitions: %w", errRaced)
	}
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("inserting messages: %w", err)
	}
	for rows.Next() {
		var kind int32
		var ord, from, to int64
		var id, group string
		var created *time.Time
		if err := rows.Scan(&kind, &ord, &id, &group, &from, &to, &created); err != nil {
			rows.Close()
			return fmt.Errorf("inserting messages: %w", err)
		}
		switch kind {
		case 0:
			r := &p.results[p.rowIdx[ord-1]]
			r.Status = StatusDuplicate
			r.MessageID = id
		case 1:
			if p.handed == nil {
				p.handed = map[consumerKey]handedLease{}
			}
			p.handed[consumerKey{id, group}] = handedLease{from, to, ord == 1}
		case 2:
			if p.created == nil {
				p.created = map[string]map[int64]time.Time{}
			}
			if p.created[id] == nil {
				p.created[id] = map[int64]time.Time{}
			}
			if created != nil {
				p.created[id][from] = *created
			}
		}
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
