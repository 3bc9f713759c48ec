package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Spread summarises a set of numbers.
type Spread struct {
	Avg, Median, Min, Max float64
}

// Lag is how far consumer groups are behind: in messages over the
// (partition, group) pairs with something waiting, and in seconds since
// the oldest message some group waits for, over the partitions holding
// one.
type Lag struct {
	Pairs   int64
	Offset  Spread
	Seconds Spread
}

// StatusFilter selects queues by name, namespace and task ("" for any),
// within a scope.
type StatusFilter struct {
	Queue, Namespace, Task string
	Scope                  *Scope
}

func (f StatusFilter) validate() error {
	if err := errors.Join(validText("queue", f.Queue), validText("namespace", f.Namespace),
		validText("task", f.Task)); err != nil {
		return inputErrorf("%v", err)
	}
	return f.Scope.validate()
}

// statusSelect is the selection of a status statement over partitions p of
// queues q: $1 queue, $2 namespace, $3 task (NULL: any), $4/$5 scope.
var statusSelect = `($1::text IS NULL OR q.name = $1) AND ($2::text IS NULL OR q.namespace = $2)
	AND ($3::text IS NULL OR q.task = $3) AND ` + inScope("q.name", "p.name", 4, 5)

func (f StatusFilter) args() []any {
	a, b := f.Scope.args()
	return []any{optString(f.Queue), optString(f.Namespace), optString(f.Task), a, b}
}

// LagSample bounds the partitions whose oldest waiting message a lag
// measure reads: past it, the seconds are those of a uniform sample of
// the partitions with messages waiting (its minimum and maximum too).
const LagSample = 10000

// browseLagSQL measures the lag of the pairs with something waiting.
// Cost: the consumers_ready entries (every queue's, or one queue's range)
// and, per partition with something waiting (up to LagSample of them),
// one probe of messages for the oldest message its furthest-behind group
// waits for. At 100,000 partitions waiting, about 50,000 blocks.
var browseLagSQL = fmt.Sprintf(`-- herald:browse_lag
WITH r AS MATERIALIZED (
	SELECT c.partition_id, c.cursor, greatest(p.last_offset - c.cursor - cardinality(c.done), 0) AS waiting
	FROM consumers c JOIN partitions p ON p.id = c.partition_id JOIN queues q ON q.id = p.queue_id
	WHERE c.last_offset > c.cursor AND %[1]s
), t AS MATERIALIZED (
	SELECT extract(epoch FROM now() - (SELECT m.created_at FROM messages m
	                                  WHERE m.partition_id = x.partition_id AND m.seq > x.cursor ORDER BY m.seq LIMIT 1)) AS secs
	FROM (SELECT r.partition_id, min(r.cursor) AS cursor FROM r WHERE r.waiting > 0 GROUP BY 1
	      ORDER BY random() LIMIT %[2]d) x
)
SELECT (SELECT count(*) FROM r WHERE waiting > 0), o.avg, o.median, o.min, o.max, s.avg, s.median, s.min, s.max
FROM (SELECT coalesce(avg(waiting), 0)::float8 AS avg, coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY waiting), 0) AS median,
             coalesce(min(waiting), 0)::float8 AS min, coalesce(max(waiting), 0)::float8 AS max
      FROM r WHERE waiting > 0) o,
     (SELECT coalesce(avg(secs), 0)::float8 AS avg, coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY secs), 0) AS median,
             coalesce(min(secs), 0)::float8 AS min, coalesce(max(secs), 0)::float8 AS max
      FROM t WHERE secs IS NOT NULL) s`, statusSelect, LagSample)

// BrowseLag measures consumer lag over the selected queues.
func (s *Store) BrowseLag(ctx context.Context, f StatusFilter) (*Lag, error) {
	if err := f.validate(); err != nil {
		return nil, err
	}
	l := &Lag{}
	if err := s.browseRow(ctx, browseLagSQL, f.args(), &l.Pairs, &l.Offset.Avg, &l.Offset.Median,
		&l.Offset.Min, &l.Offset.Max, &l.Seconds.Avg, &l.Seconds.Median, &l.Seconds.Min, &l.Seconds.Max); err != nil {
		return nil, fmt.Errorf("measuring lag: %w", err)
	}
	return l, nil
}

// IngestWindow is the window BrowseIngested counts pushes over.
const IngestWindow = time.Minute

