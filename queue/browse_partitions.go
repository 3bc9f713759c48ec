package queue

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// PartitionSummary is one partition with its figures over its consumer
// groups (Counts), and, when asked for, each group's position.
type PartitionSummary struct {
	ID         string
	Name       string
	CreatedAt  time.Time
	LastOffset int64
	LastPushAt *time.Time
	// LastActivity is the later of the last push and the last lease.
	LastActivity *time.Time
	Counts       Counts
	// Oldest and Newest are the creation times of the first and last
	// messages it holds; nil when it holds none.
	Oldest, Newest *time.Time
	Groups         []PartitionGroup // PartitionsQuery.Groups only
}

// PartitionGroup is one consumer group's position on a partition.
type PartitionGroup struct {
	Group string
	// Cursor: every offset at or below it is finished; Done more are
	// finished above it (acknowledged out of order, or deleted).
	Cursor int64
	Done   int64
	// Lag is what the group has not finished (last offset − cursor − done);
	// Processing the part of it under a live lease.
	Lag        int64
	Processing int64
	// DeliveredTo is the highest offset ever leased to the group here.
	DeliveredTo int64
	// Attempts counts the failed deliveries of the first unfinished offset.
	Attempts int
	LeasedAt *time.Time
	Lease    *Lease // nil when the row holds no lease
}

// Lease is the lease a consumer row holds (perhaps expired: the next pop
// counts it as a failed attempt and takes the partition again).
type Lease struct {
	ID        string
	Owner     string // the instance that leased it
	Subject   string // the token sub it was delivered to; "" for none
	From, To  int64
	ExpiresAt time.Time
	Live      bool
}

// PartitionsQuery pages the partitions of one queue, in name order.
type PartitionsQuery struct {
	Queue  string
	Search string // part of the name, any case; "" for all
	// Prefix is the start of the name, case-sensitive; "" for all. It
	// reads a range of the partitions_name_prefix index, so it costs the
	// partitions that match, where Search reads every partition of the
	// queue. With it the names are in byte order (COLLATE "C"), After
	// too. Not with Search.
	Prefix string
	After  string // keyset: names after this one; "" from the first
	Limit  int    // zero means MaxBrowseLimit
	Offset int
	Scope  *Scope
	Groups bool // fill PartitionSummary.Groups
}

// PartitionPage is one page of a queue's partitions and how many match.
type PartitionPage struct {
	Queue      QueueSummary // the queue's figures over every partition in scope
	Options    Options
	Partitions []PartitionSummary
	Matching   int64
}

// browsePartitionsSQL pages a queue's partitions by name with their
// figures. $1 queue id, $2 queue name (for the scope), $3 after, $4 search
// ("" for none) or prefix, $5 limit, $6 offset, $7/$8 scope, $9 the least
// name above every name that starts with the prefix (prefix mode only).
// The %[1]s is the name condition (bySearch or byPrefix), %[2]s the
// scope's, %[3]s and %[4]s the orders (by the collation, or by bytes).
//
// Cost: an index range of partitions (queue_id, name) from $3, offset
// included (index entries, not rows, for the ones skipped), then per
// partition listed its consumer rows (primary key), two probes of messages
// for the oldest and newest, and its dead letters (dead_letters_message):
// independent of how many partitions the queue has, unless a search or a
// scope skips many (EXPLAIN in TestBrowse_QueueReadStaysIndexBacked).
const browsePartitionsSQL = `-- herald:browse_partitions
WITH pg AS (
	SELECT p.id, p.name, p.created_at, p.last_offset, p.last_push_at
	FROM partitions p
	WHERE p.queue_id = $1::uuid AND %[1]s
	  AND %[2]s
	ORDER BY %[3]s
	LIMIT $5 OFFSET $6
)
SELECT pg.id::text, pg.name, pg.created_at, pg.last_offset, pg.last_push_at, st.leased_at,
       st.groups, coalesce(st.waiting, 0), coalesce(st.pending, 0), coalesce(st.processing, 0), st.failed,
       (SELECT m.created_at FROM messages m WHERE m.partition_id = pg.id ORDER BY m.seq LIMIT 1),
       (SELECT m.created_at FROM messages m WHERE m.partition_id = pg.id ORDER BY m.seq DESC LIMIT 1),
       (SELECT count(DISTINCT d.seq) FROM dead_letters d WHERE d.partition_id = pg.id)
FROM pg
CROSS JOIN LATERAL (
	SELECT count(*) AS groups, max(w.waiting) AS waiting, max(w.waiting - w.leased) AS pending,
	       max(w.leased) AS processing, count(*) FILTER (WHERE c.attempts > 0) AS failed,
	       max(c.leased_at) AS leased_at
	FROM consumers c
	CROSS JOIN LATERAL (SELECT greatest(pg.last_offset - c.cursor - cardinality(c.done), 0) AS waiting,
	                           ` + leasedUndoneSQL + ` AS leased) w
	WHERE c.partition_id = pg.id
) st
ORDER BY %[4]s`

