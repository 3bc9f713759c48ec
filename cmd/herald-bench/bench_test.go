package main

import (
	"context"
	"io"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/gateway"
	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue/queuetest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestPercentile(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 1000; i++ {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	assert.Equal(t, 500*time.Millisecond, percentile(s, 50))
	assert.Equal(t, 990*time.Millisecond, percentile(s, 99))
	assert.Equal(t, 999*time.Millisecond, percentile(s, 99.9))
	assert.Zero(t, percentile(nil, 50))
}

func TestRecorder(t *testing.T) {
	r := &recorder{seen: map[int]bool{}, after: 2}
	now := time.Now()
	for _, i := range []int{0, 1, 2, 2, 3} {
		r.record([]byte(`{"t":`+strconv.FormatInt(now.Add(-time.Millisecond).UnixNano(), 10)+`,"i":`+strconv.Itoa(i)+`}`), now)
	}
	r.record([]byte(`not json`), now)
	assert.Equal(t, 4, r.count())
	assert.Equal(t, 1, r.dups)
	require.Len(t, r.samples, 2, "warm-up messages are not sampled")
	assert.Equal(t, time.Millisecond, r.samples[0])
}

// The bench itself, end to end against a real server at a low rate: every
// transport receives every message once.
func TestLatencyAndThroughputRun(t *testing.T) {
	store := queuetest.NewStore(t)
	p, err := poller.New(poller.Config{Store: store})
	require.NoError(t, err)
	t.Cleanup(p.Start())
	gw, err := gateway.New(gateway.Config{Store: store, Poller: p})
	require.NoError(t, err)
	ts := httptest.NewServer(gw.Handler())
	t.Cleanup(func() {
		gw.Drain()
		ts.Close()
		gw.Close()
	})
	srv := &server{url: ts.URL}
	cfg := benchConfig{Rate: 200, Duration: 3 * time.Second, TputRate: 2000}
	lat, err := runLatency(context.Background(), srv, cfg, io.Discard)
	require.NoError(t, err)
	require.Len(t, lat, 3)
	for _, l := range lat {
		assert.Equal(t, 600, l.Pushed, l.Transport)
		assert.Equal(t, l.Pushed, l.Received, l.Transport)
		assert.Zero(t, l.Duplicates, l.Transport)
		assert.Positive(t, l.P50, l.Transport)
		assert.GreaterOrEqual(t, l.P99, l.P50, l.Transport)
	}
	cfg.Duration = time.Second
	tp, err := runThroughput(context.Background(), srv, cfg, io.Discard)
	require.NoError(t, err)
	require.Len(t, tp, 3)
	assert.Positive(t, tp[0].PushedPerSec)
	assert.Zero(t, tp[1].Backlog, "the consumer drained everything")
	assert.Positive(t, tp[2].DeliveredPerS)
}
