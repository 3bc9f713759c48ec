package gateway

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The rate rings keep the last RateSamples intervals per queue,
// forget older laps, and bound the queues by the label limiter.
func TestRates_Ring(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	r := newRates(NewLabelLimiter(2))
	r.now = func() time.Time { return now }
	r.add("a", 3, 0)
	r.add("a", 0, 2)
	r.add("b", 1, 1)
	r.add("c", 5, 0) // past the limiter's two: counted as __other__
	r.add("d", 0, 0) // nothing: no ring
	now = now.Add(RateInterval)
	r.add("a", 1, 1)

	all := func(string) bool { return true }
	since, qs := r.snapshot(all)
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
	r.add("a", 7, 0)
	_, qs = r.snapshot(func(q string) bool { return q == "a" })
	require.Len(t, qs, 1)
	var sum int64
	for _, n := range qs[0].Pushed {
		sum += n
	}
	assert.Equal(t, int64(7), sum)
	assert.Equal(t, int64(7), qs[0].Pushed[RateSamples-1])
}
