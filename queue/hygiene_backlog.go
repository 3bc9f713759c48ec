package queue

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The backlog figures of a hygiene sample: what each consumer group has
// not finished, how old the oldest of it is, and what sits in the
// dead-letter queue. They feed /metrics and its alerts, so they are read
// by the hygiene loop every 30 s, never at scrape time, and each read is
// bounded whatever the number of partitions.

// BacklogTop is how many (queue, group) pairs a sample reports, those
// with the most messages waiting first; the same bound applies to the
// dead-letter counts. It matches the gateway's default bound of queue
// label values (MetricsMaxQueuesDefault), past which names would share a
// label anyway.
const BacklogTop = 100

// BacklogAgeSample bounds the partitions of one (queue, group) pair whose
// first unfinished message a sample probes for its age: one primary-key
// range probe of messages each. Past it the age is read on the first
// BacklogAgeSample partitions in the order pops take them (unleased and
// least recently leased first, the ones most likely to hold the oldest
// message), so it is a lower bound. 1,000 probes × 100 pairs is about
// 100,000 index blocks every 30 s at worst.
const BacklogAgeSample = 1000

// GroupBacklog is what one consumer group has not finished in one queue.
// It is read from consumer rows, which exist once a group has read the
// queue: a queue no consumer ever read has none, and its depth is only
// in the push and pop counters.
type GroupBacklog struct {
	Queue, Group string
	// Waiting is the messages not finished for the group: over its
	// consumer rows, last_offset − cursor − cardinality(done).
	Waiting int64
	// Partitions is how many partitions hold some of them.
	Partitions int64
	// OldestAge is the age of the oldest unfinished message found (see
	// BacklogAgeSample); zero when none was found (retention removed it).
	OldestAge time.Duration
}

// DeadLetterCount is the size of one (queue, group)'s dead-letter queue.
type DeadLetterCount struct {
	Queue, Group string
	N            int64
}

// backlogSQL lists the BacklogTop pairs with the most messages waiting.
// Cost: the consumer rows with something waiting (the consumers_ready
// partial index, or a scan of consumers when most rows lag: never a scan
// of messages), then per listed pair up to $2 entries of its
// consumers_ready range, in index order with no sort, each with one probe
// of messages by primary key for its first unfinished message. A cursor's
// next offset is never in done (the cursor moves over the done prefix),
// so the first message above the cursor is the first unfinished one, or
// the first left after retention.
const backlogSQL = `-- herald:hygiene_backlog
WITH lag AS MATERIALIZED (
	-- The partition's last_offset, not the row's copy (a lower bound:
	-- pushes leave the rows of groups that are not reading alone).
	SELECT c.queue_id, c.consumer_group,
	       sum(greatest(p.last_offset - c.cursor - cardinality(c.done), 0))::bigint AS waiting,
	       count(*) FILTER (WHERE p.last_offset - c.cursor - cardinality(c.done) > 0) AS parts
	FROM consumers c JOIN partitions p ON p.id = c.partition_id WHERE c.last_offset > c.cursor
	GROUP BY 1, 2
	HAVING sum(greatest(p.last_offset - c.cursor - cardinality(c.done), 0)) > 0
	ORDER BY 3 DESC LIMIT $1
)
SELECT q.name, l.consumer_group, l.waiting, l.parts,
       coalesce(extract(epoch FROM now() - (
           SELECT min((SELECT m.created_at FROM messages m
                       WHERE m.partition_id = r.partition_id AND m.seq > r.cursor ORDER BY m.seq LIMIT 1))
           FROM (SELECT c.partition_id, c.cursor FROM consumers c
                 WHERE c.queue_id = l.queue_id AND c.consumer_group = l.consumer_group AND c.last_offset > c.cursor
                 ORDER BY c.lease_expires_at NULLS FIRST, c.leased_at NULLS FIRST, c.partition_id
                 LIMIT $2) r)), 0)::float8
FROM lag l JOIN queues q ON q.id = l.queue_id
ORDER BY l.waiting DESC, q.name, l.consumer_group`

// deadLettersSQL counts dead letters by (queue, group), the BacklogTop
// largest. Cost: the dead_letters_queue index (an index-only scan once
// vacuum has run); dead letters are few next to messages.
const deadLettersSQL = `-- herald:hygiene_dead_letters
SELECT q.name, d.consumer_group, d.n
FROM (SELECT queue_id, consumer_group, count(*) AS n FROM dead_letters GROUP BY 1, 2 ORDER BY 3 DESC LIMIT $1) d
JOIN queues q ON q.id = d.queue_id
ORDER BY d.n DESC, q.name, d.consumer_group`

// BacklogSample is the backlog part of one hygiene sample and when it was
// taken.
type BacklogSample struct {
	At          time.Time
	Backlog     []GroupBacklog
	DeadLetters []DeadLetterCount
}

// LatestBacklog returns the backlog of the latest hygiene sample
// (RunHygieneLoop, SampleHygiene), so a reader costs no query: its
// figures are up to one hygiene interval old. Before the first sample it
// takes one (the same two bounded queries) and keeps it; concurrent
// callers then share that one read.
func (s *Store) LatestBacklog(ctx context.Context) (*BacklogSample, error) {
	if b := s.lastBacklog.Load(); b != nil {
		return b, nil
	}
	s.backlogFirst.Lock()
	defer s.backlogFirst.Unlock()
	if b := s.lastBacklog.Load(); b != nil {
		return b, nil // taken while this caller waited
	}
	if err := s.sampleBacklog(ctx, &Hygiene{}); err != nil {
		return nil, err
	}
	return s.lastBacklog.Load(), nil
}

// sampleBacklog fills h.Backlog and h.DeadLetters, and keeps them for
// LatestBacklog.
func (s *Store) sampleBacklog(ctx context.Context, h *Hygiene) error {
	at := time.Now()
	rows, err := s.pool.Query(ctx, backlogSQL, BacklogTop, BacklogAgeSample)
	if err != nil {
		return fmt.Errorf("reading consumer lag: %w", err)
	}
	h.Backlog, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (GroupBacklog, error) {
		var b GroupBacklog
		var secs float64
		err := row.Scan(&b.Queue, &b.Group, &b.Waiting, &b.Partitions, &secs)
		b.OldestAge = time.Duration(max(secs, 0) * float64(time.Second))
		return b, err
	})
	if err != nil {
		return fmt.Errorf("reading consumer lag: %w", err)
	}
	rows, err = s.pool.Query(ctx, deadLettersSQL, BacklogTop)
	if err != nil {
		return fmt.Errorf("counting dead letters: %w", err)
	}
	h.DeadLetters, err = pgx.CollectRows(rows, pgx.RowToStructByPos[DeadLetterCount])
	if err != nil {
		return fmt.Errorf("counting dead letters: %w", err)
	}
	s.lastBacklog.Store(&BacklogSample{At: at, Backlog: h.Backlog, DeadLetters: h.DeadLetters})
	return nil
}