// browseIngestedSQL counts the messages pushed in the last $6 seconds: per
// partition pushed to since, its last offset less the offset of its
// newest older message. Cost: the selected partitions rows, and per
// partition pushed to in the window its messages of the window (read
// newest first, down to the first older one).
var browseIngestedSQL = `-- herald:browse_ingested
SELECT coalesce(sum(p.last_offset - coalesce(
	(SELECT m.seq FROM messages m WHERE m.partition_id = p.id AND m.created_at < now() - make_interval(secs => $6)
	 ORDER BY m.seq DESC LIMIT 1),
	(SELECT min(m.seq) - 1 FROM messages m WHERE m.partition_id = p.id), p.last_offset)), 0)::bigint
FROM queues q JOIN partitions p ON p.queue_id = q.id
WHERE p.last_push_at >= now() - make_interval(secs => $6 + 1) AND ` + statusSelect

// BrowseIngested counts the messages pushed over the last IngestWindow
// (as stored: a message deleted since does not count).
func (s *Store) BrowseIngested(ctx context.Context, f StatusFilter) (int64, error) {
	if err := f.validate(); err != nil {
		return 0, err
	}
	var n int64
	if err := s.browseRow(ctx, browseIngestedSQL, append(f.args(), IngestWindow.Seconds()), &n); err != nil {
		return 0, fmt.Errorf("counting pushed messages: %w", err)
	}
	return n, nil
}

// LeaseStats are the live leases over the selected queues.
type LeaseStats struct {
	Active     int64 // lease ids
	Partitions int64 // partitions with one
	Size       int64 // offsets they cover
	Acked      int64 // of those, finished
}

// browseLeasesSQL sums the live leases. Cost: the consumer rows holding a
// lease, live or not (consumers_lease_id).
var browseLeasesSQL = `-- herald:browse_leases
SELECT count(DISTINCT c.lease_id), count(DISTINCT c.partition_id),
       coalesce(sum(c.lease_to - c.lease_from + 1), 0)::bigint,
       coalesce(sum(greatest(least(c.cursor, c.lease_to) - c.lease_from + 1, 0)
                    + (SELECT count(*) FROM unnest(c.done) AS d WHERE d BETWEEN c.lease_from AND c.lease_to)), 0)::bigint
FROM consumers c JOIN partitions p ON p.id = c.partition_id JOIN queues q ON q.id = p.queue_id
WHERE c.lease_id IS NOT NULL AND c.lease_expires_at > now() AND ` + statusSelect

// BrowseLeases sums the live leases over the selected queues.
func (s *Store) BrowseLeases(ctx context.Context, f StatusFilter) (*LeaseStats, error) {
	if err := f.validate(); err != nil {
		return nil, err
	}
	l := &LeaseStats{}
	if err := s.browseRow(ctx, browseLeasesSQL, f.args(), &l.Active, &l.Partitions, &l.Size,
		&l.Acked); err != nil {
		return nil, fmt.Errorf("reading leases: %w", err)
	}
	return l, nil
}

// DeadLetterStats summarise the dead letters of the selected queues.
type DeadLetterStats struct {
	Total      int64 // dead letters (one per message and group)
	Partitions int64 // partitions with one
	TopErrors  []ErrorCount
}

// ErrorCount is how many dead letters carry one error text.
type ErrorCount struct {
	Error string
	Count int64
}

// browseDeadLettersSQL summarises dead letters: totals, then the five most
// frequent errors. Cost: the dead letters of the selected queues.
var browseDeadLettersSQL = `-- herald:browse_dead_letters
WITH d AS (
	SELECT d.partition_id, coalesce(d.error, '') AS error
	FROM dead_letters d JOIN queues q ON q.id = d.queue_id JOIN partitions p ON p.id = d.partition_id
	WHERE ` + statusSelect + `
), top AS (
	SELECT d.error, count(*) AS n FROM d GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 5
)
SELECT (SELECT count(*) FROM d), (SELECT count(DISTINCT d.partition_id) FROM d),
       coalesce((SELECT array_agg(top.error ORDER BY top.n DESC, top.error) FROM top), '{}'),
       coalesce((SELECT array_agg(top.n ORDER BY top.n DESC, top.error) FROM top), '{}')`

