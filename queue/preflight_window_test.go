package queue_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// The pre-flight cut each target's range of
// consumers_ready at want + 1 rows before looking at windows and delays,
// so on a queue with windowBuffer (or delayedProcessing) partitions still
// inside their window hid an eligible one further along the index: the
// poller saw nothing to lease (a direct pop found it). With pushes
// arriving in the first partitions more often than the window, their
// windows never all ended at once: the eligible partition behind them
// starved for as long as the pushes went on. Each partition is reported
// once, and a queue without window or delay is read as before.
func TestPreflight_SeesEligiblePartitionsBehindWindows(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	for _, c := range []struct {
		queue string
		opts  func(*queue.Options)
		age   string // what makes the last partition eligible
	}{
		{"win", func(o *queue.Options) { o.WindowBuffer = 60 }, `UPDATE partitions SET last_push_at = now() - interval '2 minutes' WHERE name = 'p9'`},
		{"dly", func(o *queue.Options) { o.DelayedProcessing = 60 },
			`UPDATE messages SET created_at = now() - interval '2 minutes' WHERE partition_id = (SELECT id FROM partitions WHERE name = 'p9' AND queue_id = (SELECT id FROM queues WHERE name = 'dly'))`},
	} {
		_, err := s.Configure(ctx, queue.ConfigureRequest{Queue: c.queue, Options: optsJSON(c.opts)})
		require.NoError(t, err)
		for _, p := range []string{"p1", "p2", "p3", "p9"} { // created in this order: p9 last in the index
			_, err := s.Push(ctx, []queue.PushItem{{Queue: c.queue, Partition: p, Payload: json.RawMessage(`1`)}})
			require.NoError(t, err)
		}
		require.NoError(t, s.EnsureConsumers(ctx, []queue.Target{{Queue: c.queue}}))
		exec(t, s, c.age)
		avail, err := s.Preflight(ctx, []queue.Target{{Queue: c.queue, Want: 1}})
		require.NoError(t, err)
		var eligible []string
		seen := map[string]bool{}
		for _, a := range avail {
			assert.False(t, seen[a.Partition], "%s: %s reported twice", c.queue, a.Partition)
			seen[a.Partition] = true
			if a.Eligible {
				eligible = append(eligible, a.Partition)
			}
		}
		assert.Equal(t, []string{"p9"}, eligible, "%s: the one partition past its window or delay", c.queue)
	}
}
