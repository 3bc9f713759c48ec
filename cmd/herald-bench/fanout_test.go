package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseFanout_ReadsCasesAndRefusesBadOnes(t *testing.T) {
	got, err := parseFanout("10000@10, 1000@100")
	require.NoError(t, err)
	assert.Equal(t, []fanoutCase{{10000, 10}, {1000, 100}}, got)
	none, err := parseFanout("")
	require.NoError(t, err)
	assert.Empty(t, none)
	for _, bad := range []string{"10000", "x@10", "10@x", "0@10", "10@0", "100001@1", "1@10001"} {
		_, err := parseFanout(bad)
		assert.Error(t, err, bad)
	}
}

func TestFanoutCounts_QuantileOfMergedHistograms(t *testing.T) {
	// 90 receipts in bucket 9 (0.9–1.0 ms) and 10 in bucket 99 (9.9–10 ms),
	// from two children.
	var c fanoutCounts
	c.add(fanoutCounts{Followers: 1, Hist: [][2]int{{9, 50}, {99, 5}}})
	c.add(fanoutCounts{Followers: 1, Hist: [][2]int{{9, 40}, {99, 5}}})
	assert.Equal(t, 2, c.Followers)
	assert.InDelta(t, 1.0, c.quantile(50), 1e-9)
	assert.InDelta(t, 1.0, c.quantile(90), 1e-9)
	assert.InDelta(t, 10.0, c.quantile(91), 1e-9)
	assert.InDelta(t, 10.0, c.quantile(100), 1e-9)
	assert.Zero(t, (&fanoutCounts{}).quantile(50))
}

func TestIntAfter_ReadsThePayloadStampOfAnEvent(t *testing.T) {
	line := []byte(`data: {"consumerGroup":"","data":{"t":1764200000123456789,"i":42},"offset":7}` + "\n")
	v, ok := intAfter(line, `"t":`)
	assert.True(t, ok)
	assert.Equal(t, int64(1764200000123456789), v)
	v, ok = intAfter(line, `"i":`)
	assert.True(t, ok)
	assert.Equal(t, int64(42), v)
	_, ok = intAfter([]byte("data: {}\n"), `"t":`)
	assert.False(t, ok, "a ping has no stamp")
	_, ok = intAfter([]byte(`data: {"t":"x"}`), `"t":`)
	assert.False(t, ok, "a stamp must be a number")
}
