package queue

import (
	"context"
	"fmt"
	"time"
)

// Target is what a waiting consumer wants: one queue by name, or the queues
// of a namespace and/or task; one partition or any; one consumer group.
type Target struct {
	Queue     string
	Namespace string
	Task      string
	Partition string // zero: any
	Group     string // zero: DefaultGroup
	// QueueMatch narrows a namespace/task target (as PopRequest.QueueMatch).
	QueueMatch string
	// Subscription options apply when the group is new to a queue (see
	// PopRequest).
	SubscriptionMode string
	SubscriptionFrom string
	// Since is when the consumer asked (this host's clock): "new" and "now"
	// subscriptions start there, not at the later moment EnsureConsumers
	// runs. Zero means the database's now.
	Since time.Time
	// Want is how many partitions the consumers of this target could take
	// at once (zero means 1): the pre-flight reports that many eligible
	// ones at most, plus the next one to become eligible.
	Want int
}

// Availability is one partition that has messages beyond a group's cursor,
// for one target of a pre-flight.
type Availability struct {
	Target      int // index into the targets passed to Preflight
	Queue       string
	QueueID     string
	PartitionID string
	Partition   string
	Group       string
	// Priority is the queue's priority: a target selecting several queues
	// (namespace, task) is served from higher priorities first.
	Priority int
	// Waiting is how many messages the group has not finished:
	// last_offset − cursor − (done above the cursor).
	Waiting int64
	// HasConsumer is false when the group is not registered on the queue
	// yet (PartitionID and Partition are then empty): EnsureConsumers must
	// register it (its starting cursors depend on the subscription) before
	// any partition can be leased.
	HasConsumer bool
	// Eligible: the partition can be leased now. Otherwise EligibleAt says
	// when it can (lease expiry, end of the window buffer, the first
	// pending message's delay), or is zero when that is unknown.
	Eligible   bool
	EligibleAt time.Time
	// DeadOnExpiry marks a partition only Pop serves, rather than
	// PopAssigned: an expired lease whose next failed attempt gives a
	// message up (Pop dead-letters or drops it), or a leasable row whose
	// next message is past the queue's ttl (Pop skips what expired).
	DeadOnExpiry bool
}

// preflightDeadOnExpiry marks a row for Pop (Availability.DeadOnExpiry):
// both ranges of preflightSQL read it. The ttl case asks the row to be
// leasable now, as Pop's claim does: a row under a live lease or inside
// its window sent to Pop would get nothing and be sent again at every
// pre-flight.
var preflightDeadOnExpiry = `((c.lease_id IS NOT NULL AND c.lease_expires_at <= now() AND ` + leaseEnd("c") + ` > c.cursor
	        AND (CASE WHEN c.attempt_seq = c.cursor + 1 THEN c.attempts ELSE 0 END) >= kq.retry_limit)
	     OR (kq.ttl > 0 AND ` + leasableNowKQ + ` AND ` + nextExpired("kq") + `))`

// preflightReady is a target's ready consumer rows, for a LATERAL over kq:
// a target of any partition reads its (queue, group) range of
// consumers_ready in the order pops take it, cut at limit; a target naming
// a partition reads that partition's one row by key. Two branches, each
// gated on kq.pname alone (a one-time filter per target), because one
// condition for both (no partition named, or this partition's id) cannot
// use the key: it filtered the whole range per partition target, and 200
// partition targets over a queue of 9,000 partitions read 1.8 million rows
// (350 ms a pre-flight; 9,000 partition subscriptions were served at
// ~270/s).
func preflightReady(limit string) string {
	return `(SELECT c.* FROM consumers c
		WHERE kq.pname = '' AND c.queue_id = kq.id AND c.consumer_group = kq.grp AND c.last_offset > c.cursor
		ORDER BY c.lease_expires_at NULLS FIRST, c.leased_at NULLS FIRST, c.partition_id
		LIMIT ` + limit + `)
	UNION ALL
	(SELECT c.* FROM partitions p1 JOIN consumers c ON c.partition_id = p1.id AND c.consumer_group = kq.grp
		WHERE kq.pname <> '' AND p1.queue_id = kq.id AND p1.name = kq.pname AND c.last_offset > c.cursor)`
}

// preflightPartition is a ready row's partition, by key. The LIMIT keeps
// the subquery a lookup per row: as a plain join, the generic plan (which
// cannot know how many rows a target's LIMIT lets through) may hash the
// whole partitions table instead.
const preflightPartition = `SELECT p.* FROM partitions p WHERE p.id = c.partition_id LIMIT 1`

