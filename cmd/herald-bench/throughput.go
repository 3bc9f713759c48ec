package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/heraldmq/herald/client"
)

// Throughput shape: pushes of tputBatch messages over tputPartitions
// partitions; one WebSocket consumer taking batches of tputBatch.
const (
	tputBatch      = 100
	tputPartitions = 10
	tputProducers  = 2
)

// throughputResult is one phase of the throughput scenario.
type throughputResult struct {
	Phase         string  `json:"phase"` // push only, consume only, both at a fixed rate
	Batch         int     `json:"batch"`
	Partitions    int     `json:"partitions"`
	Groups        int     `json:"groups"` // consumer groups, each one WebSocket consumer
	Seconds       float64 `json:"seconds"`
	PushedPerSec  float64 `json:"pushed_per_s"`
	DeliveredPerS float64 `json:"delivered_per_s"`
	AckedPerSec   float64 `json:"acked_per_s"`
	Backlog       int64   `json:"backlog"`
}

func runThroughput(ctx context.Context, srv *server, cfg benchConfig, log io.Writer) ([]throughputResult, error) {
	q := fmt.Sprintf("bench-tput-%d", time.Now().UnixNano())
	var out []throughputResult

	// 1. Producers alone, as fast as they go.
	progress(log, "throughput: %d producers pushing batches of %d to %d partitions for %v",
		tputProducers, tputBatch, tputPartitions, cfg.Duration)
	start := time.Now()
	n, err := produce(ctx, srv.url, q, 0, time.Now().Add(cfg.Duration))
	if err != nil {
		return nil, err
	}
	el := time.Since(start).Seconds()
	out = append(out, throughputResult{Phase: "push", Batch: tputBatch, Partitions: tputPartitions, Seconds: el,
		PushedPerSec: float64(n) / el, Backlog: n})
	progress(log, "throughput: pushed %.0f msgs/s", float64(n)/el)

	// 2. One WebSocket consumer drains what was pushed.
	progress(log, "throughput: one WebSocket consumer drains %d messages", n)
	c, err := client.Dial(ctx, srv.url, client.Options{})
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.Close() }()
	acked0, _ := srv.metric("herald_acks_total")
	start = time.Now()
	delivered := consumeCount(ctx, c, client.SubscribeOptions{Queue: q, Batch: tputBatch, MaxInFlight: 10 * tputBatch},
		n, time.Now().Add(5*time.Minute))
	el = time.Since(start).Seconds()
	acked1, _ := srv.metric("herald_acks_total")
	out = append(out, throughputResult{Phase: "consume", Batch: tputBatch, Partitions: tputPartitions, Seconds: el,
		DeliveredPerS: float64(delivered) / el, AckedPerSec: (acked1 - acked0) / el, Backlog: n - delivered})
	progress(log, "throughput: delivered %.0f msgs/s, acked %.0f msgs/s", float64(delivered)/el, (acked1-acked0)/el)

	// 3. Both at once, producers paced at --tput-rate.
	progress(log, "throughput: producers at %d msgs/s and the consumer together for %v", cfg.TputRate, cfg.Duration)
	q2 := q + "-e2e"
	var got atomic.Int64
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = c.Subscribe(cctx, client.SubscribeOptions{Queue: q2, Batch: tputBatch, MaxInFlight: 10 * tputBatch},
			func(context.Context, *client.Message) error {
				got.Add(1)
				return nil
			})
	})
	acked0, _ = srv.metric("herald_acks_total")
	start = time.Now()
	pushed, err := produce(ctx, srv.url, q2, cfg.TputRate, time.Now().Add(cfg.Duration))
	if err != nil {
		cancel()
		wg.Wait()
		return nil, err
	}
	el = time.Since(start).Seconds()
	d := got.Load()
	acked1, _ = srv.metric("herald_acks_total")
	cancel()
	wg.Wait()
	out = append(out, throughputResult{Phase: fmt.Sprintf("both at %d/s", cfg.TputRate), Batch: tputBatch,
		Partitions: tputPartitions, Seconds: el, PushedPerSec: float64(pushed) / el, DeliveredPerS: float64(d) / el,
		AckedPerSec: (acked1 - acked0) / el, Backlog: pushed - d})
	progress(log, "throughput: pushed %.0f/s, delivered %.0f/s, acked %.0f/s, backlog %d at the end",
		float64(pushed)/el, float64(d)/el, (acked1-acked0)/el, pushed-d)
	if cfg.MatrixFor > 0 {
		m, err := runMatrix(ctx, srv, cfg, log)
		if err != nil {
			return nil, err
		}
		out = append(out, m...)
	}
	return out, nil
}

