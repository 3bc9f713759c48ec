package history

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The sampler keeps /proc/self/statm open and reads it again at offset 0
// each second: every read gives the process's sizes as they are then, the
// tenth as the first, and one that grew by 64 MiB touched shows it.
func TestProcMemory_ReadsTheOpenFileAgainEachTime(t *testing.T) {
	statm, err := os.Open("/proc/self/statm")
	require.NoError(t, err, "Linux only, as the sampler's memory gauges")
	defer func() { _ = statm.Close() }()
	var rss, vsize float64
	for range 10 {
		rss, vsize = procMemory(statm)
		require.Positive(t, rss)
		require.GreaterOrEqual(t, vsize, rss)
	}
	grown := make([]byte, 64<<20)
	for i := range grown {
		grown[i] = 1
	}
	after, _ := procMemory(statm)
	assert.GreaterOrEqual(t, after-rss, float64(48<<20), "64 MiB touched since the last read")
	assert.Equal(t, byte(1), grown[len(grown)-1])
	none, _ := procMemory(nil)
	assert.Zero(t, none, "no file: zero")
}
