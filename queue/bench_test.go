package queue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/heraldmq/herald/queue"
)

// benchPayload is a typical small event (~100 bytes of JSON).
var benchPayload = json.RawMessage(`{"orderId":12345,"customer":"c-42","amount":99.5,"currency":"EUR","items":[1,2,3],"note":"benchmark"}`)

// BenchmarkPush pushes requests of `batch` items, request i going to
// partition i mod partitions. Reports msgs/s.
func BenchmarkPush(b *testing.B) {
	for _, parts := range []int{1, 100} {
		for _, batch := range []int{1, 10, 100} {
			b.Run(fmt.Sprintf("partitions=%d/batch=%d", parts, batch), func(b *testing.B) {
				s := newStore(b)
				ctx := context.Background()
				items := make([]queue.PushItem, batch)
				start := time.Now()
				n := 0
				for b.Loop() {
					p := fmt.Sprintf("p%d", n%parts)
					for j := range items {
						items[j] = queue.PushItem{Queue: "bench", Partition: p, Payload: benchPayload}
					}
					if _, err := s.Push(ctx, items); err != nil {
						b.Fatal(err)
					}
					n++
				}
				b.ReportMetric(float64(n*batch)/time.Since(start).Seconds(), "msgs/s")
			})
		}
	}
}

// BenchmarkPopAck pops a batch of 100 from any partition and acks it in one
// batch ack per iteration. The queue is refilled (outside the timer) when it
// runs dry. Reports msgs/s delivered and acknowledged.
func BenchmarkPopAck(b *testing.B) {
	for _, parts := range []int{1, 100} {
		b.Run(fmt.Sprintf("partitions=%d/batch=100", parts), func(b *testing.B) {
			s := newStore(b)
			ctx := context.Background()
			refill := func() {
				items := make([]queue.PushItem, 0, 1000)
				for i := 0; i < 20000; i++ {
					items = append(items, queue.PushItem{Queue: "bench", Partition: fmt.Sprintf("p%d", i%parts), Payload: benchPayload})
					if len(items) == cap(items) {
						if _, err := s.Push(ctx, items); err != nil {
							b.Fatal(err)
						}
						items = items[:0]
					}
				}
			}
			refill()
			var delivered int
			var busy time.Duration
			for b.Loop() {
				t0 := time.Now()
				res, err := s.Pop(ctx, queue.PopRequest{Queue: "bench", Batch: 100})
				if err != nil {
					b.Fatal(err)
				}
				if len(res.Messages) == 0 {
					b.StopTimer()
					refill()
					b.StartTimer()
					continue
				}
				acks := make([]queue.Ack, len(res.Messages))
				for i, m := range res.Messages {
					acks[i] = queue.Ack{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID}
				}
				out, err := s.Ack(ctx, acks)
				if err != nil {
					b.Fatal(err)
				}
				if !out[len(out)-1].LeaseReleased {
					b.Fatal("full ack did not release the lease")
				}
				delivered += len(res.Messages)
				busy += time.Since(t0)
			}
			b.ReportMetric(float64(delivered)/busy.Seconds(), "msgs/s")
		})
	}
}

// BenchmarkPushParallel is many producers pushing one message per request
// at once (b.SetParallelism(8) → 16 goroutines on 2 cores), the case that
// micro-batching would help. Reports msgs/s.
func BenchmarkPushParallel(b *testing.B) {
	for _, parts := range []int{1, 100} {
		b.Run(fmt.Sprintf("partitions=%d/batch=1", parts), func(b *testing.B) {
			s := newStore(b)
			ctx := context.Background()
			var n atomic.Int64
			start := time.Now()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := n.Add(1)
					items := []queue.PushItem{{Queue: "bench", Partition: fmt.Sprintf("p%d", int(i)%parts), Payload: benchPayload}}
					if _, err := s.Push(ctx, items); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(n.Load())/time.Since(start).Seconds(), "msgs/s")
		})
	}
}