// runMatrix pushes and consumes at once, both as fast as they go, at batch
// 1, 10 and 100, over 1 and 100 partitions, with 1 and 5 consumer groups
// (one WebSocket consumer each): the sustained rates.
func runMatrix(ctx context.Context, srv *server, cfg benchConfig, log io.Writer) ([]throughputResult, error) {
	var out []throughputResult
	for _, groups := range []int{1, 5} {
		for _, parts := range []int{1, 100} {
			for _, batch := range []int{1, 10, 100} {
				q := fmt.Sprintf("bench-matrix-%d-%d-%d-%d", batch, parts, groups, time.Now().UnixNano())
				c, err := client.Dial(ctx, srv.url, client.Options{})
				if err != nil {
					return nil, err
				}
				var got atomic.Int64
				cctx, cancel := context.WithCancel(ctx)
				var wg sync.WaitGroup
				for g := range groups {
					wg.Go(func() {
						_ = c.Subscribe(cctx, client.SubscribeOptions{Queue: q, ConsumerGroup: fmt.Sprintf("g%d", g),
							Batch: max(batch, 10), MaxInFlight: 10 * max(batch, 10)},
							func(context.Context, *client.Message) error { got.Add(1); return nil })
					})
				}
				// The window opens once every group's subscription is
				// live (one message each received): dialling and
				// subscribing are not part of a sustained rate, and on a
				// loaded machine they alone have outlasted a 1 s window.
				if err := post(ctx, srv.url+"/api/v1/push", fmt.Sprintf(`{"items":[{"queue":%q,"partition":"warm","payload":0}]}`, q), http.StatusCreated); err != nil {
					cancel()
					wg.Wait()
					_ = c.Close()
					return nil, err
				}
				for ready := time.Now().Add(30 * time.Second); got.Load() < int64(groups) && time.Now().Before(ready); {
					time.Sleep(5 * time.Millisecond)
				}
				got.Store(0)
				acked0, _ := srv.metric("herald_acks_total")
				start := time.Now()
				pushed, err := produceShaped(ctx, srv.url, q, 0, time.Now().Add(cfg.MatrixFor), batch, parts)
				el := time.Since(start).Seconds()
				d := got.Load()
				acked1, _ := srv.metric("herald_acks_total")
				cancel()
				wg.Wait()
				_ = c.Close()
				if err != nil {
					return nil, err
				}
				r := throughputResult{Phase: "both, unpaced", Batch: batch, Partitions: parts, Groups: groups, Seconds: el,
					PushedPerSec: float64(pushed) / el, DeliveredPerS: float64(d) / float64(groups) / el,
					AckedPerSec: (acked1 - acked0) / float64(groups) / el, Backlog: pushed - d/int64(groups)}
				progress(log, "throughput matrix: batch %d, %d partitions, %d groups: pushed %.0f/s, delivered %.0f/s per group",
					batch, parts, groups, r.PushedPerSec, r.DeliveredPerS)
				out = append(out, r)
			}
		}
	}
	return out, nil
}

// produce pushes batches until the deadline, at rate messages per second
// (0: as fast as the producers go), and returns how many were stored.
func produce(ctx context.Context, url, q string, rate int, until time.Time) (int64, error) {
	return produceShaped(ctx, url, q, rate, until, tputBatch, tputPartitions)
}

// produceShaped is produce with a batch size and a number of partitions.
func produceShaped(ctx context.Context, url, q string, rate int, until time.Time, batch, partitions int) (int64, error) {
	var pushed atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, tputProducers)
	start := time.Now()
	for p := range tputProducers {
		wg.Go(func() {
			for n := 0; time.Now().Before(until) && ctx.Err() == nil; n++ {
				if rate > 0 {
					// Each producer sends every tputProducers-th batch of the schedule.
					due := start.Add(time.Duration(float64(n*tputProducers+p) * float64(batch) / float64(rate) * float64(time.Second)))
					if d := time.Until(due); d > 0 {
						t := time.NewTimer(d)
						<-t.C
					}
				}
				items := make([]string, batch)
				for i := range items {
					items[i] = fmt.Sprintf(`{"queue":%q,"partition":"p%d","payload":{"p":%d,"n":%d,"i":%d}}`,
						q, (p*7+n*batch+i)%partitions, p, n, i)
				}
				if err := post(ctx, url+"/api/v1/push", `{"items":[`+strings.Join(items, ",")+`]}`, 201); err != nil {
					errc <- err
					return
				}
				pushed.Add(int64(batch))
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errc:
		return pushed.Load(), err
	default:
		return pushed.Load(), nil
	}
}
