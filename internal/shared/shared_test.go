package shared

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/stretchr/testify/assert"

	"github.com/heraldmq/herald/gateway"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/syncnet"
)

// A queue's settings survive QUEUE_CONFIG_SET, encoded and decoded.
func TestConfigRoundTrip(t *testing.T) {
	o := queue.DefaultOptions()
	o.LeaseTime, o.RetryLimit, o.DelayedProcessing, o.WindowBuffer, o.MaxSize = 45, 7, 3, 2, 1000
	o.RetentionSeconds, o.CompletedRetentionSeconds, o.MaxWaitTimeSeconds, o.Priority = 60, 30, 90, 5
	o.RetentionEnabled, o.DeadLetterQueue, o.DLQAfterMaxRetries, o.EncryptionEnabled = true, true, true, true
	info := queue.QueueInfo{ID: queue.NewID(), Name: "orders", Namespace: "shop", Task: "orders", Options: o, Version: 9}

	b, err := syncnet.Marshal(syncnet.QueueConfigSetPayload{Config: WireConfig(info), Queue: info.Name, Version: 9})
	assert.NoError(t, err)
	var p syncnet.QueueConfigSetPayload
	assert.NoError(t, syncnet.Unmarshal(b, &p))
	assert.Equal(t, info, InfoFromWire(p.Queue, p.Config, p.Version))
}

// What the reference server sends (no id, version 0), or a value no queue
// can have, yields an entry without an id: the store only drops its own.
func TestInfoFromWire_Unusable(t *testing.T) {
	ref := syncnet.QueueConfig{LeaseTime: 300, RetryLimit: 3}
	assert.Empty(t, InfoFromWire("q", ref, 0).ID)
	bad := syncnet.QueueConfig{ID: queue.NewID(), LeaseTime: 1 << 40}
	assert.Empty(t, InfoFromWire("q", bad, 3).ID, "a lease time out of range")
	zero := syncnet.QueueConfig{ID: queue.NewID()}
	assert.Empty(t, InfoFromWire("q", zero, 3).ID, "a zero lease time is invalid")
}

func TestReporters(t *testing.T) {
	reg := prometheus.NewRegistry()
	// One queue gets a label value of its own; the next shares __other__.
	RetentionReporter(reg, gateway.NewLabelLimiter(1))([]queue.RetentionDeleted{{Queue: "q", Reason: queue.RetentionAge, N: 3},
		{Queue: "q", Reason: queue.RetentionMaxWait, N: 2}, {Queue: "q2", Reason: queue.RetentionAge, N: 4}})
	HygieneReporter(reg)(&queue.Hygiene{Tables: map[string]queue.TableStats{"messages": {Bytes: 8192, Dead: 5, Live: 7}},
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
