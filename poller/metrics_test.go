package poller

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// The delivery latency histogram counts first deliveries only,
// with their age at delivery (a clock ahead of the database's is 0).
func TestMetrics_DeliveryLatency(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	require.NoError(t, err)
	now := time.Now()
	m.observeDelivered(&queue.PopResult{Messages: []queue.Message{
		{CreatedAt: now.Add(-3 * time.Second)},
		{CreatedAt: now.Add(time.Second)},
		{CreatedAt: now.Add(-time.Hour), RetryCount: 1},
		{},
	}}, now)
	assert.Equal(t, 1, testutil.CollectAndCount(m.latency))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "herald_delivery_latency_seconds" {
			h := mf.GetMetric()[0].GetHistogram()
			assert.EqualValues(t, 2, h.GetSampleCount())
			assert.InDelta(t, 3.0, h.GetSampleSum(), 0.001)
			return
		}
	}
	t.Fatal("herald_delivery_latency_seconds not registered")
}