// countPartitionsSQL counts what browsePartitionsSQL pages, $3 and the
// paging left out: $3 is the search or the prefix, $6 the prefix's upper
// bound. Cost: the queue's entries of partitions (queue_id, name), and
// its rows only for a search or a scope (names are in the index: an
// index-only scan when the visibility map allows); for a prefix, the
// matching range of partitions_name_prefix.
const countPartitionsSQL = `-- herald:count_partitions
SELECT count(*) FROM partitions p
WHERE p.queue_id = $1::uuid AND %[1]s AND %[2]s`

// The name conditions: by substring (any case) in the collation's order,
// or by prefix in byte order, a range of partitions_name_prefix (the
// COLLATE "C" of each comparison lets the planner use that index, with a
// generic plan too: no LIKE pattern to read at planning).
const (
	bySearch      = `p.name > $3::text AND ($4::text = '' OR strpos(lower(p.name), lower($4)) > 0) AND $9::text IS NULL`
	byPrefix      = `p.name COLLATE "C" > $3::text AND p.name COLLATE "C" >= $4::text AND p.name COLLATE "C" < $9::text`
	countSearch   = `($3::text = '' OR strpos(lower(p.name), lower($3)) > 0) AND $6::text IS NULL`
	countPrefix   = `p.name COLLATE "C" >= $3::text AND p.name COLLATE "C" < $6::text`
	allPartitions = "$2::text IS NOT NULL AND $7::text[] IS NULL AND $8::text[] IS NULL"
	allCounted    = "$2::text IS NOT NULL AND $4::text[] IS NULL AND $5::text[] IS NULL"
	byBytes       = `p.name COLLATE "C"`
)

var (
	browsePartitionsScoped = fmt.Sprintf(browsePartitionsSQL, bySearch, inScope("$2::text", "p.name", 7, 8), "p.name", "pg.name")
	browsePartitionsAll    = fmt.Sprintf(browsePartitionsSQL, bySearch, allPartitions, "p.name", "pg.name")
	prefixPartitionsScoped = fmt.Sprintf(browsePartitionsSQL, byPrefix, inScope("$2::text", "p.name", 7, 8), byBytes, `pg.name COLLATE "C"`)
	prefixPartitionsAll    = fmt.Sprintf(browsePartitionsSQL, byPrefix, allPartitions, byBytes, `pg.name COLLATE "C"`)
	countPartitionsScoped  = fmt.Sprintf(countPartitionsSQL, countSearch, inScope("$2::text", "p.name", 4, 5))
	countPartitionsAll     = fmt.Sprintf(countPartitionsSQL, countSearch, allCounted)
	countPrefixScoped      = fmt.Sprintf(countPartitionsSQL, countPrefix, inScope("$2::text", "p.name", 4, 5))
	countPrefixAll         = fmt.Sprintf(countPartitionsSQL, countPrefix, allCounted)
)

