package gateway

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"

	"github.com/heraldmq/herald/queue"
)

func TestStorageMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	// One queue gets a label value of its own; the next shares __other__.
	RetentionMetrics(reg, NewLabelLimiter(1))([]queue.RetentionDeleted{{Queue: "q", Reason: queue.RetentionAge, N: 3},
		{Queue: "q", Reason: queue.RetentionMaxWait, N: 2}, {Queue: "q2", Reason: queue.RetentionAge, N: 4}})
	HygieneMetrics(reg, MetricsConfig{Queues: NewLabelLimiter(1)})(&queue.Hygiene{
		Tables:        map[string]queue.TableStats{"messages": {Bytes: 8192, Dead: 5, Live: 7}},
		OldestXminAge: 42, OldestXminHeld: 90 * time.Second})
	want := `
# HELP herald_retention_deleted_total What retention removed, by queue and reason: messages (retention, ttl, completed_retention), messages moved to the DLQ (max_wait) or dropped for want of one (max_wait_dropped), partitions (partition_cleanup), idle consumer groups (idle_group).
# TYPE herald_retention_deleted_total counter
herald_retention_deleted_total{queue="__other__",reason="retention"} 4
herald_retention_deleted_total{queue="q",reason="max_wait"} 2
herald_retention_deleted_total{queue="q",reason="retention"} 3
# HELP herald_xmin_held_seconds How long the oldest transaction holding a snapshot has been open.
# TYPE herald_xmin_held_seconds gauge
herald_xmin_held_seconds 90
`
	assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want), "herald_retention_deleted_total", "herald_xmin_held_seconds"))
	n, err := testutil.GatherAndCount(reg, "herald_table_bytes", "herald_table_dead_rows", "herald_table_live_rows", "herald_xmin_age")
	assert.NoError(t, err)
	assert.Equal(t, 4, n)
}

// The backlog gauges serve the last sample whole; pairs sharing
// a label value add up (the age takes the oldest); a pair that caught up
// disappears.
func TestBacklogMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	report := HygieneMetrics(reg, MetricsConfig{Queues: NewLabelLimiter(1)})
	report(&queue.Hygiene{SlotRetainedBytes: 4096, InactiveSlots: 1,
		Backlog: []queue.GroupBacklog{
			{Queue: "q", Group: queue.DefaultGroup, Waiting: 7, Partitions: 2, OldestAge: time.Minute},
			{Queue: "q", Group: "bus", Waiting: 3, Partitions: 1, OldestAge: time.Second},
			{Queue: "q", Group: "bis", Waiting: 1, Partitions: 1, OldestAge: time.Hour},
			{Queue: "q2", Group: queue.DefaultGroup, Waiting: 5, Partitions: 5, OldestAge: 2 * time.Second},
		},
		DeadLetters: []queue.DeadLetterCount{{Queue: "q", Group: "bus", N: 4}}})
	want := `
# HELP herald_consumer_lag_messages Messages a consumer group has not finished in a queue, for the pairs with the most (absent: nothing waits). Sampled every 30 s.
# TYPE herald_consumer_lag_messages gauge
herald_consumer_lag_messages{group="__QUEUE_MODE__",queue="__other__"} 5
herald_consumer_lag_messages{group="__QUEUE_MODE__",queue="q"} 7
herald_consumer_lag_messages{group="__other__",queue="q"} 4
# HELP herald_oldest_pending_age_seconds Age of the oldest message a consumer group has not finished (a lower bound past 1,000 partitions waiting). Sampled every 30 s.
# TYPE herald_oldest_pending_age_seconds gauge
herald_oldest_pending_age_seconds{group="__QUEUE_MODE__",queue="__other__"} 2
herald_oldest_pending_age_seconds{group="__QUEUE_MODE__",queue="q"} 60
herald_oldest_pending_age_seconds{group="__other__",queue="q"} 3600
# HELP herald_dead_letters Messages in the dead-letter queue, by queue and group. Sampled every 30 s.
# TYPE herald_dead_letters gauge
herald_dead_letters{group="__other__",queue="q"} 4
# HELP herald_replication_slot_retained_bytes WAL the replication slot furthest behind keeps on disk (0 without slots).
# TYPE herald_replication_slot_retained_bytes gauge
herald_replication_slot_retained_bytes 4096
`
	assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want), "herald_consumer_lag_messages",
		"herald_oldest_pending_age_seconds", "herald_dead_letters", "herald_replication_slot_retained_bytes"))

	report(&queue.Hygiene{Backlog: []queue.GroupBacklog{{Queue: "q", Group: queue.DefaultGroup, Waiting: 1, Partitions: 1}}})
	n, err := testutil.GatherAndCount(reg, "herald_consumer_lag_messages", "herald_dead_letters")
	assert.NoError(t, err)
	assert.Equal(t, 1, n, "the pairs that caught up are gone")
}
