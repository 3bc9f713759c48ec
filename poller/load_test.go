package poller_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
)

// 50 waiters on 5 partitions of one queue, 500 messages pushed in bursts:
// every message is delivered exactly once, per-partition order holds, and
// no (partition, group) is ever leased twice at once.
func TestPoller_ManyWaitersExactlyOnceInOrder(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, func(c *poller.Config) { c.Registerer = reg })
	const waiters, partitions, total = 50, 5, 500

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var mu sync.Mutex
	seen := map[string]int{}       // message id → deliveries
	last := map[string]int{}       // partition → last n delivered
	holding := map[string]string{} // partition → lease id currently held by a waiter
	var violations []string
	received := 0

	var wg sync.WaitGroup
	for i := 0; i < waiters; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				w := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q"}, Batch: 1 + i%4})
				var res *queue.PopResult
				select {
				case res = <-w.C():
				case <-ctx.Done():
					if res = w.Cancel(); res == nil {
						return
					}
				}
				mu.Lock()
				if h, ok := holding[res.Partition]; ok {
					violations = append(violations, fmt.Sprintf("partition %s leased by %s while %s holds it", res.Partition, res.LeaseID, h))
				}
				holding[res.Partition] = res.LeaseID
				for _, m := range res.Messages {
					seen[m.ID]++
					n := ns(&queue.PopResult{Messages: []queue.Message{m}})[0]
					if n <= last[m.Partition] {
						violations = append(violations, fmt.Sprintf("partition %s: %d after %d", m.Partition, n, last[m.Partition]))
					}
					last[m.Partition] = n
				}
				received += len(res.Messages)
				mu.Unlock()

				acks := make([]queue.Ack, len(res.Messages))
				for j, m := range res.Messages {
					acks[j] = queue.Ack{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID}
				}
				// Stop holding before the ack releases the lease.
				mu.Lock()
				delete(holding, res.Partition)
				mu.Unlock()
				out, err := e.store.Ack(context.Background(), acks)
				if !assert.NoError(t, err) {
					return
				}
				for _, r := range out {
					assert.True(t, r.Success, "%+v", r)
				}
				e.p.Wake(poller.SourceAck, "q", res.Partition)
			}
		}()
	}
	eventually(t, 10*time.Second, func() bool { return e.p.Intentions() >= waiters }, "waiters registered")

	// Bursts: 20 rounds of 5 messages per partition, numbered per partition.
	next := make([]int, partitions)
	for round := 0; round < total/(partitions*5); round++ {
		for p := 0; p < partitions; p++ {
			e.push("q", fmt.Sprintf("p%d", p), next[p]+1, next[p]+5)
			next[p] += 5
		}
	}
	eventually(t, 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return received >= total
	}, "all messages delivered")
	cancel()
	wg.Wait()

	assert.Empty(t, violations)
	assert.Len(t, seen, total)
	for id, n := range seen {
		assert.Equal(t, 1, n, "message %s delivered %d times", id, n)
	}
	assert.Zero(t, metricValue(t, reg, "herald_double_assignment_total"))
	assert.Positive(t, metricValue(t, reg, "herald_poll_deliveries_total"))
}

// metricValue sums a counter or gauge family from reg.
func metricValue(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		v := 0.0
		for _, m := range mf.GetMetric() {
			v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
		return v
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

// 1,000 waiting long-polls on 10 empty queues cost only the sweep's queries:
// nothing is dirty, so a cycle sends no SQL, and a sweep covers all queues
// of a worker with one pre-flight.
func TestPoller_IdleWaitersCostOnlyTheSweep(t *testing.T) {
	e := newEnv(t)
	const waiters, queues = 1000, 10
	ws := make([]*poller.Waiter, 0, waiters)
	for i := 0; i < waiters; i++ {
		ws = append(ws, e.p.Wait(poller.Intention{Target: queue.Target{Queue: fmt.Sprintf("idle-%d", i%queues)}}))
	}
	defer func() {
		for _, w := range ws {
			assert.Nil(t, w.Cancel())
		}
	}()
	eventually(t, 10*time.Second, func() bool { return e.p.Intentions() == waiters }, "registered")
	stats := e.store.QueryStats()
	// Let the registration cycles finish (each is one pre-flight): wait for
	// 300 ms without a statement.
	settle, quietSince := stats.Total(), time.Now()
	eventually(t, 10*time.Second, func() bool {
		if n := stats.Total(); n != settle {
			settle, quietSince = n, time.Now()
		}
		return settle > 0 && time.Since(quietSince) >= 300*time.Millisecond
	}, "registration cycles done")

	const window = 10 * time.Second
	before := stats.Snapshot()
	<-time.After(window) // the measurement window itself: nothing to wait for
	after := stats.Snapshot()
	spent := map[string]uint64{}
	var total uint64
	for op, n := range after {
		if d := n - before[op]; d > 0 {
			spent[op] = d
			total += d
		}
	}
	// Idle, the sweep runs every 5 s ±10%: within 10 s a worker sweeps at
	// most 3 times.
	maxSweeps := uint64(2 * 3)
	t.Logf("%d idle waiters on %d queues, %v: %d statements %v", waiters, queues, window, total, spent)
	assert.LessOrEqual(t, total, maxSweeps, "only sweep pre-flights: %v", spent)
	assert.Equal(t, total, spent["preflight"], "nothing but pre-flights")
}
