package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Message states a browse reports. A message's state over its partition's
// consumer groups is the state of the group furthest behind: pending when
// some group waits for it and holds no live lease over it, processing when
// every group that waits for it holds it under a live lease, completed when
// every group has finished it; dead_letter, before all of these, when a
// group gave up on it. A partition without groups has everything pending.
const (
	StatePending    = "pending"
	StateProcessing = "processing"
	StateCompleted  = "completed"
	StateDeadLetter = "dead_letter"
)

// ValidState reports whether s is one of the states above.
func ValidState(s string) bool {
	switch s {
	case StatePending, StateProcessing, StateCompleted, StateDeadLetter:
		return true
	}
	return false
}

// MessageQuery filters a message listing.
type MessageQuery struct {
	Queue, Partition string // "" for any
	Namespace, Task  string // "" for any
	State            string // "" for any, or a State*
	// From and To bound the creation time: at or after From, before To;
	// zero leaves that end open.
	From, To time.Time
	Limit    int // zero means 200
	Offset   int
	Scope    *Scope
}

// MessageInfo is one listed message (no payload).
type MessageInfo struct {
	ID, TransactionID, TraceID, ProducerSub string
	PartitionID, Partition                  string
	Queue, Namespace, Task                  string
	Priority                                int
	Offset                                  int64
	CreatedAt                               time.Time
	State                                   string
	// QueueState is the state for the queue-mode group (DefaultGroup)
	// alone; "" when the partition has no such group.
	QueueState string
	// ConsumedBy of BusGroups named groups (every group but the queue
	// mode's) have finished it.
	ConsumedBy, BusGroups int
	// LeaseExpiresAt is the latest expiry of the live leases over it.
	LeaseExpiresAt *time.Time
}

// Mode says which kinds of consumer group the queues listed have.
type Mode struct {
	QueueMode bool // the queue-mode group (DefaultGroup) consumes
	BusGroups int  // named groups
}

// Type is the reference server's name of a mode: queue, bus, hybrid or none.
func (m Mode) Type() string {
	switch {
	case m.QueueMode && m.BusGroups > 0:
		return "hybrid"
	case m.QueueMode:
		return "queue"
	case m.BusGroups > 0:
		return "bus"
	}
	return "none"
}

// MessageList is one page of messages, newest first.
type MessageList struct {
	Messages []MessageInfo
	Mode     Mode
}

// messageStateSQL is a LATERAL subquery over the consumer rows of the
// partition {pid} for the message at offset {seq}: per group, 2 finished
// (at or below the cursor, or done), 1 under a live lease, 0 waiting; and
// the groups that dead-lettered it. Cost: the partition's consumer rows
// (primary key) and one probe of dead_letters_message.
const messageStateSQL = `(
	SELECT count(*) AS groups, count(*) FILTER (WHERE x.st = 2) AS finished,
	       count(*) FILTER (WHERE x.st = 1) AS leased,
	       count(*) FILTER (WHERE x.st = 2 AND c.consumer_group <> '` + DefaultGroup + `') AS bus_done,
	       count(*) FILTER (WHERE c.consumer_group <> '` + DefaultGroup + `') AS bus_groups,
	       max(x.st) FILTER (WHERE c.consumer_group = '` + DefaultGroup + `') AS qm,
	       max(c.lease_expires_at) FILTER (WHERE x.st = 1) AS lease_expires_at,
	       (SELECT array_agg(DISTINCT d.consumer_group) FROM dead_letters d
	        WHERE d.partition_id = {pid} AND d.seq = {seq}) AS dlq
	FROM consumers c
	CROSS JOIN LATERAL (SELECT CASE WHEN {seq} <= c.cursor OR {seq} = ANY (c.done) THEN 2
	                                WHEN c.lease_expires_at > now() AND {seq} BETWEEN c.lease_from AND c.lease_to THEN 1
	                                ELSE 0 END AS st) x
	WHERE c.partition_id = {pid}
)`

// stateSQL is the state of a message from messageStateSQL's columns (alias g).
const stateSQL = `CASE WHEN g.dlq IS NOT NULL THEN '` + StateDeadLetter + `'
	WHEN g.groups = 0 THEN '` + StatePending + `'
	WHEN g.finished = g.groups THEN '` + StateCompleted + `'
	WHEN g.finished + g.leased = g.groups THEN '` + StateProcessing + `'
	ELSE '` + StatePending + `' END`

