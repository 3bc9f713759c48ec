package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/heraldmq/herald/client"
	"github.com/heraldmq/herald/internal/benchstat"
)

// e2ePartitions spreads the end-to-end scenario's pushes as herald-bench
// does: a partition is leased to one consumer at a time, so with one
// partition every message would wait for the previous one's ack. The
// latency scenario's partitions are --partitions (heraldSys.partitions).
const e2ePartitions = 16

// heraldSys is `herald serve` on the run's PostgreSQL: pushes over HTTP,
// one WebSocket consumer (the Go SDK) acking each message.
type heraldSys struct {
	url  string
	cmd  *exec.Cmd
	done chan error
	pg   *postgres
	http *http.Client
	n    int
	refs int // rows (herald, herald-sse, herald-longpoll) sharing this process
	// partitions: the latency rows' pushes go round robin to p0…p(N-1).
	partitions int
}

func startHerald(ctx context.Context, bin string, pg *postgres, partitions int) (*heraldSys, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("finding a free port: %w", err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	cmd := exec.Command(bin, "serve", "--addr", addr, "--database-url", pg.url("herald"),
		"--log-level", "warn", "--drain-window", "0s", "--sse-max-connections", "15000")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	h := &heraldSys{url: "http://" + addr, cmd: cmd, done: make(chan error, 1), pg: pg, partitions: partitions,
		http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: time.Minute}}
	go func() { h.done <- cmd.Wait() }()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		select {
		case err := <-h.done:
			return nil, fmt.Errorf("herald exited while starting: %w", err)
		case <-ctx.Done():
			h.stop()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if res, err := h.http.Get(h.url + "/health"); err == nil {
			_ = res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return h, nil
			}
		}
		if time.Now().After(deadline) {
			h.stop()
			return nil, fmt.Errorf("herald not healthy in 2 minutes")
		}
	}
}

func (h *heraldSys) name() string { return "herald" }

func (h *heraldSys) cpu() (time.Duration, time.Duration) {
	return procCPU(h.cmd.Process.Pid), h.pg.cpu()
}

func (h *heraldSys) run(ctx context.Context, rate int, warm, dur time.Duration) (sample, error) {
	h.n++
	q := fmt.Sprintf("peers-%d-%d", rate, h.n)
	rec := benchstat.NewRecorder(runLength(rate, warm, dur))
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c, err := client.Dial(cctx, h.url, client.Options{})
	if err != nil {
		return sample{}, fmt.Errorf("dialing herald: %w", err)
	}
	defer func() { _ = c.Close() }()
	subDone := make(chan error, 1)
	go func() {
		// The SDK acknowledges each message its handler returns nil for,
		// on the socket, without waiting for the answer (as nats.go's Ack).
		subDone <- c.Subscribe(cctx, client.SubscribeOptions{Queue: q, Batch: 100, MaxInFlight: 1000},
			func(_ context.Context, m *client.Message) error {
				rec.RecordJSON(m.Data, time.Now())
				return nil
			})
	}()
	s, err := measure(ctx, rate, warm, dur, h.cpu, rec, func(ctx context.Context, i int, p []byte) error {
		body := fmt.Sprintf(`{"items":[{"queue":%q,"partition":"p%d","payload":%s}]}`, q, i%h.partitions, p)
		return h.post(ctx, "/api/v1/push", body)
	})
	cancel()
	if serr := <-subDone; serr != nil && err == nil {
		err = fmt.Errorf("subscribing: %w", serr)
	}
	return s, err
}

func (h *heraldSys) post(ctx context.Context, path, body string) error {
	_, err := call(ctx, h.http, http.MethodPost, h.url+path, []byte(body), http.StatusCreated, "posting "+path)
	return err
}

// close stops the process once the last row sharing it is done.
func (h *heraldSys) close() {
	h.refs--
	if h.refs <= 0 {
		h.stop()
	}
}

func (h *heraldSys) stop() { stopProcess(h.cmd, h.done) }

func (h *heraldSys) e2eMaxGroups() int { return 1 << 20 }

// e2e pushes batches with POST /api/v1/push over e2ePartitions
// partitions; each group has a WebSocket connection of its own (the Go
// SDK) with one subscription acking every message on the socket.
func (h *heraldSys) e2e(ctx context.Context, groups int, warm, dur time.Duration) (e2eSample, error) {
	h.n++
	q := fmt.Sprintf("peers-e2e-%d-%d", groups, h.n)
	r := newE2ERun(groups)
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var clients []*client.Client
	// stop ends the subscriptions (each unsubscribes) and the connections.
	stop := func() {
		cancel()
		wg.Wait()
		for _, c := range clients {
			_ = c.Close()
		}
		clients = nil
	}
	defer stop()
	subErr := make(chan error, groups)
	for i, g := range r.groups {
		c, err := client.Dial(cctx, h.url, client.Options{})
		if err != nil {
			return e2eSample{}, fmt.Errorf("dialing herald: %w", err)
		}
		clients = append(clients, c)
		wg.Go(func() {
			err := c.Subscribe(cctx, client.SubscribeOptions{Queue: q, ConsumerGroup: fmt.Sprintf("g%d", i),
				Batch: e2eBatch, MaxInFlight: 1000}, func(_ context.Context, m *client.Message) error {
				g.deliverJSON(m.Data)
				return nil
			})
			if err != nil {
				subErr <- err
			}
		})
	}
	s, err := measureE2E(ctx, r, warm, dur, h.cpu, func(ctx context.Context, first int, ps [][]byte) error {
		var b strings.Builder
		b.WriteString(`{"items":[`)
		for k, p := range ps {
			if k > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"queue":%q,"partition":"p%d","payload":%s}`, q, (first+k)%e2ePartitions, p)
		}
		b.WriteString(`]}`)
		return h.post(ctx, "/api/v1/push", b.String())
	})
	stop()
	select {
	case serr := <-subErr:
		if err == nil {
			err = fmt.Errorf("subscribing: %w", serr)
		}
	default:
	}
	// Each run starts from an empty queue, as the NATS runs start from a
	// new stream; the consumers are gone by now.
	if derr := h.deleteQueue(ctx, q); derr != nil && err == nil {
		err = derr
	}
	return s, err
}

func (h *heraldSys) deleteQueue(ctx context.Context, q string) error {
	_, err := call(ctx, h.http, http.MethodDelete, h.url+"/api/v1/resources/queues/"+q, nil, http.StatusOK, "deleting queue "+q)
	return err
}
