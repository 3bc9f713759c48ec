package queue

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// Target is what a waiting consumer wants: one queue by name, or the queues
// of a namespace and/or task; one partition or any; one consumer group.
type Target struct {
	Queue     string
	Namespace string
	Task      string
	Partition string // zero: any
	Group     string // zero: DefaultGroup
	// Subscription options apply when the group is new to a queue (see
	// PopRequest).
	SubscriptionMode string
	SubscriptionFrom string
	// Since is when the consumer asked (this host's clock): "new" and "now"
	// subscriptions start there, not at the later moment EnsureConsumers
	// runs. Zero means the database's now.
	Since time.Time
}

// Availability is one partition that has messages beyond a group's cursor,
// for one target of a pre-flight.
type Availability struct {
	Target      int // index into the targets passed to Preflight
	Queue       string
	PartitionID string
	Partition   string
	Group       string
	// Waiting is how many messages the group has not finished:
	// last_offset − cursor − (done above the cursor).
	Waiting int64
	// HasConsumer is false when the group has no consumer row for the
	// partition yet: EnsureConsumers must create it (its starting cursor
	// depends on the subscription) before the partition can be leased.
	HasConsumer bool
	// Eligible: the partition can be leased now. Otherwise EligibleAt says
	// when it can (lease expiry, end of the window buffer, the first
	// pending message's delay), or is zero when that is unknown.
	Eligible   bool
	EligibleAt time.Time
	// DeadOnExpiry marks an expired lease whose next failed attempt sends a
	// message to the dead-letter queue; such a partition is popped with Pop
	// (which dead-letters) rather than PopAssigned.
	DeadOnExpiry bool
}

// preflightSQL answers, in one statement, for every target: the partitions
// with unfinished messages for the group, whether each can be leased now and
// if not, when. It reads partition and consumer rows only (waiting =
// last_offset − cursor), plus one index probe on messages per partition of
// a queue with delayed processing.
const preflightSQL = `-- herald:preflight
WITH k AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
	       WITH ORDINALITY AS k(qname, ns, task, pname, grp, ord)
), kq AS (
	SELECT k.ord, k.pname, k.grp, q.* FROM k JOIN queues q ON q.name = k.qname WHERE k.qname <> ''
	UNION ALL
	SELECT k.ord, k.pname, k.grp, q.* FROM k JOIN queues q
	  ON (k.ns = '' OR q.namespace = k.ns) AND (k.task = '' OR q.task = k.task) WHERE k.qname = ''
), rows AS (
	SELECT kq.ord, kq.name AS qname, p.id AS pid, p.name AS pname, kq.grp,
	       p.last_offset - coalesce(c.cursor, 0) - coalesce(cardinality(c.done), 0) AS waiting,
	       c.partition_id IS NOT NULL AS has_consumer,
	       CASE WHEN c.lease_expires_at > now() THEN c.lease_expires_at END AS lease_until,
	       CASE WHEN kq.window_buffer > 0 AND p.last_push_at > now() - make_interval(secs => kq.window_buffer)
	            THEN p.last_push_at + make_interval(secs => kq.window_buffer) END AS window_until,
	       CASE WHEN kq.delayed_processing > 0 THEN (
	            SELECT m.created_at + make_interval(secs => kq.delayed_processing) FROM messages m
	            WHERE m.partition_id = p.id AND m.seq = coalesce(c.cursor, 0) + 1) END AS visible_at,
	       (c.lease_id IS NOT NULL AND c.lease_expires_at <= now() AND c.lease_to > c.cursor
	        AND (CASE WHEN c.attempt_seq = c.cursor + 1 THEN c.attempts ELSE 0 END) >= kq.retry_limit) AS dead_on_expiry
	FROM kq
	JOIN partitions p ON p.queue_id = kq.id AND (kq.pname = '' OR p.name = kq.pname)
	LEFT JOIN consumers c ON c.partition_id = p.id AND c.consumer_group = kq.grp
	WHERE p.last_offset > coalesce(c.cursor, 0)
)
SELECT ord, qname, pid::text, pname, grp, waiting, has_consumer, dead_on_expiry,
       lease_until IS NULL AND window_until IS NULL AND (visible_at IS NULL OR visible_at <= now()) AS eligible,
       GREATEST(lease_until, window_until, CASE WHEN visible_at > now() THEN visible_at END) AS eligible_at
FROM rows`

// Preflight checks, in one query, which partitions every target could be
// served from. It takes no locks: the answer can be stale by the time of
// PopAssigned, which re-checks everything under its row locks.
func (s *Store) Preflight(ctx context.Context, targets []Target) ([]Availability, error) {
	if len(targets) == 0 {
		return nil, nil
	}
	n := len(targets)
	qn, ns, tk, pn, gr := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	for i, t := range targets {
		g := t.Group
		if g == "" {
			g = DefaultGroup
		}
		qn[i], ns[i], tk[i], pn[i], gr[i] = t.Queue, t.Namespace, t.Task, t.Partition, g
	}
	rows, err := s.pool.Query(ctx, preflightSQL, qn, ns, tk, pn, gr)
	if err != nil {
		return nil, fmt.Errorf("running pre-flight: %w", err)
	}
	defer rows.Close()
	var out []Availability
	for rows.Next() {
		var a Availability
		var ord int64
		var at *time.Time
		if err := rows.Scan(&ord, &a.Queue, &a.PartitionID, &a.Partition, &a.Group, &a.Waiting, &a.HasConsumer,
			&a.DeadOnExpiry, &a.Eligible, &at); err != nil {
			return nil, fmt.Errorf("reading pre-flight: %w", err)
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

// EnsureConsumers creates the consumer rows (and consumer group records)
// that targets need, with each new group's starting cursor set by its
// subscription options, in one round trip.
func (s *Store) EnsureConsumers(ctx context.Context, targets []Target) error {
	// The statements run in one transaction, and instances creating the
	// same rows at once must take their locks in the same order: sort by
	// group, then queue (and partition), as the rows are keyed.
	targets = slices.Clone(targets)
	slices.SortFunc(targets, func(a, b Target) int {
		return cmp.Or(cmp.Compare(a.Group, b.Group), cmp.Compare(a.Queue, b.Queue), cmp.Compare(a.Namespace, b.Namespace),
			cmp.Compare(a.Task, b.Task), cmp.Compare(a.Partition, b.Partition))
	})
	b := &pgx.Batch{}
	for _, t := range targets {
		req := PopRequest{Queue: t.Queue, Namespace: t.Namespace, Task: t.Task, Partition: t.Partition, Group: t.Group,
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
		b.Queue(fmt.Sprintf(popEnsureSQL, popFilter(&req, false), popFilter(&req, true)),
			req.Queue, req.Namespace, req.Task, req.Partition, req.Group, subNow, subFrom)
	}
	if b.Len() == 0 {
		return nil
	}
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("creating consumer rows: %w", err)
	}
	return nil
}
