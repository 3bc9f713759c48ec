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
	HygieneMetrics(reg)(&queue.Hygiene{Tables: map[string]queue.TableStats{"messages": {Bytes: 8192, Dead: 5, Live: 7}},
		OldestXminAge: 42, OldestXminHeld: 90 * time.Second})
	want := `
# HELP herald_retention_deleted_total What retention removed, by queue and reason: messages (retention, completed_retention), messages moved to the DLQ (max_wait), partitions (partition_cleanup).
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