// windowScanLimit bounds the second range of preflightSQL: the ready rows
// of a queue with a window or a delay it looks through for eligible ones.
// Unbounded, a queue whose partitions were mostly inside their window cost
// a probe each per pre-flight (2,000 partitions: 6,107 buffers against 38
// without a window); bounded, an eligible partition stays hidden only
// behind this many busier ones, each pushed to more often than the window.
const windowScanLimit = "200"

// leasableNowKQ is pop_lock's condition (leasableNow) over the pre-flight's
// queue rows, kq.
var leasableNowKQ = leasableNow("kq")

// preflightSQL answers, in one statement, for every target: partitions
// with unfinished messages for the group, whether each can be leased now and
// if not, when. Each (queue, group) is one range of consumers_ready, read in
// the order pops take it and cut after want + 1 rows: the eligible ones come
// first, then the soonest to free, so the cost does not grow with the
// queue's partitions. On a queue with a window buffer or a delay, whose
// first rows may all be inside theirs, the eligible ones are read as well
// (one more range, as pop_lock reads them). It reads consumer and partition rows (waiting =
// last_offset − cursor − done), plus one index probe on messages per
// partition of a queue with delayed processing. A queue the group is not
// registered on is one row with has_consumer false, messages or not.
var preflightSQL = `-- herald:preflight
WITH k AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int[], $7::text[])
	       WITH ORDINALITY AS k(qname, ns, task, pname, grp, want, qmatch, ord)
), kq AS (
	SELECT k.ord, k.pname, k.grp, k.want, q.* FROM k JOIN queues q ON q.name = k.qname WHERE k.qname <> ''
	UNION ALL
	SELECT k.ord, k.pname, k.grp, k.want, q.* FROM k JOIN queues q
	  ON (k.ns = '' OR q.namespace = k.ns) AND (k.task = '' OR q.task = k.task) AND (k.qmatch = '' OR q.name ~ k.qmatch)
	WHERE k.qname = ''
), rows AS (
	SELECT kq.ord, kq.name AS qname, kq.id::text AS qid, kq.priority, p.id::text AS pid, p.name AS pname, kq.grp,
	       p.last_offset - c.cursor - cardinality(c.done) AS waiting, true AS has_consumer,
	       CASE WHEN c.lease_expires_at > now() THEN c.lease_expires_at END AS lease_until,
	       CASE WHEN kq.window_buffer > 0 AND p.last_push_at > now() - make_interval(secs => kq.window_buffer)
	            THEN p.last_push_at + make_interval(secs => kq.window_buffer) END AS window_until,
	       CASE WHEN kq.delayed_processing > 0 THEN (
	            SELECT m.created_at + make_interval(secs => kq.delayed_processing) FROM messages m
	            WHERE m.partition_id = p.id AND m.seq = c.cursor + 1) END AS visible_at,
	       ` + preflightDeadOnExpiry + ` AS dead_on_expiry,
	       false AS again
	FROM kq
	CROSS JOIN LATERAL (` + preflightReady("greatest(kq.want, 1) + 1") + `) c
	CROSS JOIN LATERAL (` + preflightPartition + `) p
	UNION ALL
	-- A queue with a window or a delay: partitions still inside theirs can
	-- fill the range above (with pushes more often than the window, for as
	-- long as they go on), so its eligible ones are read too, with the
	-- conditions pop_lock applies. Gated on the queue's row, this range is
	-- never read for the other queues; a partition in both ranges is
	-- reported once (Preflight drops its row marked again).
	SELECT kq.ord, kq.name, kq.id::text, kq.priority, p.id::text, p.name, kq.grp,
	       c.last_offset - c.cursor - cardinality(c.done), true, NULL, NULL, NULL,
	       ` + preflightDeadOnExpiry + `, true
	FROM kq
	CROSS JOIN LATERAL (
		SELECT c.* FROM (` + preflightReady(windowScanLimit) + `) c
		WHERE ` + leasableNowKQ + `
		ORDER BY c.lease_expires_at NULLS FIRST, c.leased_at NULLS FIRST, c.partition_id
		LIMIT greatest(kq.want, 1)
	) c
	CROSS JOIN LATERAL (` + preflightPartition + `) p
	WHERE kq.window_buffer > 0 OR kq.delayed_processing > 0
	UNION ALL
	SELECT kq.ord, kq.name, kq.id::text, kq.priority, '', '', kq.grp, 0, false, NULL, NULL, NULL, false, false
	FROM kq
	WHERE NOT EXISTS (SELECT 1 FROM consumer_groups g WHERE g.queue_id = kq.id AND g.name = kq.grp)
)
SELECT ord, qname, qid, priority, pid, pname, grp, waiting, has_consumer, dead_on_expiry, again,
       lease_until IS NULL AND window_until IS NULL AND (visible_at IS NULL OR visible_at <= now()) AS eligible,
       GREATEST(lease_until, window_until, CASE WHEN visible_at > now() THEN visible_at END) AS eligible_at
FROM rows`

