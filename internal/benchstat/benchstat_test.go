package benchstat

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPercentile(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 1000; i++ {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	assert.Equal(t, 500*time.Millisecond, Percentile(s, 50))
	assert.Equal(t, 990*time.Millisecond, Percentile(s, 99))
	assert.Equal(t, 999*time.Millisecond, Percentile(s, 99.9))
	assert.Equal(t, 1000*time.Millisecond, Percentile(s, 100))
	assert.Zero(t, Percentile(nil, 50))
	assert.InDelta(t, 500.0, Latencies{Sorted: s}.Ms(50), 1e-9)
}

func TestRecorder_CountsDuplicatesAndSamplesAfterWarmUp(t *testing.T) {
	r := NewRecorder(4, 2)
	now := time.Now()
	for _, i := range []int{0, 1, 2, 2, 3} {
		r.RecordJSON([]byte(`{"t":`+strconv.FormatInt(now.Add(-time.Millisecond).UnixNano(), 10)+`,"i":`+strconv.Itoa(i)+`}`), now)
	}
	r.RecordJSON([]byte(`not json`), now)
	assert.Equal(t, 4, r.Count())
	select {
	case <-r.All():
	default:
		t.Fatal("All is not closed after the 4 distinct messages expected")
	}
	l := r.Latencies()
	assert.Equal(t, 4, l.Received)
	assert.Equal(t, 1, l.Duplicates)
	require.Len(t, l.Sorted, 2, "warm-up messages are not sampled")
	assert.Equal(t, time.Millisecond, l.Sorted[0])
}

func TestRecorder_WithoutTotalAllStaysOpen(t *testing.T) {
	r := NewRecorder(0, 0)
	r.Record(0, time.Now().UnixNano(), time.Now())
	select {
	case <-r.All():
		t.Fatal("All closed though no total was given")
	default:
	}
	assert.Equal(t, 1, r.Count())
}
