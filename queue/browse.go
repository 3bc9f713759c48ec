package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Browsing: what the reference server's dashboard and admin clients read
// (queues, partitions, messages and their states), computed live from
// partition and consumer rows. Herald keeps no statistics table, so every
// figure is as fresh as the rows, and the reads are shaped so that none
// scans messages where those rows hold the answer:
//
//   - pushed (Counts.Total) is a partition's last_offset: offsets are dense;
//   - waiting for a group is last_offset − cursor − cardinality(done), read
//     from consumers_ready (the rows with something waiting) for a queue's
//     totals, and from the partition's own rows for one partition; always
//     the partition's last_offset, never the row's copy (a lower bound);
//   - processing is the unfinished offsets of a live lease's range;
//   - dead letters come from dead_letters.
//
// Each statement's comment states its cost.

// Errors a browse answers when what it names does not exist. The texts are
// the API's, capitalised as the reference server writes them.
var (
	ErrQueueNotFound   = errors.New("Queue not found")   //nolint:staticcheck // ST1005: the API's text
	ErrMessageNotFound = errors.New("Message not found") //nolint:staticcheck // ST1005: the API's text
)

// MaxBrowseLimit bounds one page of a browse.
const MaxBrowseLimit = 1000

// Scope narrows a browse to the (queue, partition) pairs a token may read:
// those where, for some i, the queue's name matches the PostgreSQL regular
// expression Queues[i] and the partition's name Partitions[i]. A queue is
// listed when some Queues[i] matches it; its figures then count only the
// partitions in scope. A nil *Scope reads everything; an empty one nothing.
type Scope struct {
	Queues     []string
	Partitions []string
}

// args are the two statement parameters of a scope: NULL for none.
func (sc *Scope) args() (any, any) {
	if sc == nil {
		return nil, nil
	}
	qs, ps := sc.Queues, sc.Partitions
	if qs == nil {
		qs = []string{}
	}
	if ps == nil {
		ps = []string{}
	}
	return qs, ps
}

func (sc *Scope) validate() error {
	if sc == nil {
		return nil
	}
	if len(sc.Queues) != len(sc.Partitions) {
		return fmt.Errorf("browse scope: %d queue patterns for %d partition patterns", len(sc.Queues), len(sc.Partitions))
	}
	return nil
}

// inScope is the SQL condition that partition p (a name expression) of
// queue q (likewise) is in the scope carried by parameters $a (queue
// patterns) and $b (partition patterns).
func inScope(q, p string, a, b int) string {
	return fmt.Sprintf(`($%[3]d::text[] IS NULL OR EXISTS (SELECT 1 FROM unnest($%[3]d::text[], $%[4]d::text[]) AS sc(qre, pre)
	 WHERE %[1]s ~ sc.qre AND %[2]s ~ sc.pre))`, q, p, a, b)
}

// queueInScope is the SQL condition that some pattern of the scope in $a
// names queue q (a name expression).
func queueInScope(q string, a int) string {
	return fmt.Sprintf(`($%[2]d::text[] IS NULL OR EXISTS (SELECT 1 FROM unnest($%[2]d::text[]) AS sc(qre) WHERE %[1]s ~ sc.qre))`, q, a)
}

// Counts are messages by state. With consumer groups each figure is the
// maximum over the groups (the reference server's rule), except Completed,
// which counts what every group has finished: a message is completed when
// no group still waits for it.
type Counts struct {
	// Total is the messages ever pushed (the partitions' last offsets),
	// those retention or a delete removed since included.
	Total int64
	// Pending: waiting and not under a live lease.
	Pending int64
	// Processing: inside a live lease and not acknowledged.
	Processing int64
	// Completed: Total less what the group furthest behind still waits
	// for (removed messages count as completed).
	Completed int64
	// Failed: pairs (partition, group) whose next message has failed at
	// least once and waits for its retry.
	Failed int64
	// DeadLetter: messages with a dead letter (one per message, whatever
	// the number of groups that gave up on it).
	DeadLetter int64
}

// Waiting is what the reference server's list views call pending: not
// finished by the group furthest behind, leased or not.
func (c Counts) Waiting() int64 { return c.Pending + c.Processing }