// BenchmarkPushQueries counts database statements per single-message push:
// cold (a queue never seen: create and look up queue and partition), a new
// partition of a cached queue, and warm (both cached). Reported as
// queries/op, with the time per push.
func BenchmarkPushQueries(b *testing.B) {
	for _, kind := range []string{"cold", "new-partition", "warm"} {
		b.Run(kind, func(b *testing.B) {
			s := newStore(b)
			ctx := context.Background()
			stats := s.QueryStats()
			if _, err := s.Push(ctx, []queue.PushItem{{Queue: "bench", Payload: benchPayload}}); err != nil {
				b.Fatal(err)
			}
			total := func() (n uint64) {
				for _, v := range stats.Snapshot() {
					n += v
				}
				return n
			}
			start, n := total(), 0
			for b.Loop() {
				it := queue.PushItem{Queue: "bench", Payload: benchPayload}
				switch kind {
				case "cold":
					it.Queue = fmt.Sprintf("cold-%d", n)
				case "new-partition":
					it.Partition = fmt.Sprintf("p%d", n)
				}
				n++
				if _, err := s.Push(ctx, []queue.PushItem{it}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(total()-start)/float64(n), "queries/op")
		})
	}
}

// BenchmarkAckParallel is many consumers acking one message each at once
// (b.SetParallelism(g/2) → g goroutines on 2 cores), every ack on a lease
// and partition of its own: the case that coalescing acks helps. The
// messages are pushed and leased outside the timer. Reports statements and
// ack transactions per ack.
func BenchmarkAckParallel(b *testing.B) {
	for _, g := range []int{16, 64} {
		b.Run(fmt.Sprintf("goroutines=%d", g), func(b *testing.B) {
			s := newStore(b)
			ctx := context.Background()
			items := make([]queue.PushItem, b.N)
			for i := range items {
				items[i] = queue.PushItem{Queue: "bench", Partition: fmt.Sprintf("p%d", i), Payload: benchPayload}
			}
			for len(items) > 0 {
				n := min(len(items), 1000)
				if _, err := s.Push(ctx, items[:n]); err != nil {
					b.Fatal(err)
				}
				items = items[n:]
			}
			acks := make([]queue.Ack, 0, b.N)
			for len(acks) < b.N {
				res, err := s.Pop(ctx, queue.PopRequest{Queue: "bench", Batch: 1})
				if err != nil {
					b.Fatal(err)
				}
				if len(res.Messages) != 1 {
					b.Fatalf("popped %d messages, want 1", len(res.Messages))
				}
				m := res.Messages[0]
				acks = append(acks, queue.Ack{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID})
			}
			stats := s.QueryStats()
			before := stats.Snapshot()
			var next atomic.Int64
			b.SetParallelism(g / 2)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					a := acks[next.Add(1)-1]
					out, err := s.Ack(ctx, []queue.Ack{a})
					if err != nil {
						b.Error(err)
						return
					}
					if !out[0].Success || !out[0].LeaseReleased {
						b.Errorf("ack: %+v", out[0])
						return
					}
				}
			})
			b.StopTimer()
			after := stats.Snapshot()
			var stmts uint64
			for op, n := range after {
				stmts += n - before[op]
			}
			b.ReportMetric(float64(stmts)/float64(b.N), "stmts/ack")
			b.ReportMetric(float64(after["ack_lock"]-before["ack_lock"])/float64(b.N), "txs/ack")
		})
	}
}

// BenchmarkPushIdleGroups: single-message pushes to a queue that 0, 1,000
// or 10,000 consumer groups read once and left (each registered, caught up,
// gone), with one group reading. Reports the push's p50 and p99 and the WAL
// it writes per push (pg_current_wal_lsn before and after).
func BenchmarkPushIdleGroups(b *testing.B) {
	for _, groups := range []int{0, 1000, 10000} {
		b.Run(fmt.Sprintf("idle=%d", groups), func(b *testing.B) {
			s := newStore(b)
			ctx := context.Background()
			q := "idle-bench"
			item := []queue.PushItem{{Queue: q, Payload: benchPayload}}
			if _, err := s.Push(ctx, item); err != nil {
				b.Fatal(err)
			}
			var ts []queue.Target
			for g := range groups {
				ts = append(ts, queue.Target{Queue: q, Group: fmt.Sprintf("tab%05d", g), SubscriptionMode: "new"})
			}
			for len(ts) > 0 { // as a poll cycle registers them
				n := min(len(ts), 500)
				if err := s.EnsureConsumers(ctx, ts[:n]); err != nil {
					b.Fatal(err)
				}
				ts = ts[n:]
			}
			if _, err := s.Push(ctx, item); err != nil { // the push after they left
				b.Fatal(err)
			}
			var lats []time.Duration
			var wal0, wal1 int64
			lsn := func() int64 {
				var v int64
				if err := s.Pool().QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'::pg_lsn`).Scan(&v); err != nil {
					b.Fatal(err)
				}
				return v
			}
			wal0 = lsn()
			pushes := 0
			for b.Loop() {
				t0 := time.Now()
				if _, err := s.Push(ctx, item); err != nil {
					b.Fatal(err)
				}
				lats = append(lats, time.Since(t0))
				pushes++
			}
			wal1 = lsn()
			slices.Sort(lats)
			b.ReportMetric(float64(lats[len(lats)/2].Microseconds())/1000, "p50_ms")
			b.ReportMetric(float64(lats[len(lats)*99/100].Microseconds())/1000, "p99_ms")
			b.ReportMetric(float64(wal1-wal0)/float64(pushes), "wal_B/push")
		})
	}
}