// BrowseDeadLetters summarises the dead letters of the selected queues.
func (s *Store) BrowseDeadLetters(ctx context.Context, f StatusFilter) (*DeadLetterStats, error) {
	if err := f.validate(); err != nil {
		return nil, err
	}
	out := &DeadLetterStats{TopErrors: []ErrorCount{}}
	var texts []string
	var counts []int64
	if err := s.browseRow(ctx, browseDeadLettersSQL, f.args(), &out.Total, &out.Partitions, &texts,
		&counts); err != nil {
		return nil, fmt.Errorf("summarising dead letters: %w", err)
	}
	for i := range texts {
		out.TopErrors = append(out.TopErrors, ErrorCount{Error: texts[i], Count: counts[i]})
	}
	return out, nil
}

// browseRow runs a one-row browse statement (see browse).
func (s *Store) browseRow(ctx context.Context, sql string, args []any, dest ...any) error {
	return s.browse(ctx, func(tx pgx.Tx) error { return tx.QueryRow(ctx, sql, args...).Scan(dest...) })
}

// Analytics intervals (the bucket of BrowseAnalytics).
var analyticsIntervals = map[string]time.Duration{"minute": time.Minute, "hour": time.Hour, "day": 24 * time.Hour}

// AnalyticsInterval reports a bucket's length by name: minute, hour or day.
func AnalyticsInterval(name string) (time.Duration, bool) {
	d, ok := analyticsIntervals[name]
	return d, ok
}

// MaxAnalyticsPoints bounds the buckets of one analytics read.
const MaxAnalyticsPoints = 10000

// Bucket is the messages created in one interval.
type Bucket struct {
	Start    time.Time
	Messages int64
}

// browseAnalyticsSQL counts the stored messages created in [$6, $7) per
// $8 (minute, hour, day; UTC). Cost: the selected partitions rows, and
// per partition pushed to since $6 its messages created since (from its
// newest message down, to find the first of the window, then the window
// again): proportional to the messages in the window, whatever the
// partitions hold before it.
var browseAnalyticsSQL = `-- herald:browse_analytics
SELECT date_trunc($8, m.created_at, 'UTC') AS b, count(*)
FROM queues q JOIN partitions p ON p.queue_id = q.id
CROSS JOIN LATERAL (
	SELECT m.created_at FROM messages m
	WHERE m.partition_id = p.id AND m.created_at >= $6 AND m.created_at < $7
	  AND m.seq > coalesce((SELECT m2.seq FROM messages m2 WHERE m2.partition_id = p.id AND m2.created_at < $6
	                        ORDER BY m2.seq DESC LIMIT 1), 0)
) m
WHERE p.last_push_at >= $6::timestamptz - interval '1 minute' AND ` + statusSelect + `
GROUP BY 1 ORDER BY 1`

// BrowseAnalytics counts the stored messages created in [from, to) by
// interval (minute, hour or day, UTC), every interval of the range
// present.
func (s *Store) BrowseAnalytics(ctx context.Context, f StatusFilter, from, to time.Time, interval string) ([]Bucket, error) {
	step, ok := analyticsIntervals[interval]
	if !ok {
		return nil, inputErrorf("interval must be minute, hour or day")
	}
	if err := f.validate(); err != nil {
		return nil, err
	}
	start := truncUTC(from, interval)
	if !to.After(from) {
		return nil, inputErrorf("from must be before to")
	}
	if n := to.Sub(start) / step; n > MaxAnalyticsPoints {
		return nil, inputErrorf("from and to span more than %d intervals of a %s", MaxAnalyticsPoints, interval)
	}
	counts := map[time.Time]int64{}
	err := s.browse(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, browseAnalyticsSQL, append(f.args(), from, to, interval)...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var b time.Time
			var n int64
			if err := rows.Scan(&b, &n); err != nil {
				return err
			}
			counts[b.UTC()] = n
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("counting messages: %w", err)
	}
	out := []Bucket{}
	for t := start; t.Before(to); t = next(t, interval) {
		out = append(out, Bucket{Start: t, Messages: counts[t]})
	}
	return out, nil
}

// truncUTC is the start of t's interval in UTC.
func truncUTC(t time.Time, interval string) time.Time {
	t = t.UTC()
	switch interval {
	case "day":
		return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	case "hour":
		return t.Truncate(time.Hour)
	}
	return t.Truncate(time.Minute)
}

// next is the start of the interval after the one starting at t.
func next(t time.Time, interval string) time.Time {
	if interval == "day" {
		return t.AddDate(0, 0, 1)
	}
	return t.Add(analyticsIntervals[interval])
}