// prefixEnd is the least string above every string that starts with
// prefix, in byte order: prefix with its last code point raised by one
// (UTF-8's byte order is code point order), trailing U+10FFFF dropped
// first. ok is false when there is none (prefix is all U+10FFFF).
func prefixEnd(prefix string) (string, bool) {
	rs := []rune(prefix)
	for len(rs) > 0 {
		last := rs[len(rs)-1]
		if last < utf8.MaxRune {
			next := last + 1
			if next >= 0xD800 && next <= 0xDFFF {
				next = 0xE000 // surrogates are no code points of a string
			}
			rs[len(rs)-1] = next
			return string(rs), true
		}
		rs = rs[:len(rs)-1]
	}
	return "", false
}

// partitionGroupsSQL reads the consumer rows of some partitions. Cost: a
// primary-key range per partition.
const partitionGroupsSQL = `-- herald:partition_groups
SELECT c.partition_id::text, c.consumer_group, c.cursor, cardinality(c.done),
       greatest(p.last_offset - c.cursor - cardinality(c.done), 0), ` + leasedUndoneSQL + `,
       c.delivered_to, c.attempts, c.leased_at,
       c.lease_id::text, coalesce(c.lease_owner, ''), coalesce(c.lease_subject, ''), coalesce(c.lease_from, 0),
       coalesce(c.lease_to, 0), c.lease_expires_at, coalesce(c.lease_expires_at > now(), false)
FROM consumers c JOIN partitions p ON p.id = c.partition_id
WHERE c.partition_id = ANY ($1::uuid[])
ORDER BY c.partition_id, c.consumer_group`

// queueOptionsSQL reads a queue's settings by name.
const queueOptionsSQL = `-- herald:queue_options
SELECT id::text, created_at, ` + optionColumns + ` FROM queues WHERE name = $1`