func messageState(pid, seq string) string {
	return strings.NewReplacer("{pid}", pid, "{seq}", seq).Replace(messageStateSQL)
}

// PushSlack bounds how long a push's transaction runs between its start
// (a partition's last_push_at) and the insert of its messages (their
// created_at, the insert's clock). The listing below relies on it: a
// partition last pushed to at L holds no message created after L +
// PushSlack. Herald's own pushes take milliseconds; a SQL producer calling
// herald.push() inside a transaction of over a minute may see its messages
// left out of a listing's time window or newest-first cut.
const PushSlack = time.Minute

// Listing messages newest first over many partitions, without an index on
// created_at (one would cost every push), goes by partitions instead:
// inside a partition offsets follow created_at (a push inserts under the
// partition's lock, created_at is the insert's clock), and a partition
// last pushed to at L holds nothing newer than L + PushSlack. So the
// partitions are taken in chunks, most recently pushed first
// (browseMessagePartitionsSQL), each chunk gives its newest limit + offset
// matching messages (browseMessageCandidatesSQL), and the listing stops
// when it has limit + offset messages all newer than what the rest could
// hold. Its cost is the selected partitions rows per chunk (a sort of their
// last push times) and, per partition of the chunks read, up to
// limit + offset messages by primary key; with a state filter each message
// read also gets its state (the partition's consumer rows and a dead-letter
// probe), within the offsets where that state can be (pending and
// processing above the lowest cursor, processing inside live leases,
// completed below the highest finished offset, dead letters from
// dead_letters_message). Partitions not pushed to since From are never
// read. Recent pushes spread over many partitions end the listing in the
// first chunk; pushes to every partition within the same minute make it
// read them all.

// browseMessageQueuesSQL selects the queues of a listing: $1 name, $2
// namespace, $3 task (NULL: any), $4 the scope's queue patterns. With it
// the kinds of consumer group they have. Cost: the queues table and
// consumer_groups.
var browseMessageQueuesSQL = `-- herald:browse_message_queues
SELECT q.id::text,
       EXISTS (SELECT 1 FROM consumer_groups g WHERE g.queue_id = q.id AND g.name = '` + DefaultGroup + `'),
       coalesce((SELECT array_agg(g.name) FROM consumer_groups g WHERE g.queue_id = q.id AND g.name <> '` + DefaultGroup + `'), '{}')
FROM queues q
WHERE ($1::text IS NULL OR q.name = $1) AND ($2::text IS NULL OR q.namespace = $2)
  AND ($3::text IS NULL OR q.task = $3) AND ` + queueInScope("q.name", 4)

// browseMessagePartitionsSQL declares the cursor of a listing's
// partitions: those of queues $1 (NULL: every queue) named $2 (NULL: any),
// pushed to since $3 less PushSlack (NULL: ever), in scope ($4/$5, the
// first %s), that may hold a message in state $6 (the second %s,
// partitionsInState), most recently pushed first, with what the
// candidates statement shows of them. The listing fetches it in chunks; it
// ends with the transaction. Cost: the selected partitions rows (the
// queues' index ranges, or for a state the consumer rows or dead letters
// that can hold it) and one sort of them.
const browseMessagePartitionsSQL = `-- herald:browse_message_partitions
DECLARE herald_listing NO SCROLL CURSOR FOR
SELECT p.id::text, p.name, p.last_offset, q.name, q.namespace, q.task, q.priority, p.last_push_at
FROM partitions p JOIN queues q ON q.id = p.queue_id
WHERE ($1::uuid[] IS NULL OR p.queue_id = ANY ($1::uuid[])) AND ($2::text IS NULL OR p.name = $2)
  AND p.last_push_at IS NOT NULL AND ($3::timestamptz IS NULL OR p.last_push_at >= $3::timestamptz - interval '1 minute')
  AND %s AND %s AND $6::text IS NOT NULL
ORDER BY p.last_push_at DESC, p.id DESC`

