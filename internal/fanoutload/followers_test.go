package fanoutload

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFanoutCounts_QuantileOfMergedHistograms(t *testing.T) {
	// 90 receipts in bucket 9 (0.9–1.0 ms) and 10 in bucket 99 (9.9–10 ms),
	// from two children.
	var c Counts
	c.Add(Counts{Followers: 1, Hist: [][2]int{{9, 50}, {99, 5}}})
	c.Add(Counts{Followers: 1, Hist: [][2]int{{9, 40}, {99, 5}}})
	assert.Equal(t, 2, c.Followers)
	assert.InDelta(t, 1.0, c.Quantile(50), 1e-9)
	assert.InDelta(t, 1.0, c.Quantile(90), 1e-9)
	assert.InDelta(t, 10.0, c.Quantile(91), 1e-9)
	assert.InDelta(t, 10.0, c.Quantile(100), 1e-9)
	assert.Zero(t, (&Counts{}).Quantile(50))
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

func TestSSEConn_ReadsEveryStampWhateverTheReadsAndChunksCut(t *testing.T) {
	events := ": connected\n\n" +
		"event: message\nid: a\ndata: {\"data\":{\"t\":1000000,\"i\":0}}\n\n" +
		": heartbeat\n\n" +
		"event: message\nid: b\ndata: {\"data\":{\"t\":2000000,\"i\":1}}\n\n" +
		"data: {\"data\":{\"t\":3000000,\"i\":1}}\n\n" // a repeat: out of order
	// The same body chunked as net/http does, with an extension once.
	var chunked strings.Builder
	for i, part := range []string{events[:20], events[20:21], events[21:90], events[90:]} {
		ext := ""
		if i == 1 {
			ext = ";x=y"
		}
		fmt.Fprintf(&chunked, "%X%s\r\n%s\r\n", len(part), ext, part)
	}
	chunked.WriteString("0\r\n\r\n")
	for _, tc := range []struct {
		name, body string
		chunked    bool
	}{{"plain", events, false}, {"chunked", chunked.String(), true}} {
		for cut := 1; cut <= len(tc.body); cut++ { // reads of cut bytes
			hist := make([]atomic.Int64, fanoutBuckets)
			var f fanoutFollower
			f.last.Store(-1)
			c := &sseConn{f: &f, hist: hist, ready: []byte(": connected"), chunked: tc.chunked}
			for p := tc.body; len(p) > 0; {
				k := min(cut, len(p))
				c.feed([]byte(p[:k]), 5000000)
				p = p[k:]
			}
			require.True(t, c.following, "%s, reads of %d", tc.name, cut)
			assert.Equal(t, int64(2), f.received.Load(), "%s, reads of %d", tc.name, cut)
			assert.Equal(t, int64(1), f.last.Load(), "%s, reads of %d", tc.name, cut)
			assert.Equal(t, int64(1), f.violations.Load(), "%s, reads of %d", tc.name, cut)
			// 5 ms - 1 ms and 5 ms - 2 ms, in 0.1 ms buckets.
			assert.Equal(t, int64(1), hist[40].Load(), "%s, reads of %d", tc.name, cut)
			assert.Equal(t, int64(1), hist[30].Load(), "%s, reads of %d", tc.name, cut)
		}
	}
}
