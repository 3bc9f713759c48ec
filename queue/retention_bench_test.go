package queue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/heraldmq/herald/queue"
)

// BenchmarkRetentionUnderLoad: retention deletes N consumed messages
// (HERALD_RETENTION_N, default 1,000,000) while a producer pushes single
// messages at 200/s and a consumer pops them; it reports the producer's
// p99 push latency before and during the run, and their ratio.
//
//	go test -run '^$' -bench RetentionUnderLoad -benchtime 1x -timeout 30m ./queue
func BenchmarkRetentionUnderLoad(b *testing.B) {
	n := 1000000
	if v := os.Getenv("HERALD_RETENTION_N"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	s := newStore(b)
	ctx := context.Background()
	if _, err := s.Configure(ctx, queue.ConfigureRequest{Queue: "old", Options: json.RawMessage(`{"completedRetentionSeconds":1}`)}); err != nil {
		b.Fatal(err)
	}
	// N messages over 10 partitions, then marked consumed by one group.
	items := make([]queue.PushItem, 1000)
	for done := 0; done < n; done += len(items) {
		for i := range items {
			items[i] = queue.PushItem{Queue: "old", Partition: fmt.Sprintf("p%d", (done/len(items))%10), Payload: benchPayload}
		}
		if _, err := s.Push(ctx, items); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := s.Pop(ctx, queue.PopRequest{Queue: "old", Batch: 1, AutoAck: true}); err != nil { // the group and its rows
		b.Fatal(err)
	}
	if _, err := s.Pool().Exec(ctx, `INSERT INTO consumers (partition_id, consumer_group, queue_id, last_offset, cursor)
		SELECT p.id, $1, p.queue_id, p.last_offset, p.last_offset FROM partitions p JOIN queues q ON q.id = p.queue_id WHERE q.name = 'old'
		ON CONFLICT (partition_id, consumer_group) DO UPDATE SET cursor = EXCLUDED.cursor, done = '{}'`, queue.DefaultGroup); err != nil {
		b.Fatal(err)
	}
	// Older than completedRetentionSeconds, without waiting for it.
	if _, err := s.Pool().Exec(ctx, `UPDATE messages m SET created_at = m.created_at - interval '2 seconds'
		FROM partitions p JOIN queues q ON q.id = p.queue_id WHERE p.id = m.partition_id AND q.name = 'old'`); err != nil {
		b.Fatal(err)
	}
	if _, err := s.Pool().Exec(ctx, `VACUUM ANALYZE messages`); err != nil {
		b.Fatal(err)
	}

	// The live load: 200 pushes/s to another queue, a consumer popping.
	var mu sync.Mutex
	var during bool
	var before, inRun []time.Duration
	stop := make(chan struct{})
	baseline := make(chan struct{}) // closed once 5 s of pushes (1,000) are timed before the run
	const baselinePushes = 1000
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			start := time.Now()
			if _, err := s.Push(ctx, []queue.PushItem{{Queue: "live", Payload: benchPayload}}); err != nil {
				b.Error(err)
				return
			}
			took := time.Since(start)
			mu.Lock()
			if during {
				inRun = append(inRun, took)
			} else if before = append(before, took); len(before) == baselinePushes {
				close(baseline)
			}
			mu.Unlock()
		}
	})
	wg.Go(func() {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			if _, err := s.Pop(ctx, queue.PopRequest{Queue: "live", Batch: 100, AutoAck: true}); err != nil {
				b.Error(err)
				return
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	})
	select {
	case <-baseline:
	case <-time.After(time.Minute):
		b.Fatal("no baseline: the producer did not push")
	}
	mu.Lock()
	during = true
	mu.Unlock()
	start := time.Now()
	var deleted int64
	for b.Loop() {
		d, _, err := s.RunRetention(ctx, 0)
		if err != nil {
			b.Fatal(err)
		}
		for _, x := range d {
			deleted += x.N
		}
	}
	took := time.Since(start)
	close(stop)
	wg.Wait()
	p99 := func(d []time.Duration) float64 {
		slices.Sort(d)
		if len(d) == 0 {
			return 0
		}
		return float64(d[len(d)*99/100]) / 1e6
	}
	pb, pd := p99(before), p99(inRun)
	b.ReportMetric(float64(deleted), "deleted")
	b.ReportMetric(took.Seconds(), "retention-s")
	b.ReportMetric(pb, "p99-before-ms")
	b.ReportMetric(pd, "p99-during-ms")
	if pb > 0 {
		b.ReportMetric(pd/pb, "p99-ratio")
	}
	b.Logf("deleted %d in %v; push p99 %.2f ms before (%d pushes), %.2f ms during (%d pushes)", deleted, took, pb, len(before), pd, len(inRun))
}