// partitionsInState narrow browseMessagePartitionsSQL to the partitions
// that can hold a message in a state: pending, where a group waits
// (consumers_ready) or none consumes; processing, under a live lease
// (consumers_lease_id); dead_letter, with a dead letter.
var partitionsInState = map[string]string{
	"": "true",
	StatePending: `(p.id IN (SELECT c.partition_id FROM consumers c WHERE c.last_offset > c.cursor
	                          AND ($1::uuid[] IS NULL OR c.queue_id = ANY ($1::uuid[])))
	     OR NOT EXISTS (SELECT 1 FROM consumer_groups g WHERE g.queue_id = p.queue_id))`,
	StateProcessing: `p.id IN (SELECT c.partition_id FROM consumers c WHERE c.lease_id IS NOT NULL AND c.lease_expires_at > now())`,
	StateCompleted:  "true",
	StateDeadLetter: `p.id IN (SELECT d.partition_id FROM dead_letters d WHERE $1::uuid[] IS NULL OR d.queue_id = ANY ($1::uuid[]))`,
}

// browseMessageCandidatesSQL gives the newest $2 messages of partitions
// $1 created in [$3, $4) (NULL: open) in state $5 (empty: any), with their
// state. $6–$11 are the partitions' names, last offsets, queue names,
// namespaces, tasks and priorities, as the cursor read them. %[1]s: the
// rows of one partition s (the state filter's variant); %[2]s its bounds b
// (stateBounds or allOffsets); %[3]s the state of a message of the cut.
//
// The filter on $3 is applied after each partition's cut, so a partition
// is read from its newest message down to its $2'th, never further: where
// a message older than $3 is reached, every later one is older too.
const browseMessageCandidatesSQL = `-- herald:browse_message_candidates
WITH sel AS (
	SELECT * FROM unnest($1::uuid[], $6::text[], $7::bigint[], $8::text[], $9::text[], $10::text[], $11::int[])
	       AS s(pid, pname, last_offset, qname, namespace, task, priority)
), cand AS (
	SELECT s.pid, s.pname, s.qname, s.namespace, s.task, s.priority,
	       m.seq, m.id, m.transaction_id, m.trace_id, m.producer_sub, m.created_at
	FROM sel s
	CROSS JOIN LATERAL (%[2]s) b
	CROSS JOIN LATERAL (%[1]s) m
	WHERE b.lo < b.hi
), top AS (
	SELECT * FROM cand WHERE $3::timestamptz IS NULL OR cand.created_at >= $3
	ORDER BY cand.created_at DESC, cand.id DESC
	LIMIT $2
)
SELECT top.id::text, top.transaction_id, coalesce(top.trace_id::text, ''), coalesce(top.producer_sub, ''),
       top.pid::text, top.pname, top.qname, top.namespace, top.task, top.priority, top.seq, top.created_at,
       ` + stateSQL + `, g.qm, g.dlq, g.bus_done, g.bus_groups, g.lease_expires_at
FROM top CROSS JOIN LATERAL ` + "%[3]s" + ` g
ORDER BY top.created_at DESC, top.id DESC`

// stateBounds is, for partition s of browseMessageCandidatesSQL, the
// offsets (lo, hi] where a message in state $5 can be. Cost: its consumer
// rows.
const stateBounds = `
		SELECT CASE $5::text WHEN 'pending' THEN coalesce(min(c.cursor), 0)
		            WHEN 'processing' THEN coalesce(min(c.lease_from) FILTER (WHERE c.lease_expires_at > now()) - 1, s.last_offset)
		            ELSE 0 END AS lo,
		       CASE $5::text WHEN 'completed' THEN coalesce(min(greatest(c.cursor, coalesce(c.done[cardinality(c.done)], 0))), 0)
		            WHEN 'processing' THEN coalesce(max(c.lease_to) FILTER (WHERE c.lease_expires_at > now()), 0)
		            ELSE s.last_offset END AS hi
		FROM consumers c WHERE c.partition_id = s.pid`

// allOffsets is stateBounds with no state filter: the whole partition.
const allOffsets = `SELECT 0::bigint AS lo, s.last_offset AS hi`

// messagesOfPartition reads partition s within offsets (b.lo, b.hi],
// newest first, filtered by state.
var messagesOfPartition = `
		SELECT m.seq, m.id, m.transaction_id, m.trace_id, m.producer_sub, m.created_at
		FROM messages m CROSS JOIN LATERAL ` + messageState("m.partition_id", "m.seq") + ` g
		WHERE m.partition_id = s.pid AND m.seq > b.lo AND m.seq <= b.hi
		  AND ($4::timestamptz IS NULL OR m.created_at < $4)
		  AND ($5::text = '' OR ` + stateSQL + ` = $5::text)
		ORDER BY m.seq DESC LIMIT $2`

