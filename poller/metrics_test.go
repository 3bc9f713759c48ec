package poller

import (
	"bytes"
	"testing"
	"time"

	"github.com/rs/zerolog"

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

// A delivery parked under a following lease behind offsets no push under
// way brings, which a read-back of the lease makes due, is counted
// (herald_follow_parked_by_read_total) and logged with the lease, the
// offsets read and how long it waited: a warning past parkedLong, a stall
// its consumer saw; a short wait is logged at info.
func TestMetrics_ParkedDeliveryHandedOnByAReadIsCountedAndLogged(t *testing.T) {
	m, err := newMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	var logged bytes.Buffer
	w := &worker{p: &Poller{metrics: m, log: zerolog.New(&logged)}}
	e := &streamLease{in: &Intention{Standing: true, Extend: true}, partitionID: "pid", lease: "L", next: 5, busy: true}
	at := func(offs ...int64) *queue.PopResult {
		res := &queue.PopResult{LeaseID: "L", PartitionID: "pid"}
		for _, o := range offs {
			res.Messages = append(res.Messages, queue.Message{PartitionID: "pid", Offset: o})
		}
		return res
	}
	parked := at(7)
	e.parked = []parkedDelivery{{e: e, res: parked, done: func() {}, at: time.Now().Add(-2 * time.Second)}}

	due := w.endStreams([]*streamLease{e}, at(5, 6)) // what the read found
	require.Len(t, due, 1, "the read moved the lease on to the parked delivery")
	w.noteReadHandOn(e, due, 4, 7, 2)
	assert.InDelta(t, 1, testutil.ToFloat64(m.parkedByRead), 0)
	line := logged.String()
	assert.Contains(t, line, `"level":"warn"`, "two seconds parked: a stall")
	assert.Contains(t, line, `"lease":"L"`)
	assert.Contains(t, line, `"after":4,"before":7,"read":2,"parked_from":7`)
	assert.Regexp(t, `"waited":[12][0-9]{3}`, line, "milliseconds")

	logged.Reset()
	e.parked = []parkedDelivery{{e: e, res: at(9), done: func() {}, at: time.Now()}}
	e.reserving = 1 // a push in flight may bring offset 8: no read yet
	assert.Empty(t, w.endStreams([]*streamLease{e}, parked), "the delivery at 7 ends: 9 waits for 8")
	e.reserving, e.busy = 0, true
	due = w.endStreams([]*streamLease{e}, at(8)) // a read found 8
	require.Len(t, due, 1)
	w.noteReadHandOn(e, due, 7, 9, 1)
	assert.InDelta(t, 2, testutil.ToFloat64(m.parkedByRead), 0)
	assert.Contains(t, logged.String(), `"level":"info"`, "a short wait is no stall")
}
