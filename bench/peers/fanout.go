package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	"github.com/heraldmq/herald/internal/benchstat"
	"github.com/heraldmq/herald/internal/fanoutload"
)

// The fanout scenario: N SSE clients follow one stream, single-message
// pushes at a rate; every client must get every message in push order.
// Herald: GET /api/v1/follow/queue/{q} (a follow stream, read from
// PostgreSQL once per instance). centrifuge: its SSE transport (GET
// /connection/sse?cf_connect=…, the closest it has to a plain EventSource)
// with a server-side subscription to the channel, memory broker. The
// floor (floor.go, --fanout-floor): a bare server that only writes each
// frame (the size of Herald's) to every socket, the push answered once
// queued.

// fanoutPerProcess is how many followers one child holds at most.
const fanoutPerProcess = 5000

// fanoutCases reads --fanout (fanoutload.ParseCases): one case at least.
func fanoutCases(s string) ([]fanoutload.Case, error) {
	cs, err := fanoutload.ParseCases(s)
	if err == nil && len(cs) == 0 {
		err = errors.New("want at least one FOLLOWERS@RATE")
	}
	return cs, err
}

// fanoutTarget is how one system is followed and pushed to.
type fanoutTarget struct {
	url, path, ready string
	push             func(ctx context.Context, i int, payload []byte) error
	cpu              cpuMeter
	joined           func() (int, error) // followers the server counts; nil: the ready line says so
}

// fanouter is a system the fanout scenario can measure.
type fanouter interface {
	fanout(n int) fanoutTarget
}

// fanoutSample is one fanout measurement of one system.
type fanoutSample struct {
	counts   fanoutload.Counts
	p50, p99 float64
	cpuCost          // per 1,000 deliveries
	cliPer1k float64 // the follower processes' CPU (the load generator's), seconds per 1,000 deliveries
}

func (h *heraldSys) fanout(int) fanoutTarget {
	h.n++
	q := fmt.Sprintf("peers-fanout-%d", h.n)
	return fanoutTarget{url: h.url, path: "/api/v1/follow/queue/" + q, ready: ": connected", cpu: h.cpu,
		push: func(ctx context.Context, _ int, p []byte) error {
			return h.post(ctx, "/api/v1/push", fmt.Sprintf(`{"items":[{"queue":%q,"payload":%s}]}`, q, p))
		},
		joined: func() (int, error) {
			v, err := benchstat.Metric(h.http, h.url, "herald_followers")
			return int(v), err
		}}
}

func (s *centrifugeSys) fanout(int) fanoutTarget {
	s.n++
	channel := fmt.Sprintf("peers-fanout-%d", s.n)
	connect := fmt.Sprintf(`{"id":1,"connect":{"name":"peers","data":{"channel":%q}}}`, channel)
	return fanoutTarget{url: "http://" + s.ch.addr, path: "/connection/sse?cf_connect=" + url.QueryEscape(connect),
		ready: `data: {"id":1`, cpu: s.cpu,
		push: func(ctx context.Context, _ int, p []byte) error { return s.publish(ctx, channel, p) }}
}

// runFanoutRounds measures every case on every system able to, rounds
// interleaved.
func runFanoutRounds(ctx context.Context, cfg config, self string, round int, sys []system,
	res map[string]map[fanoutload.Case][]fanoutSample, log io.Writer) error {
	for _, c := range cfg.fanoutCases {
		for _, s := range sys {
			f, ok := s.(fanouter)
			if !ok {
				continue
			}
			fmt.Fprintf(log, "round %d/%d: %s fanout to %d SSE followers at %d msgs/s (load %s) … ", round, cfg.rounds,
				s.name(), c.Followers, c.Rate, fanoutload.LoadAverage())
			if err := keep(ctx, log, res, s.name(), c, func() (fanoutSample, error) {
				return fanoutOnce(ctx, cfg, self, f.fanout(c.Followers), c, log)
			}, func(sm fanoutSample) string {
				return fmt.Sprintf("%d/%d in order, %d out of order, %d lost, p50 %.1f ms, p99 %.1f ms, %.4f CPU s/1k (server %.4f; followers %.4f)",
					sm.counts.Received, sm.counts.Expected, sm.counts.Violations, sm.counts.Losses, sm.p50, sm.p99,
					sm.CPUPer1k, sm.ServerCPU, sm.cliPer1k)
			}); err != nil {
				return err
			}
		}
	}
	return nil
}