// messagesOfPartitionAny is messagesOfPartition with no state filter: the
// state is computed for the chunk's newest only.
const messagesOfPartitionAny = `
		SELECT m.seq, m.id, m.transaction_id, m.trace_id, m.producer_sub, m.created_at
		FROM messages m
		WHERE m.partition_id = s.pid AND m.seq > b.lo AND m.seq <= b.hi
		  AND ($4::timestamptz IS NULL OR m.created_at < $4) AND $5::text = ''
		ORDER BY m.seq DESC LIMIT $2`

// deadLettersOfPartition is messagesOfPartition for the dead_letter state:
// the partition's dead letters (dead_letters_message, newest offset first)
// and their messages.
const deadLettersOfPartition = `
		SELECT m.seq, m.id, m.transaction_id, m.trace_id, m.producer_sub, m.created_at
		FROM (SELECT DISTINCT d.seq FROM dead_letters d WHERE d.partition_id = s.pid ORDER BY d.seq DESC) ds
		JOIN messages m ON m.partition_id = s.pid AND m.seq = ds.seq
		WHERE ($4::timestamptz IS NULL OR m.created_at < $4) AND $5::text <> ''
		ORDER BY m.seq DESC LIMIT $2`

// candidatesSQL is browseMessageCandidatesSQL for a state filter.
func candidatesSQL(state string) string {
	rowsOf, bounds := messagesOfPartition, stateBounds
	switch state {
	case "":
		rowsOf, bounds = messagesOfPartitionAny, allOffsets
	case StateDeadLetter:
		rowsOf, bounds = deadLettersOfPartition, allOffsets
	}
	return fmt.Sprintf(browseMessageCandidatesSQL, rowsOf, bounds, messageState("top.pid", "top.seq"))
}

// Chunks of partitions a listing reads: the first, and the largest it
// doubles to.
const (
	listChunkFirst = 256
	listChunkMax   = 16384
)