// leasedUndoneSQL is, for consumer row c, the offsets of its lease's range
// not yet finished, when the lease is live; 0 otherwise. done holds only
// offsets above the cursor, and a lease's range is at most MaxBatch long.
const leasedUndoneSQL = `CASE WHEN c.lease_expires_at > now() AND c.lease_to > c.cursor THEN
	c.lease_to - greatest(c.lease_from, c.cursor + 1) + 1
	- (SELECT count(*) FROM unnest(c.done) AS d WHERE d BETWEEN greatest(c.lease_from, c.cursor + 1) AND c.lease_to)
	ELSE 0 END`

// figures turns the raw per-group maxima of a set of partitions into
// Counts: grouped says whether the queue has consumer groups at all.
func figures(total int64, grouped bool, waiting, pending, processing, failed, dead int64) Counts {
	if !grouped {
		// Nobody consumes: everything pushed waits.
		return Counts{Total: total, Pending: total, DeadLetter: dead}
	}
	return Counts{Total: total, Pending: max(pending, 0), Processing: processing,
		Completed: max(total-waiting, 0), Failed: failed, DeadLetter: dead}
}

// QueueSummary is one queue with its figures over the partitions in scope.
type QueueSummary struct {
	ID         string
	Name       string
	Namespace  string // "" for none
	Task       string // "" for none
	Priority   int
	CreatedAt  time.Time
	Partitions int64
	Counts     Counts
}

// QueuesQuery selects queues to list.
type QueuesQuery struct {
	Search    string // part of the name, any case; "" for all
	Name      string // exactly this queue; "" for all
	Namespace string // "" for any
	Task      string // "" for any
	Limit     int    // 0 for all
	Offset    int
	Scope     *Scope
}

// QueueList is one page of queues, newest first, and how many match.
type QueueList struct {
	Queues   []QueueSummary
	Matching int64
}

// browseQueuesSQL lists queues newest first with their figures, after a
// first row counting the queues that match. $1 search, $2 namespace, $3
// task, $4 exact name (NULL: none of these), $5 limit (NULL: all), $6
// offset, $7/$8 scope. %[1]s: the scope's condition on q; %[2]s on p;
// %[3]s and %[4]s the join of a consumer row and of a dead letter to its
// partition with that condition, when scoped.
//
// Cost: the queues table (small); the partitions of the listed queues
// (their index range, or one scan of the table for a page holding most of
// it: for last_offset); their consumers_ready entries (the pairs with
// something waiting, not every consumer row); their dead letters
// (dead_letters_queue). No message is read. One queue's read is
// queueTotalsSQL.
const browseQueuesSQL = `-- herald:browse_queues
WITH qs AS (
	SELECT q.id, q.name, q.namespace, q.task, q.priority, q.created_at
	FROM queues q WHERE ` + browseQueuesWhere + `
	ORDER BY q.created_at DESC, q.name
	LIMIT $5 OFFSET $6
), parts AS (
	SELECT p.queue_id, count(*) AS n, sum(p.last_offset) AS total
	FROM qs JOIN partitions p ON p.queue_id = qs.id
	WHERE %[2]s
	GROUP BY 1
), grp AS (
	-- The partition's last_offset, not the row's copy (a lower bound: a
	-- push leaves the row of a group that is behind alone). The listed
	-- queues' partitions, joined by queue: read as a range, not probed
	-- once per row.
	SELECT c.queue_id, c.consumer_group,
	       sum(greatest(p.last_offset - c.cursor - cardinality(c.done), 0)) AS waiting,
	       sum(` + leasedUndoneSQL + `) AS processing,
	       count(*) FILTER (WHERE c.attempts > 0) AS failed
	FROM qs JOIN consumers c ON c.queue_id = qs.id AND c.last_offset > c.cursor
	JOIN partitions p ON p.queue_id = qs.id AND p.id = c.partition_id
	%[3]s
	GROUP BY 1, 2
), dl AS (
	SELECT d.queue_id, count(DISTINCT (d.partition_id, d.seq)) AS n
	FROM qs JOIN dead_letters d ON d.queue_id = qs.id
	%[4]s
	GROUP BY 1
)
SELECT m.matching, qs.id::text, qs.name, qs.namespace, qs.task, qs.priority, qs.created_at,
       coalesce(pt.n, 0), coalesce(pt.total, 0)::bigint,
       EXISTS (SELECT 1 FROM consumer_groups cg WHERE cg.queue_id = qs.id),
       coalesce(g.waiting, 0)::bigint, coalesce(g.pending, 0)::bigint, coalesce(g.processing, 0)::bigint,
       coalesce(g.failed, 0)::bigint, coalesce(dl.n, 0)
FROM (SELECT count(*) AS matching FROM queues q WHERE ` + browseQueuesWhere + `) m
LEFT JOIN qs ON true
LEFT JOIN parts pt ON pt.queue_id = qs.id
LEFT JOIN dl ON dl.queue_id = qs.id
LEFT JOIN LATERAL (
	SELECT max(grp.waiting) AS waiting, max(grp.waiting - grp.processing) AS pending,
	       max(grp.processing) AS processing, max(grp.failed) AS failed
	FROM grp WHERE grp.queue_id = qs.id
) g ON true
ORDER BY qs.created_at DESC, qs.name`

