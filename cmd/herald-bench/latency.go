package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/heraldmq/herald/client"
	"github.com/heraldmq/herald/internal/benchstat"
)

// latencyPartitions spreads the pushes by default (--latency-partitions):
// a partition is leased to one consumer group at a time, so one partition
// measures how a busy partition keeps flowing while its earlier messages
// are unacked.
const latencyPartitions = 16

// latencyResult is one transport's push → receipt distribution.
type latencyResult struct {
	Setup      string  `json:"setup"` // "1 instance", "3 instances, syncnet on", …
	Wake       string  `json:"wake"`
	Transport  string  `json:"transport"`
	Rate       int     `json:"rate"`
	Pushed     int     `json:"pushed"`
	Received   int     `json:"received"`
	Duplicates int     `json:"duplicates"`
	P50        float64 `json:"p50_ms"`
	P90        float64 `json:"p90_ms"`
	P99        float64 `json:"p99_ms"`
	P999       float64 `json:"p999_ms"`
	Max        float64 `json:"max_ms"`
	Ack        string  `json:"ack"`
	ServerCPU  float64 `json:"server_cpu_percent"` // herald's CPU while pushing (100 = one core)
	// MachineBusy is how busy all of the machine's cores were while
	// pushing (100 = every core), whatever ran: a tail on a saturated
	// machine is the machine's.
	MachineBusy float64 `json:"machine_busy_percent"`
	// OthersBusy is the part of MachineBusy that no process of this
	// benchmark's own spent (herald-bench, the servers it started with
	// their PostgreSQL, and the --pid server's processes): a neighbour's
	// load, which the figures of a shared machine carry.
	OthersBusy float64 `json:"others_busy_percent"`
	// CPUPer1k is the CPU seconds herald and its PostgreSQL spent per
	// 1,000 messages, from the first push to the last receipt; 0 when
	// PostgreSQL's processes are not known (--url).
	CPUPer1k float64 `json:"cpu_s_per_1000"`
	// Partitions the pushes spread over.
	Partitions int `json:"partitions"`
	// StatementsPerMsg is the statements herald sent to PostgreSQL per
	// message pushed (herald_db_queries_total), from the first push to the
	// last receipt; 0 when its metrics cannot be read.
	StatementsPerMsg float64 `json:"statements_per_message"`
	// Counters are how much herald's counters of the delivery path
	// (benchCounters) moved from the first push to the last receipt; a
	// series the server does not export stays 0.
	Counters map[string]float64 `json:"counters,omitempty"`
	// StatementsByOp is StatementsPerMsg by operation (the op label of
	// herald_db_queries_total).
	StatementsByOp map[string]float64 `json:"statements_by_op,omitempty"`
}

// benchCounters are the herald series a latency run reports the change
// of: how its deliveries came (hand-offs, poll deliveries, cycles, claims).
var benchCounters = []string{
	"herald_handoffs_total",
	"herald_poll_deliveries_total",
	"herald_poll_cycles_total",
	"herald_poll_claims_total",
}

// counters reads benchCounters from srv (an unreadable one reads 0).
func counters(srv *server) map[string]float64 {
	out := map[string]float64{}
	for _, name := range benchCounters {
		v, _ := srv.metric(name)
		out[name] = v
	}
	return out
}

func runLatency(ctx context.Context, srv *server, cfg benchConfig, log io.Writer) ([]latencyResult, error) {
	var out []latencyResult
	transports := cfg.LatencyTransports
	if len(transports) == 0 {
		transports = []string{"ws", "sse", "longpoll"}
	}
	for _, tr := range transports {
		progress(log, "latency: %s consumer, %d msgs/s for %v", tr, cfg.Rate, cfg.Duration)
		res, err := latencyRun(ctx, srv.url, srv, cfg, tr)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", tr, err)
		}
		res.Setup, res.Wake = "1 instance", cfg.Wake
		progress(log, "latency: %s p50 %.2f ms, p99 %.2f ms, max %.2f ms (%d/%d received), %.2f statements/msg, %d partitions, machine %.0f%% busy (others %.0f%%)",
			tr, res.P50, res.P99, res.Max, res.Received, res.Pushed, res.StatementsPerMsg, res.Partitions, res.MachineBusy, res.OthersBusy)
		for _, name := range benchCounters {
			progress(log, "latency: %s %s %.0f", tr, name, res.Counters[name])
		}
		var b strings.Builder
		for _, op := range slices.Sorted(maps.Keys(res.StatementsByOp)) {
			fmt.Fprintf(&b, " %s=%.3f", op, res.StatementsByOp[op])
		}
		progress(log, "latency: %s statements/msg by op:%s", tr, b.String())
		out = append(out, res)
	}
	return out, nil
}

var httpClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 0}, Timeout: time.Minute}

// latencyRun pushes to pushURL and consumes from srv over transport.
func latencyRun(ctx context.Context, pushURL string, srv *server, cfg benchConfig, transport string) (latencyResult, error) {
	q := fmt.Sprintf("bench-lat-%s-%d", transport, time.Now().UnixNano())
	total := int(float64(cfg.Rate) * cfg.Duration.Seconds())
	warm := 2 * cfg.Rate // the first two seconds warm connections, caches and plans
	rec := benchstat.NewRecorder(0, warm)
	parts := cfg.LatencyPartitions
	if parts < 1 {
		parts = latencyPartitions
	}
	res := latencyResult{Transport: transport, Rate: cfg.Rate, Partitions: parts}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		switch transport {
		case "ws":
			res.Ack = "acks on the socket (SDK, batched)"
			consumeWS(cctx, srv.url, q, rec, ready)
		case "sse":
			res.Ack = "acks posted to /api/v1/ack/batch"
			consumeSSE(cctx, srv.url, q, rec, ready)
		case "longpoll":
			res.Ack = "pop wait=true, then ack batch"
			ready <- nil
			consumeLongPoll(cctx, srv.url, q, rec)
		}
	})
	if err := <-ready; err != nil {
		cancel()
		wg.Wait()
		return res, err
	}
	cpu0, t0 := srv.cpu(), time.Now()
	busy0, all0 := machineCPU()
	own0 := treeCPU(srv.ownRoots()...)
	pg0, pgKnown := srv.pgCPU()
	ops0, opsErr := benchstat.MetricByLabel(http.DefaultClient, srv.url, "herald_db_queries_total", "op")
	c0 := counters(srv)
	pushed, err := pace(ctx, pushURL, q, cfg.Rate, total, parts)
	res.Pushed = pushed
	res.ServerCPU = 100 * (srv.cpu() - cpu0).Seconds() / time.Since(t0).Seconds()
	if busy1, all1 := machineCPU(); all1 > all0 {
		res.MachineBusy = 100 * float64(busy1-busy0) / float64(all1-all0)
		own := treeCPU(srv.ownRoots()...) - own0
		res.OthersBusy = max(0, 100*float64(busy1-busy0-own)/float64(all1-all0))
	}
	if err != nil {
		cancel()
		wg.Wait()
		return res, err
	}
	// Wait for stragglers.
	deadline := time.Now().Add(10 * time.Second)
	for rec.Count() < pushed && time.Now().Before(deadline) {
		t := time.NewTimer(20 * time.Millisecond)
		<-t.C
	}
	// One scrape at each end: the total is the sum by op (every statement
	// has its op).
	if ops1, err := benchstat.MetricByLabel(http.DefaultClient, srv.url, "herald_db_queries_total", "op"); err == nil && opsErr == nil && pushed > 0 {
		res.StatementsByOp = map[string]float64{}
		for op, n := range ops1 {
			if d := n - ops0[op]; d > 0 {
				res.StatementsByOp[op] = d / float64(pushed)
				res.StatementsPerMsg += d / float64(pushed)
			}
		}
	}
	res.Counters = counters(srv)
	for name, v := range res.Counters {
		res.Counters[name] = v - c0[name]
	}
	if pg1, ok := srv.pgCPU(); ok && pgKnown && pushed > 0 {
		res.CPUPer1k = (srv.cpu() - cpu0 + pg1 - pg0).Seconds() * 1000 / float64(pushed)
	}
	cancel()
	wg.Wait()
	l := rec.Latencies()
	res.Received, res.Duplicates = l.Received, l.Duplicates
	res.P50, res.P90, res.P99, res.P999, res.Max = l.Ms(50), l.Ms(90), l.Ms(99), l.Ms(99.9), l.Ms(100)
	return res, nil
}