// BrowseMessages lists messages newest first, without payloads.
func (s *Store) BrowseMessages(ctx context.Context, qry MessageQuery) (*MessageList, error) {
	if qry.Limit == 0 {
		qry.Limit = 200
	}
	if err := checkPage(qry.Limit, qry.Offset); err != nil {
		return nil, err
	}
	if qry.State != "" && !ValidState(qry.State) {
		return nil, inputErrorf("status must be pending, processing, completed or dead_letter")
	}
	for _, f := range []struct{ kind, v string }{{"queue", qry.Queue}, {"partition", qry.Partition}} {
		if f.v != "" {
			if err := ValidateName(f.kind, f.v); err != nil {
				return nil, err
			}
		}
	}
	if err := errors.Join(validText("namespace", qry.Namespace), validText("task", qry.Task)); err != nil {
		return nil, inputErrorf("%v", err)
	}
	if err := qry.Scope.validate(); err != nil {
		return nil, err
	}
	from, to := optTime(qry.From), optTime(qry.To)
	a, b := qry.Scope.args()
	k := qry.Limit + qry.Offset
	out := &MessageList{Messages: []MessageInfo{}}
	err := s.browse(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, browseMessageQueuesSQL, optString(qry.Queue), optString(qry.Namespace),
			optString(qry.Task), a)
		if err != nil {
			return fmt.Errorf("selecting queues: %w", err)
		}
		var ids []string
		bus := map[string]bool{}
		for rows.Next() {
			var id string
			var qm bool
			var groups []string
			if err := rows.Scan(&id, &qm, &groups); err != nil {
				rows.Close()
				return fmt.Errorf("selecting queues: %w", err)
			}
			ids = append(ids, id)
			out.Mode.QueueMode = out.Mode.QueueMode || qm
			for _, g := range groups {
				bus[g] = true
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("selecting queues: %w", err)
		}
		out.Mode.BusGroups = len(bus)
		if len(ids) == 0 {
			return nil
		}
		var queues any = ids
		if qry.Queue == "" && qry.Namespace == "" && qry.Task == "" && qry.Scope == nil {
			queues = nil // every queue: no list to match
		}
		declare := fmt.Sprintf(browseMessagePartitionsSQL, inScope("q.name", "p.name", 4, 5), partitionsInState[qry.State])
		if _, err := tx.Exec(ctx, declare, queues, optString(qry.Partition), from, a, b, qry.State); err != nil {
			return fmt.Errorf("selecting partitions: %w", err)
		}
		var merged []MessageInfo
		cand := candidatesSQL(qry.State)
		for chunk := listChunkFirst; ; chunk = min(2*chunk, listChunkMax) {
			parts, err := messagePartitions(ctx, tx, chunk)
			if err != nil {
				return err
			}
			if len(parts.ids) == 0 {
				break
			}
			found, err := messageCandidates(ctx, tx, cand, parts, k, from, to, qry.State)
			if err != nil {
				return err
			}
			merged = mergeNewest(merged, found, k)
			if len(parts.ids) < chunk {
				break // no partition left
			}
			if len(merged) == k && merged[k-1].CreatedAt.After(parts.last.Add(PushSlack)) {
				break // the rest holds nothing newer than what the page has
			}
		}
		if qry.Offset < len(merged) {
			out.Messages = merged[qry.Offset:min(len(merged), k)]
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing messages: %w", err)
	}
	return out, nil
}

// listChunk is one chunk of a listing's partitions, as arrays for
// browseMessageCandidatesSQL.
type listChunk struct {
	ids, names, queues, namespaces, tasks []string
	lastOffsets                           []int64
	priorities                            []int32
	last                                  time.Time // the last push of the last one
}

// messagePartitions fetches the next chunk of the listing's partitions.
func messagePartitions(ctx context.Context, tx pgx.Tx, chunk int) (*listChunk, error) {
	rows, err := tx.Query(ctx, fmt.Sprintf("-- herald:browse_message_partitions_fetch\nFETCH %d FROM herald_listing", chunk))
	if err != nil {
		return nil, fmt.Errorf("selecting partitions: %w", err)
	}
	defer rows.Close()
	c := &listChunk{}
	for rows.Next() {
		var id, name, q, ns, task string
		var last int64
		var prio int32
		if err := rows.Scan(&id, &name, &last, &q, &ns, &task, &prio, &c.last); err != nil {
			return nil, fmt.Errorf("selecting partitions: %w", err)
		}
		c.ids, c.names, c.lastOffsets = append(c.ids, id), append(c.names, name), append(c.lastOffsets, last)
		c.queues, c.namespaces, c.tasks = append(c.queues, q), append(c.namespaces, ns), append(c.tasks, task)
		c.priorities = append(c.priorities, prio)
	}
	return c, rows.Err()
}

// messageCandidates reads browseMessageCandidatesSQL for one chunk.
func messageCandidates(ctx context.Context, tx pgx.Tx, sql string, c *listChunk, k int, from, to *time.Time,
	state string) ([]MessageInfo, error) {
	rows, err := tx.Query(ctx, sql, c.ids, k, from, to, state, c.names, c.lastOffsets, c.queues, c.namespaces, c.tasks,
		c.priorities)
	if err != nil {
		return nil, fmt.Errorf("reading messages: %w", err)
	}
	defer rows.Close()
	var out []MessageInfo
	for rows.Next() {
		var m MessageInfo
		var qm *int32
		var dlq []string
		if err := rows.Scan(&m.ID, &m.TransactionID, &m.TraceID, &m.ProducerSub, &m.PartitionID, &m.Partition, &m.Queue,
			&m.Namespace, &m.Task, &m.Priority, &m.Offset, &m.CreatedAt, &m.State, &qm, &dlq, &m.ConsumedBy,
			&m.BusGroups, &m.LeaseExpiresAt); err != nil {
			return nil, fmt.Errorf("reading messages: %w", err)
		}
		m.QueueState = queueModeState(qm, dlq)
		out = append(out, m)
	}
	return out, rows.Err()
}

// mergeNewest merges two lists newest first (creation time, then id) and
// keeps the first k.
func mergeNewest(a, b []MessageInfo, k int) []MessageInfo {
	out := append(a, b...)
	slices.SortFunc(out, func(x, y MessageInfo) int {
		if c := y.CreatedAt.Compare(x.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(y.ID, x.ID)
	})
	return out[:min(len(out), k)]
}

// queueModeState is the queue-mode group's state from its row's st (nil:
// no such row) and the groups that dead-lettered the message.
func queueModeState(st *int32, dlq []string) string {
	switch {
	case slices.Contains(dlq, DefaultGroup):
		return StateDeadLetter
	case st == nil:
		return ""
	case *st == 2:
		return StateCompleted
	case *st == 1:
		return StateProcessing
	}
	return StatePending
}