func fanoutOnce(ctx context.Context, cfg config, self string, t fanoutTarget, c fanoutload.Case, log io.Writer) (fanoutSample, error) {
	procs := (c.Followers + fanoutPerProcess - 1) / fanoutPerProcess
	total, warm := runLength(c.Rate, cfg.warm, cfg.fanoutDuration)
	fp, err := fanoutload.StartFollowers(ctx, []string{self, "child", "followers"}, procs, c.Followers, []string{t.url}, t.path,
		t.ready, warm, log)
	if err != nil {
		return fanoutSample{}, err
	}
	defer fp.Close()
	if t.joined != nil {
		for deadline := time.Now().Add(60 * time.Second); ; {
			n, err := t.joined()
			if err == nil && n == c.Followers {
				break
			}
			if time.Now().After(deadline) {
				return fanoutSample{}, fmt.Errorf("the server counts %d followers, want %d (%v)", n, c.Followers, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	time.Sleep(time.Second) // the connects settled
	s0, pg0 := t.cpu()
	c0 := fp.CPU()
	if _, err := fanoutload.PaceSequential(ctx, c.Rate, total, func(ctx context.Context, i int) error {
		return t.push(ctx, i, makePayload(i))
	}); err != nil {
		return fanoutSample{}, err
	}
	counts, err := fp.Finish(total)
	if err != nil {
		return fanoutSample{}, err
	}
	s1, pg1 := t.cpu()
	c1 := fp.CPU()
	sm := fanoutSample{counts: counts, p50: counts.Quantile(50), p99: counts.Quantile(99)}
	if counts.Received > 0 {
		n := float64(counts.Received)
		sm.cpuCost, sm.cliPer1k = costOf(s0, pg0, s1, pg1, n), per1k(c1-c0, n)
	}
	return sm, nil
}

// reportFanout writes the fanout table: medians over the rounds; the
// order counts are sums.
func reportFanout(b *strings.Builder, cfg config, sys []system, res map[string]map[fanoutload.Case][]fanoutSample) {
	fmt.Fprintf(b, "Fanout. Settings: N SSE clients follow one stream (Herald: GET /api/v1/follow/queue/{q}, a follow stream; "+
		"centrifuge: its SSE transport, GET /connection/sse with a server-side subscription, memory broker; floor: a bare "+
		"server writing each frame to every socket, one write(2) each over GOMAXPROCS goroutines, no storage: the least any "+
		"server can do on this machine; its frame is the size of Herald's follow event and a push is answered once queued, "+
		"as Herald answers once stored; floor-sync, when run, answers only once every socket is written, its frame the "+
		"payload alone), held by child processes of the benchmark (raw non-blocking sockets read by "+
		"GOMAXPROCS epoll loops per process, from 127.0.0.2–9); single-message "+
		"pushes of %d-byte payloads, one at a time, at the rate; %v warm-up then %v measured per run; %d rounds "+
		"interleaved, medians shown; every client checks it gets every message in push order. CPU is the server "+
		"process's user+system seconds (Herald: plus all processes of its PostgreSQL) from the first push to the last "+
		"receipt, per 1,000 deliveries (messages × followers).\n\n",
		payloadSize, cfg.warm, cfg.fanoutDuration, cfg.rounds)
	b.WriteString("| system | followers @ msgs/s | deliveries in order (all rounds) | out of order | lost | p50 / p99 ms | CPU s per 1,000 deliveries (server + PG) | ratio to Herald's CPU | followers' CPU s per 1,000 |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range cfg.fanoutCases {
		base := res["herald"][c]
		for _, s := range sys {
			ss := res[s.name()][c]
			if _, ok := s.(fanouter); !ok {
				continue
			}
			if len(ss) == 0 {
				fmt.Fprintf(b, "| %s | %v | failed | | | | | | |\n", s.name(), c)
				continue
			}
			var sum fanoutload.Counts
			for _, sm := range ss {
				sum.Add(sm.counts)
			}
			fmt.Fprintf(b, "| %s | %v | %d/%d | %d | %d | %.1f / %.1f | %s | %s | %.4f |\n", s.name(), c, sum.Received,
				sum.Expected, sum.Violations, sum.Losses, medianOf(ss, func(s fanoutSample) float64 { return s.p50 }),
				medianOf(ss, func(s fanoutSample) float64 { return s.p99 }), cpuCell(ss, 4),
				ratio(medianOf(ss, cpuOf[fanoutSample]), medianOf(base, cpuOf[fanoutSample])),
				medianOf(ss, func(s fanoutSample) float64 { return s.cliPer1k }))
		}
	}
}