// pace pushes total single-message pushes at rate per second, spread over
// the partitions (benchstat.Pace: a pool of producers, so that one slow
// push does not delay the schedule).
func pace(ctx context.Context, url, q string, rate, total, partitions int) (int, error) {
	return benchstat.Pace(ctx, rate, total, func(ctx context.Context, i int) error {
		body := fmt.Sprintf(`{"items":[{"queue":%q,"partition":"p%d","payload":{"t":%d,"i":%d}}]}`,
			q, i%partitions, time.Now().UnixNano(), i)
		return post(ctx, url+"/api/v1/push", body, http.StatusCreated)
	})
}

func post(ctx context.Context, url, body string, want int) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := httpClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = res.Body.Close() }()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != want {
		return fmt.Errorf("POST %s: %d %s", url, res.StatusCode, b)
	}
	return nil
}

func consumeWS(ctx context.Context, url, q string, rec *benchstat.Recorder, ready chan<- error) {
	c, err := client.Dial(ctx, url, client.Options{})
	if err != nil {
		ready <- err
		return
	}
	defer func() { _ = c.Close() }()
	ready <- nil
	_ = c.Subscribe(ctx, client.SubscribeOptions{Queue: q, Batch: 100, MaxInFlight: 1000},
		func(_ context.Context, m *client.Message) error {
			rec.RecordJSON(m.Data, time.Now())
			return nil
		})
}

// consumeSSE reads a stream as a browser would and posts acks as they come.
func consumeSSE(ctx context.Context, url, q string, rec *benchstat.Recorder, ready chan<- error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/api/v1/sse/queue/"+q+"?batch=100&maxInFlight=1000", nil)
	if err != nil {
		ready <- err
		return
	}
	res, err := (&http.Client{}).Do(req)
	if err != nil {
		ready <- err
		return
	}
	defer func() { _ = res.Body.Close() }()
	ready <- nil
	acks := make(chan string, 4096)
	var wg sync.WaitGroup
	wg.Go(func() { ackLoop(ctx, url, acks) })
	defer wg.Wait()
	defer close(acks)
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("data: ")) {
			continue
		}
		now := time.Now()
		var m delivered
		if json.Unmarshal(line[len("data: "):], &m) != nil {
			continue
		}
		rec.RecordJSON(m.Data, now)
		acks <- m.ackItem()
	}
}

// delivered is the part of a delivered message (SSE event, pop) the
// consumers read.
type delivered struct {
	Data          json.RawMessage `json:"data"`
	TransactionID string          `json:"transactionId"`
	PartitionID   string          `json:"partitionId"`
	LeaseID       string          `json:"leaseId"`
}

// ackItem is the acknowledgement of m, as an element of /ack/batch.
func (m delivered) ackItem() string {
	b, _ := json.Marshal(map[string]string{"transactionId": m.TransactionID, "partitionId": m.PartitionID, "leaseId": m.LeaseID})
	return string(b)
}

// ackLoop posts whatever acks have accumulated, one batch at a time.
func ackLoop(ctx context.Context, url string, acks <-chan string) {
	for first := range acks {
		batch := []string{first}
	more:
		for len(batch) < 1000 {
			select {
			case a, ok := <-acks:
				if !ok {
					break more
				}
				batch = append(batch, a)
			default:
				break more
			}
		}
		_ = post(context.WithoutCancel(ctx), url+"/api/v1/ack/batch", `{"acknowledgments":[`+strings.Join(batch, ",")+`]}`, http.StatusOK)
	}
}

func consumeLongPoll(ctx context.Context, url, q string, rec *benchstat.Recorder) {
	for ctx.Err() == nil {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/api/v1/pop/queue/"+q+"?wait=true&timeout=5000&batch=100&partitions=16", nil)
		if err != nil {
			return
		}
		res, err := httpClient.Do(req)
		if err != nil {
			continue
		}
		now := time.Now()
		b, _ := io.ReadAll(res.Body)
		_ = res.Body.Close()
		if res.StatusCode != http.StatusOK {
			continue
		}
		var pop struct {
			Messages []delivered `json:"messages"`
		}
		if json.Unmarshal(b, &pop) != nil {
			continue
		}
		items := make([]string, len(pop.Messages))
		for i, m := range pop.Messages {
			rec.RecordJSON(m.Data, now)
			items[i] = m.ackItem()
		}
		if len(items) > 0 {
			_ = post(context.WithoutCancel(ctx), url+"/api/v1/ack/batch", `{"acknowledgments":[`+strings.Join(items, ",")+`]}`, http.StatusOK)
		}
	}
}