// browseQueuesWhere selects the queues of browseQueuesSQL (%[1]s: the
// scope's condition on q).
const browseQueuesWhere = `($1::text IS NULL OR strpos(lower(q.name), lower($1)) > 0)
	  AND ($2::text IS NULL OR q.namespace = $2) AND ($3::text IS NULL OR q.task = $3)
	  AND ($4::text IS NULL OR q.name = $4) AND %[1]s`

// browseQueuesScoped and browseQueuesAll are browseQueuesSQL with and
// without the joins a scope needs (a plan would keep them otherwise).
var (
	browseQueuesScoped = fmt.Sprintf(browseQueuesSQL, queueInScope("q.name", 7), inScope("qs.name", "p.name", 7, 8),
		"WHERE "+inScope("qs.name", "p.name", 7, 8),
		"JOIN partitions p ON p.id = d.partition_id WHERE "+inScope("qs.name", "p.name", 7, 8))
	browseQueuesAll = fmt.Sprintf(browseQueuesSQL, "$7::text[] IS NULL AND $8::text[] IS NULL", "true", "", "")
)

// queueTotalsSQL is browseQueuesSQL's figures for one queue by id ($1;
// $2 its name, $3/$4 the scope; %[1]s the scope's condition on p, %[2]s
// and %[3]s the joins of consumer rows and dead letters to their
// partitions, when scoped).
//
// Cost: the queue's partitions (its range of partitions (queue_id, name),
// heap included for last_offset), its consumers_ready entries and its dead
// letters: proportional to the queue, never to the table. For a queue of
// 100,000 partitions with one message waiting in each, about 12,000
// blocks (TestBrowse_QueueReadStaysIndexBacked).
const queueTotalsSQL = `-- herald:browse_queue_totals
SELECT pt.n, pt.total, EXISTS (SELECT 1 FROM consumer_groups cg WHERE cg.queue_id = $1::uuid),
       coalesce(g.waiting, 0)::bigint, coalesce(g.pending, 0)::bigint, coalesce(g.processing, 0)::bigint,
       coalesce(g.failed, 0)::bigint,
       (SELECT count(DISTINCT (d.partition_id, d.seq)) FROM dead_letters d %[3]s WHERE d.queue_id = $1::uuid)
FROM (
	SELECT count(*) AS n, coalesce(sum(p.last_offset), 0)::bigint AS total
	FROM partitions p WHERE p.queue_id = $1::uuid AND %[1]s
) pt
CROSS JOIN (
	SELECT max(grp.waiting) AS waiting, max(grp.waiting - grp.processing) AS pending,
	       max(grp.processing) AS processing, max(grp.failed) AS failed
	FROM (
		SELECT c.consumer_group,
		       sum(greatest(p.last_offset - c.cursor - cardinality(c.done), 0)) AS waiting,
		       sum(` + leasedUndoneSQL + `) AS processing,
		       count(*) FILTER (WHERE c.attempts > 0) AS failed
		FROM consumers c
		-- The partition's last_offset, not the row's copy (see
		-- browseQueuesSQL), the queue's partitions read as a range.
		JOIN partitions p ON p.queue_id = $1::uuid AND p.id = c.partition_id %[2]s
		WHERE c.queue_id = $1::uuid AND c.last_offset > c.cursor
		GROUP BY 1
	) grp
) g`

var (
	queueTotalsScoped = fmt.Sprintf(queueTotalsSQL, inScope("$2::text", "p.name", 3, 4),
		"AND "+inScope("$2::text", "p.name", 3, 4),
		"JOIN partitions p ON p.id = d.partition_id AND "+inScope("$2::text", "p.name", 3, 4))
	queueTotalsAll = fmt.Sprintf(queueTotalsSQL, "$2::text IS NOT NULL AND $3::text[] IS NULL AND $4::text[] IS NULL", "", "")
)