// BrowsePartitions returns a queue's settings, its figures over the
// partitions in scope (queueTotalsSQL) and one page of them in name order,
// from one snapshot. A queue that does not exist is ErrQueueNotFound.
func (s *Store) BrowsePartitions(ctx context.Context, qry PartitionsQuery) (*PartitionPage, error) {
	if err := ValidateName("queue", qry.Queue); err != nil {
		return nil, err
	}
	if qry.Limit == 0 {
		qry.Limit = MaxBrowseLimit
	}
	if err := checkPage(qry.Limit, qry.Offset); err != nil {
		return nil, err
	}
	if err := errors.Join(validText("search", qry.Search), validText("prefix", qry.Prefix), validText("after", qry.After)); err != nil {
		return nil, inputErrorf("%v", err)
	}
	var end *string // the prefix's upper bound: nil without a prefix
	if qry.Prefix != "" {
		if qry.Search != "" {
			return nil, inputErrorf("give search or prefix, not both")
		}
		e, ok := prefixEnd(qry.Prefix)
		if !ok {
			return nil, inputErrorf("prefix must hold a code point below U+10FFFF")
		}
		end = &e
	}
	if err := qry.Scope.validate(); err != nil {
		return nil, err
	}
	page := &PartitionPage{Partitions: []PartitionSummary{}}
	err := s.browse(ctx, func(tx pgx.Tx) error {
		qs, o := &page.Queue, &page.Options
		qs.Name = qry.Queue
		err := tx.QueryRow(ctx, queueOptionsSQL, qry.Queue).Scan(&qs.ID, &qs.CreatedAt, &qs.Namespace, &qs.Task,
			&o.LeaseTime, &o.RetryLimit, &o.RetryDelay, &o.DelayedProcessing, &o.WindowBuffer, &o.MaxSize, &o.TTL,
			&o.RetentionSeconds, &o.CompletedRetentionSeconds, &o.RetentionEnabled, &o.DeadLetterQueue,
			&o.DLQAfterMaxRetries, &o.Priority, &o.EncryptionEnabled, &o.MaxWaitTimeSeconds, &o.IdleGroupRetentionSeconds)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrQueueNotFound
		}
		if err != nil {
			return fmt.Errorf("reading queue %s: %w", qry.Queue, err)
		}
		qs.Priority = o.Priority
		a, b := qry.Scope.args()
		totals, list1, count := queueTotalsAll, browsePartitionsAll, countPartitionsAll
		if qry.Scope != nil {
			totals, list1, count = queueTotalsScoped, browsePartitionsScoped, countPartitionsScoped
		}
		match := qry.Search
		if end != nil {
			match, list1, count = qry.Prefix, prefixPartitionsAll, countPrefixAll
			if qry.Scope != nil {
				list1, count = prefixPartitionsScoped, countPrefixScoped
			}
		}
		var total, waiting, pending, processing, failed, dead int64
		var grouped bool
		if err := tx.QueryRow(ctx, totals, qs.ID, qry.Queue, a, b).Scan(&qs.Partitions, &total, &grouped, &waiting,
			&pending, &processing, &failed, &dead); err != nil {
			return fmt.Errorf("reading the figures of %s: %w", qry.Queue, err)
		}
		qs.Counts = figures(total, grouped, waiting, pending, processing, failed, dead)
		if err := tx.QueryRow(ctx, count, qs.ID, qry.Queue, match, a, b, end).Scan(&page.Matching); err != nil {
			return fmt.Errorf("counting partitions of %s: %w", qry.Queue, err)
		}
		rows, err := tx.Query(ctx, list1, qs.ID, qry.Queue, qry.After, match, qry.Limit, qry.Offset, a, b, end)
		if err != nil {
			return fmt.Errorf("listing partitions of %s: %w", qry.Queue, err)
		}
		if page.Partitions, err = readPartitions(rows); err != nil {
			return fmt.Errorf("listing partitions of %s: %w", qry.Queue, err)
		}
		if qry.Groups && len(page.Partitions) > 0 {
			return readPartitionGroups(ctx, tx, page.Partitions)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return page, nil
}

func readPartitions(rows pgx.Rows) ([]PartitionSummary, error) {
	defer rows.Close()
	out := []PartitionSummary{}
	for rows.Next() {
		var p PartitionSummary
		var leasedAt *time.Time
		var groups, waiting, pending, processing, failed, dead int64
		if err := rows.Scan(&p.ID, &p.Name, &p.CreatedAt, &p.LastOffset, &p.LastPushAt, &leasedAt,
			&groups, &waiting, &pending, &processing, &failed, &p.Oldest, &p.Newest, &dead); err != nil {
			return nil, err
		}
		p.LastActivity = p.LastPushAt
		if leasedAt != nil && (p.LastActivity == nil || leasedAt.After(*p.LastActivity)) {
			p.LastActivity = leasedAt
		}
		p.Counts = figures(p.LastOffset, groups > 0, waiting, pending, processing, failed, dead)
		out = append(out, p)
	}
	return out, rows.Err()
}

// readPartitionGroups fills the Groups of parts.
func readPartitionGroups(ctx context.Context, q querier, parts []PartitionSummary) error {
	ids := make([]string, len(parts))
	at := make(map[string]int, len(parts))
	for i := range parts {
		ids[i] = parts[i].ID
		at[parts[i].ID] = i
		parts[i].Groups = []PartitionGroup{}
	}
	rows, err := q.Query(ctx, partitionGroupsSQL, ids)
	if err != nil {
		return fmt.Errorf("reading consumer groups: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var pid string
		var g PartitionGroup
		var leaseID *string
		var l Lease
		var expires *time.Time
		if err := rows.Scan(&pid, &g.Group, &g.Cursor, &g.Done, &g.Lag, &g.Processing, &g.DeliveredTo, &g.Attempts,
			&g.LeasedAt, &leaseID, &l.Owner, &l.Subject, &l.From, &l.To, &expires, &l.Live); err != nil {
			return fmt.Errorf("reading consumer groups: %w", err)
		}
		if leaseID != nil && expires != nil {
			l.ID, l.ExpiresAt = *leaseID, *expires
			g.Lease = &l
		}
		i := at[pid]
		parts[i].Groups = append(parts[i].Groups, g)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reading consumer groups: %w", err)
	}
	return nil
}
