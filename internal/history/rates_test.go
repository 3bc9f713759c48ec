package history

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The rate rings keep the last RateSamples intervals per queue,
// forget older laps, and bound the queues by the label they are given.
func TestRates_Ring(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	r := NewRates(limit(2))
	r.now = func() time.Time { return now }
	r.Add("a", 3, 0)
	r.Add("a", 0, 2)
	r.Add("b", 1, 1)
	r.Add("c", 5, 0) // past the limiter's two: counted as __other__
	r.Add("d", 0, 0) // nothing: no ring
	now = now.Add(RateInterval)
	r.Add("a", 1, 1)

	all := func(string) bool { return true }
	since, qs := r.Snapshot(all)
	assert.Equal(t, now.Add(-(RateSamples-1)*RateInterval).Truncate(RateInterval).UTC(), since)
	require.Len(t, qs, 3)
	assert.Equal(t, []string{"__other__", "a", "b"}, []string{qs[0].Queue, qs[1].Queue, qs[2].Queue})
	a := qs[1]
	require.Len(t, a.Pushed, RateSamples)
	assert.Equal(t, []int64{3, 1}, a.Pushed[RateSamples-2:], "the last two intervals, oldest first")
	assert.Equal(t, []int64{2, 1}, a.Acked[RateSamples-2:])
	assert.Equal(t, int64(5), qs[0].Pushed[RateSamples-2])

	// Five minutes on, the old counts are out of the window, and a count
	// in a slot of an older lap starts afresh.
	now = now.Add(RateSamples * RateInterval)
	r.Add("a", 7, 0)
	_, qs = r.Snapshot(func(q string) bool { return q == "a" })
	require.Len(t, qs, 1)
	var sum int64
	for _, n := range qs[0].Pushed {
		sum += n
	}
	assert.Equal(t, int64(7), sum)
	assert.Equal(t, int64(7), qs[0].Pushed[RateSamples-1])
}

// limit is a label that names the first n queues and calls the others
// __other__, as the gateway's LabelLimiter does.
func limit(n int) func(string) string {
	named := map[string]bool{}
	return func(q string) string {
		if !named[q] && len(named) >= n {
			return "__other__"
		}
		named[q] = true
		return q
	}
}