// BrowseQueues lists queues, newest first, with their figures.
func (s *Store) BrowseQueues(ctx context.Context, qry QueuesQuery) (*QueueList, error) {
	var out *QueueList
	err := s.browse(ctx, func(tx pgx.Tx) (err error) {
		out, err = s.browseQueues(ctx, tx, qry)
		return err
	})
	return out, err
}

func (s *Store) browseQueues(ctx context.Context, q querier, qry QueuesQuery) (*QueueList, error) {
	if err := checkPage(qry.Limit, qry.Offset); err != nil {
		return nil, err
	}
	if err := errors.Join(validText("search", qry.Search), validText("queue", qry.Name),
		validText("namespace", qry.Namespace), validText("task", qry.Task)); err != nil {
		return nil, inputErrorf("%v", err)
	}
	if err := qry.Scope.validate(); err != nil {
		return nil, err
	}
	var limit *int
	if qry.Limit > 0 {
		limit = &qry.Limit
	}
	sql := browseQueuesAll
	if qry.Scope != nil {
		sql = browseQueuesScoped
	}
	a, b := qry.Scope.args()
	rows, err := q.Query(ctx, sql, optString(qry.Search), optString(qry.Namespace), optString(qry.Task),
		optString(qry.Name), limit, qry.Offset, a, b)
	if err != nil {
		return nil, fmt.Errorf("listing queues: %w", err)
	}
	defer rows.Close()
	out := &QueueList{Queues: []QueueSummary{}}
	for rows.Next() {
		// One row with no queue when the page is empty: it still counts.
		var id, name, ns, task *string
		var priority *int
		var created *time.Time
		var qs QueueSummary
		var total, waiting, pending, processing, failed, dead int64
		var grouped bool
		if err := rows.Scan(&out.Matching, &id, &name, &ns, &task, &priority, &created,
			&qs.Partitions, &total, &grouped, &waiting, &pending, &processing, &failed, &dead); err != nil {
			return nil, fmt.Errorf("listing queues: %w", err)
		}
		if id == nil {
			continue
		}
		qs.ID, qs.Name, qs.Namespace, qs.Task, qs.Priority, qs.CreatedAt = *id, *name, *ns, *task, *priority, *created
		qs.Counts = figures(total, grouped, waiting, pending, processing, failed, dead)
		out.Queues = append(out.Queues, qs)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing queues: %w", err)
	}
	return out, nil
}

// checkPage refuses a page outside the bounds (a programming error in the
// caller: the gateway checks them first, with the API's texts).
func checkPage(limit, offset int) error {
	if limit < 0 || limit > MaxBrowseLimit {
		return inputErrorf("limit must be an integer between 1 and %d", MaxBrowseLimit)
	}
	if offset < 0 || offset > MaxBrowseOffset {
		return inputErrorf("offset must be an integer between 0 and %d", MaxBrowseOffset)
	}
	return nil
}

// MaxBrowseOffset bounds a page's offset: a message listing reads up to
// limit + offset messages per partition.
const MaxBrowseOffset = 100000

// browse runs f in a read-only REPEATABLE READ transaction, so that the
// statements of one answer (totals and their partitions) see one snapshot,
// planned for their parameters. The pool plans every statement once,
// generically (ParsePoolConfig): right for the hot statements, whose
// parameters select alike, wrong for these, where one queue may hold 100
// partitions and the next 100,000, and a plan for the average queue scans
// the table for the small one. A browse is rare; a plan costs it a
// fraction of a millisecond.
func (s *Store) browse(ctx context.Context, f func(tx pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
		func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = force_custom_plan"); err != nil {
				return fmt.Errorf("planning a browse: %w", err)
			}
			return f(tx)
		})
}

// QueueID returns the id of the queue named name, or ErrQueueNotFound.
func (s *Store) QueueID(ctx context.Context, name string) (string, error) {
	if err := ValidateName("queue", name); err != nil {
		return "", err
	}
	var id string
	err := s.pool.QueryRow(ctx, `-- herald:queue_id
SELECT id::text FROM queues WHERE name = $1`, name).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrQueueNotFound
	}
	if err != nil {
		return "", fmt.Errorf("reading queue %s: %w", name, err)
	}
	return id, nil
}
