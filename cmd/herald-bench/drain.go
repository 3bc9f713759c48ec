package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/heraldmq/herald/client"
)

// The many-partition drain: one message in each of P partitions (the
// per-user-mailbox pattern) and one wildcard consumer draining them, over
// HTTP pops (batch 10, each batch acked in one request) and over one
// WebSocket subscription (maxInFlight 100, batch 10). A pop that scans the
// queue's partitions slows down as P grows; one that does not keeps its
// rate.
const (
	drainBatch       = 10
	drainMaxInFlight = 100
)

// drainResult is one drain of P partitions by one transport.
type drainResult struct {
	Partitions int     `json:"partitions"`
	Transport  string  `json:"transport"` // "http pop" or "ws"
	Drained    int     `json:"drained"`
	Seconds    float64 `json:"seconds"`
	PerSec     float64 `json:"per_s"`
}

func runDrain(ctx context.Context, srv *server, cfg benchConfig, log io.Writer) ([]drainResult, error) {
	var out []drainResult
	for _, p := range cfg.DrainPartitions {
		for _, transport := range []string{"http pop", "ws"} {
			q := fmt.Sprintf("bench-drain-%d-%s-%d", p, strings.ReplaceAll(transport, " ", ""), time.Now().UnixNano())
			progress(log, "drain: %d partitions, one message each, by %s", p, transport)
			if err := fillPartitions(ctx, srv.url, q, p); err != nil {
				return nil, err
			}
			progress(log, "drain: %d partitions filled, draining by %s", p, transport)
			until := time.Now().Add(cfg.Duration)
			start := time.Now()
			var n int
			var err error
			if transport == "ws" {
				n, err = drainWS(ctx, srv.url, q, p, until)
			} else {
				n, err = drainHTTP(ctx, srv.url, q, p, until)
			}
			if err != nil {
				return nil, err
			}
			el := time.Since(start).Seconds()
			r := drainResult{Partitions: p, Transport: transport, Drained: n, Seconds: el, PerSec: float64(n) / el}
			progress(log, "drain: %d partitions by %s: %d in %.1fs, %.0f msgs/s", p, transport, n, el, r.PerSec)
			out = append(out, r)
		}
	}
	return out, nil
}

// fillPartitions pushes one message to each of p partitions of q.
func fillPartitions(ctx context.Context, url, q string, p int) error {
	const perPush = 500
	for lo := 0; lo < p; lo += perPush {
		items := make([]string, 0, perPush)
		for i := lo; i < min(lo+perPush, p); i++ {
			items = append(items, fmt.Sprintf(`{"queue":%q,"partition":"u%07d","payload":{"u":%d}}`, q, i, i))
		}
		if err := post(ctx, url+"/api/v1/push", `{"items":[`+strings.Join(items, ",")+`]}`, http.StatusCreated); err != nil {
			return err
		}
	}
	return nil
}

// drainHTTP pops batches of drainBatch and acks each batch in one request,
// until p messages were acked or until passes.
func drainHTTP(ctx context.Context, url, q string, p int, until time.Time) (int, error) {
	n := 0
	for n < p && time.Now().Before(until) && ctx.Err() == nil {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet,
			fmt.Sprintf("%s/api/v1/pop/queue/%s?batch=%d&partitions=%d&wait=false", url, q, drainBatch, drainBatch), nil)
		if err != nil {
			return n, err
		}
		res, err := httpClient.Do(req)
		if err != nil {
			return n, err
		}
		var pop struct {
			Messages []struct {
				TransactionID string `json:"transactionId"`
				PartitionID   string `json:"partitionId"`
				LeaseID       string `json:"leaseId"`
			} `json:"messages"`
		}
		if res.StatusCode == http.StatusOK {
			err = json.NewDecoder(res.Body).Decode(&pop)
		}
		_ = res.Body.Close()
		if err != nil {
			return n, err
		}
		if len(pop.Messages) == 0 {
			continue
		}
		items := make([]string, len(pop.Messages))
		for i, m := range pop.Messages {
			items[i] = fmt.Sprintf(`{"transactionId":%q,"partitionId":%q,"leaseId":%q}`, m.TransactionID, m.PartitionID, m.LeaseID)
		}
		if err := post(ctx, url+"/api/v1/ack/batch", `{"acknowledgments":[`+strings.Join(items, ",")+`]}`, http.StatusOK); err != nil {
			return n, err
		}
		n += len(pop.Messages)
	}
	return n, nil
}

// drainWS drains with one WebSocket subscription (the SDK acks each
// message) until p messages were delivered or until passes.
func drainWS(ctx context.Context, url, q string, p int, until time.Time) (int, error) {
	c, err := client.Dial(ctx, url, client.Options{})
	if err != nil {
		return 0, err
	}
	defer func() { _ = c.Close() }()
	n := consumeCount(ctx, c, client.SubscribeOptions{Queue: q, Batch: drainBatch, MaxInFlight: drainMaxInFlight},
		int64(p), until)
	return int(n), nil
}

// consumeCount subscribes c with opts (the SDK acks each message) and
// returns how many messages were delivered once n were, or once until
// passes, whichever comes first.
func consumeCount(ctx context.Context, c *client.Client, opts client.SubscribeOptions, n int64, until time.Time) int64 {
	cctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	var got atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = c.Subscribe(cctx, opts, func(context.Context, *client.Message) error {
			if got.Add(1) == n {
				cancel()
			}
			return nil
		})
	})
	<-cctx.Done()
	wg.Wait()
	return got.Load()
}
