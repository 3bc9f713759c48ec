package poller_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
)

// Credit comes back to a subscription while a cycle pops for
// it, and a subscription that took all its credit allowed looks again when
// credit comes back. Draining 500 one-message partitions with credit 100
// stalled (the sweep is a minute away here) when a cycle judged "took all
// it could" by credit that had grown since it planned, or when credit
// given back to a subscription that had drained what it took never marked
// its queue.
func TestCredit_BackDuringACycleIsNotLost(t *testing.T) {
	e := newEnv(t, slowSweep)
	var items []queue.PushItem
	for i := range 500 {
		items = append(items, queue.PushItem{Queue: "d", Partition: fmt.Sprint("p", i), Payload: json.RawMessage(`{"n":1}`)})
	}
	_, err := e.store.Push(context.Background(), items)
	require.NoError(t, err)
	in, got := e.subscribe(poller.Intention{Target: queue.Target{Queue: "d"}, Batch: 10, Partitions: 100, Credit: 100})
	start := time.Now()
	n := 0
	for n < 500 {
		select {
		case res := <-got:
			n += len(res.Messages)
			go func() {
				var acks []queue.Ack
				for _, m := range res.Messages {
					acks = append(acks, queue.Ack{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID})
				}
				_, _ = e.store.Ack(context.Background(), acks)
				for range res.Messages {
					e.p.AddCredit(in, 1)
				}
			}()
		case <-time.After(10 * time.Second):
			t.Fatalf("stalled at %d of 500", n)
		}
	}
	t.Logf("drained 500 in %v", time.Since(start))
}

// Pushes on other instances reach this one merged (syncnet and NOTIFY pass
// at most one wake-up per partition or queue per window), so while a queue is pushed to
// elsewhere, credit coming back looks at it at once rather than at the
// merged wake-up (cross-instance p50 / p99 at 1,000 msgs/s went from
// 4.1 / 10.8 ms to 8.9 / 22.7 without it). Credit alone, on a queue
// pushed to only here, costs nothing.
func TestCredit_LooksAtOnceWhilePushedElsewhere(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, slowSweep, func(c *poller.Config) { c.Registerer = reg })
	in, got := e.subscribe(poller.Intention{Target: queue.Target{Queue: "x"}, Batch: 10, Credit: 100})
	e.push("x", "p", 0, 0)
	ackAll(t, e, in, receive1(t, got))
	e.settled()
	cycles := func() float64 { return metricValue(t, reg, "herald_poll_cycles_total") }
	before := cycles()
	e.p.AddCredit(in, 0)
	e.p.AddCredit(in, 1)
	e.settled()
	n := cycles() - before
	e.p.AddCredit(in, -1)
	before = cycles()
	e.p.Wake("sync", "x", "") // a push elsewhere (the message was acked: nothing to find)
	require.Eventually(t, func() bool { return cycles() > before }, 5*time.Second, time.Millisecond)
	before = cycles()
	e.p.AddCredit(in, 1) // well within remoteRecent of the wake-up
	e.settled()
	assert.Equal(t, 1.0, cycles()-before, "credit looks while the queue is pushed to elsewhere")
	assert.LessOrEqual(t, n, 1.0, "the hold's end (n = 0) looks once; credit alone does not")
}

// A source from elsewhere that names each pushed partition at once
// (Config.PromptSources: syncnet) leaves nothing for credit coming back to
// find: every push was served on the fast path as its wake-up came. Credit
// looking anyway ran a pre-flight per ack on the consuming instance (at 500
// msgs/s across instances, 41% of deliveries came after one: p50 2.2 ms
// against 1.1 ms on the fast path).
func TestCredit_DoesNotLookAfterPromptPartitionWakeUpsFromElsewhere(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, slowSweep, func(c *poller.Config) {
		c.Registerer = reg
		c.PromptSources = []string{"syncnet"}
	})
	in, got := e.subscribe(poller.Intention{Target: queue.Target{Queue: "x"}, Batch: 10, Partitions: 4, Credit: 100})
	parts := []string{"p1", "p2"}
	for i, part := range parts { // registers the group, learns the partition ids
		e.push("x", part, i, i)
		ackAll(t, e, in, receive1(t, got))
	}
	e.settled()
	e.store.SetHandOff(nil) // pushes through another instance
	cycles := func() float64 { return metricValue(t, reg, "herald_poll_cycles_total") }
	before := cycles()
	for i := range 10 {
		part := parts[i%2]
		_, err := e.store.Push(context.Background(), []queue.PushItem{{Queue: "x", Partition: part, Payload: json.RawMessage(`{"n":1}`)}})
		require.NoError(t, err)
		e.p.Wake("syncnet", "x", part)
		res := receive1(t, got)
		require.Equal(t, part, res.Partition)
		ackAll(t, e, in, res)
	}
	e.settled()
	assert.Equal(t, 0.0, cycles()-before, "no pre-flight: each push elsewhere was named at once")

	// A whole queue woken from elsewhere (many partitions merged) still
	// makes credit look.
	e.p.AddCredit(in, -1)
	e.p.Wake("syncnet", "x", "")
	require.Eventually(t, func() bool { return cycles() > before }, 5*time.Second, time.Millisecond)
	before = cycles()
	e.p.AddCredit(in, 1) // well within remoteRecent of the wake-up
	e.settled()
	assert.Equal(t, 1.0, cycles()-before, "credit looks after a wake-up of the whole queue from elsewhere")
}
