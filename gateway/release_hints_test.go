package gateway_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/poller"
)

// recordedHints records the lease hints the poller sends to other
// instances (syncnet.Node in production).
type recordedHints struct {
	mu       sync.Mutex
	released map[string]bool // "partitionID/group"
}

func (h *recordedHints) LeaseAcquired(_, _, _, _ string, _ time.Time) {}
func (h *recordedHints) LeaseReleased(_, _, partitionID, group string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.released[partitionID+"/"+group] = true
}
func (h *recordedHints) LeasedElsewhere(string, string) (time.Time, bool) { return time.Time{}, false }
func (h *recordedHints) HintAudited(bool)                                 {}

func (h *recordedHints) has(partitionID, group string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.released[partitionID+"/"+group]
}

// A lease a stream gives back (a WebSocket that closes,
// an unsubscribe) is followed like any other release: other instances hear
// of it for every partition it covered. The release used to pass no
// partition ids, so no hint went out and only the first partition woke.
func TestStreamReleaseSendsLeaseHints(t *testing.T) {
	t.Parallel()
	hints := &recordedHints{released: map[string]bool{}}
	e := newEnvPolling(t, func(c *poller.Config) { c.Hints = hints })
	e.pushItems(`[{"queue":"rel-hints","partition":"p0","payload":1},{"queue":"rel-hints","partition":"p1","payload":2}]`)
	c := e.dialWS(t)
	c.subscribe(`{"type":"subscribe","queue":"rel-hints","consumerGroup":"g","batch":1,"maxInFlight":2}`)
	got := map[string]message{}
	for len(got) < 2 {
		for _, m := range deliveredMessages(t, c.next("deliver")) {
			got[m.Partition] = m
		}
	}
	_ = c.ws.Close()
	for _, m := range got {
		require.Eventually(t, func() bool { return hints.has(m.PartitionID, "g") }, 10*time.Second, 10*time.Millisecond,
			"a lease hint for partition %s", m.Partition)
	}
	r := e.pop("/api/v1/pop/queue/rel-hints?consumerGroup=g&batch=2&partitions=2")
	assert.Len(t, r.Messages, 2, "both given back")
}