type targetPartition struct {
	target    int
	partition string
}

// Preflight checks, in one query, which partitions every target could be
// served from. It takes no locks: the answer can be stale by the time of
// PopAssigned, which re-checks everything under its row locks.
func (s *Store) Preflight(ctx context.Context, targets []Target) ([]Availability, error) {
	if len(targets) == 0 {
		return nil, nil
	}
	n := len(targets)
	qn, ns, tk, pn, gr := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	qm := make([]string, n)
	want := make([]int32, n)
	for i, t := range targets {
		g := t.Group
		if g == "" {
			g = DefaultGroup
		}
		qn[i], ns[i], tk[i], pn[i], gr[i], qm[i] = t.Queue, t.Namespace, t.Task, t.Partition, g, t.QueueMatch
		want[i] = int32(min(max(t.Want, 1), MaxPartitions*100)) // #nosec G115 -- bounded above
	}
	// Every waiting consumer is in a pre-flight at least every sweep: its
	// group is reading (at most every GroupSeenEvery).
	s.seen(ctx, [5][]string{qn, ns, tk, qm, gr})
	rows, err := s.pool.Query(ctx, preflightSQL, qn, ns, tk, pn, gr, want, qm)
	if err != nil {
		return nil, fmt.Errorf("running pre-flight: %w", err)
	}
	defer rows.Close()
	var out []Availability
	// The partitions reported for a target, built only once a row of the
	// second range of a queue with a window or a delay comes.
	var seen map[targetPartition]bool
	for rows.Next() {
		var a Availability
		var ord int64
		var again bool
		var at *time.Time
		if err := rows.Scan(&ord, &a.Queue, &a.QueueID, &a.Priority, &a.PartitionID, &a.Partition, &a.Group, &a.Waiting, &a.HasConsumer,
			&a.DeadOnExpiry, &again, &a.Eligible, &at); err != nil {
			return nil, fmt.Errorf("reading pre-flight: %w", err)
		}
		if again && seen == nil {
			seen = make(map[targetPartition]bool, len(out))
			for _, o := range out {
				seen[targetPartition{o.Target, o.PartitionID}] = true
			}
		}
		// Once there is a second range, any row may repeat one before it
		// (UNION ALL promises no order between the ranges).
		if seen != nil && a.PartitionID != "" {
			k := targetPartition{int(ord - 1), a.PartitionID}
			if seen[k] {
				continue
			}
			seen[k] = true
		}
		a.Target = int(ord - 1)
		if at != nil {
			a.EligibleAt = *at
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading pre-flight: %w", err)
	}
	return out, nil
}

// EnsureConsumers registers the targets' groups on the queues they select
// and do not know them yet, each with a consumer row on every partition and
// starting cursors set by its subscription options, all in one transaction
// of a fixed number of statements (registerGroups: the queues locked in id
// order, so instances registering at once cannot deadlock), whatever the
// number of targets.
func (s *Store) EnsureConsumers(ctx context.Context, targets []Target) error {
	type sub struct {
		group string
		now   bool
		from  *time.Time
	}
	subs := make([]sub, len(targets))
	var sel [5][]string
	for i, t := range targets {
		req := PopRequest{Queue: t.Queue, Namespace: t.Namespace, Task: t.Task, Partition: t.Partition, Group: t.Group,
			QueueMatch:       t.QueueMatch,
			SubscriptionMode: t.SubscriptionMode, SubscriptionFrom: t.SubscriptionFrom}
		subFrom, subNow, err := req.normalize()
		if err != nil {
			return err
		}
		if subNow && !t.Since.IsZero() {
			// "now" is when the consumer arrived, on this host's clock: the
			// statement may start much later (a busy pool), and a push in
			// between must count as new. Hosts' clocks agree to NTP accuracy.
			since := t.Since
			subNow, subFrom = false, &since
		}
		subs[i] = sub{req.Group, subNow, subFrom}
		sel[0], sel[1], sel[2] = append(sel[0], req.Queue), append(sel[1], req.Namespace), append(sel[2], req.Task)
		sel[3], sel[4] = append(sel[3], req.QueueMatch), append(sel[4], req.Group)
	}
	if len(targets) == 0 {
		return nil
	}
	err := s.registerGroups(ctx, sel, func(ord int) (string, bool, *time.Time) {
		return subs[ord].group, subs[ord].now, subs[ord].from
	})
	if err != nil {
		return fmt.Errorf("registering %d consumer groups: %w", len(targets), err)
	}
	s.analyzeGrown(ctx) // as registerGroup
	return nil
}
