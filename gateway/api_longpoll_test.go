package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/poller"
)

func TestPop_LongPollTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	start := time.Now()
	r := e.get("/api/v1/pop/queue/lp-empty?wait=true&timeout=300")
	elapsed := time.Since(start)
	assert.Equal(t, http.StatusNoContent, r.status, "%s", r)
	assert.Empty(t, r.body)
	assert.GreaterOrEqual(t, elapsed, 250*time.Millisecond)
	assert.Less(t, elapsed, 5*time.Second)

	// wait=1 is wait=true.
	start = time.Now()
	r = e.get("/api/v1/pop/queue/lp-empty?wait=1&timeout=300")
	assert.Equal(t, http.StatusNoContent, r.status, "%s", r)
	assert.GreaterOrEqual(t, time.Since(start), 250*time.Millisecond)
}

// waitingPop starts a long-poll in a goroutine and returns once the poller
// holds its intention. A push made after that can only reach it through a
// wake-up.
func (e *env) waitingPop(path string) <-chan resp {
	e.t.Helper()
	ctx := ctxT(e.t)
	before := e.p.Intentions()
	out := make(chan resp, 1)
	go func() {
		defer close(out)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.url+path, nil)
		if err != nil {
			return
		}
		res, err := e.client.Do(req)
		if err != nil {
			return
		}
		defer func() { _ = res.Body.Close() }()
		b, _ := io.ReadAll(res.Body)
		out <- resp{status: res.StatusCode, header: res.Header, body: b}
	}()
	var early *resp
	eventually(e.t, func() bool {
		select {
		case r, ok := <-out:
			if ok {
				early = &r
			}
			return true
		default:
		}
		return e.p.Intentions() > before
	}, "the long-poll never registered")
	if early != nil {
		e.t.Fatalf("the long-poll returned before it was seen waiting: %s", early)
	}
	return out
}

// quiet waits until the server has sent no statement for 300 ms (with a
// ceiling): the cycles that registrations started are over.
func (e *env) quiet() {
	e.t.Helper()
	last, since := e.scrape("herald_db_queries_total"), time.Now()
	eventually(e.t, func() bool {
		if n := e.scrape("herald_db_queries_total"); n != last {
			last, since = n, time.Now()
		}
		return time.Since(since) >= 300*time.Millisecond
	}, "no statement for 300 ms")
}

// receive waits for a long-poll's answer, expects one message (wantID,
// when set) and returns it.
func receive(t *testing.T, got <-chan resp, wantID string) message {
	t.Helper()
	var r resp
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("long-poll did not return")
	}
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	var p popResult
	require.NoError(t, json.Unmarshal(r.body, &p))
	require.Len(t, p.Messages, 1)
	if wantID != "" {
		assert.Equal(t, wantID, p.Messages[0].ID)
	}
	return p.Messages[0]
}

// TestPop_LongPollWakesOnPush: a waiting pop returns as soon as a message is
// pushed. The re-check tick is set far beyond the test, so only the wake-up
// can return it before its 10 s timeout.
func TestPop_LongPollWakesOnPush(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, body := range []string{`{"queue":"lp"}`, `{"queue":"lp-ns","namespace":"wake"}`, `{"queue":"lp-retry"}`} {
		r := e.post("/api/v1/configure", body)
		require.Equal(t, http.StatusOK, r.status, "%s", r)
	}

	t.Run("Queue", func(t *testing.T) {
		start := time.Now()
		got := e.waitingPop("/api/v1/pop/queue/lp?wait=true&timeout=10000&consumerGroup=w1")
		pushed := e.push("lp", `{"wake":1}`)
		receive(t, got, pushed[0].MessageID)
		assert.Less(t, time.Since(start), 5*time.Second, "returned at the timeout, not at the push")
	})
	t.Run("Partition", func(t *testing.T) {
		start := time.Now()
		// "new" mode: the message the Queue case left is not w2's.
		got := e.waitingPop("/api/v1/pop/queue/lp/partition/Default?wait=true&timeout=10000&consumerGroup=w2&subscriptionMode=new")
		pushed := e.push("lp", `{"wake":2}`)
		receive(t, got, pushed[0].MessageID)
		assert.Less(t, time.Since(start), 5*time.Second)
	})
	t.Run("Namespace", func(t *testing.T) {
		start := time.Now()
		got := e.waitingPop("/api/v1/pop?namespace=wake&wait=true&timeout=10000&consumerGroup=w3")
		pushed := e.push("lp-ns", `{"wake":"ns"}`)
		receive(t, got, pushed[0].MessageID)
		assert.Less(t, time.Since(start), 5*time.Second)
	})
	t.Run("Transaction", func(t *testing.T) {
		start := time.Now()
		got := e.waitingPop("/api/v1/pop/queue/lp-ns?wait=true&timeout=10000&consumerGroup=w4&subscriptionMode=new")
		r := e.post("/api/v1/transaction", `{"operations":[{"type":"push","items":[{"queue":"lp-ns","payload":{"tx":1}}]}]}`)
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		var res struct {
			Results []struct {
				MessageID string `json:"messageId"`
			} `json:"results"`
		}
		require.NoError(t, json.Unmarshal(r.body, &res))
		require.Len(t, res.Results, 1)
		receive(t, got, res.Results[0].MessageID)
		assert.Less(t, time.Since(start), 5*time.Second)
	})
	t.Run("RetryAck", func(t *testing.T) {
		// A message released by a retry ack is work again for a waiting
		// consumer of the same group. The first pop leases partition a; the
		// long-poll's first pop then registers the group on the (empty)
		// Default partition, which is how we know it is waiting.
		e.pushItems(`[{"queue":"lp-retry","partition":"a","payload":{"retry":1}}]`)
		first := e.pop("/api/v1/pop/queue/lp-retry/partition/a?consumerGroup=w5&wait=false")
		require.Len(t, first.Messages, 1)
		start := time.Now()
		got := e.waitingPop("/api/v1/pop/queue/lp-retry?wait=true&timeout=10000&consumerGroup=w5")
		a := e.ack(first.Messages[0], "retry", "")
		require.True(t, a.Success)
		require.True(t, a.LeaseReleased)
		receive(t, got, first.Messages[0].ID)
		assert.Less(t, time.Since(start), 5*time.Second)
	})
}

// TestPop_LongPollClientGone: a long-poll whose client disconnects ends at
// once, so the server can shut down without waiting for its timeout.
func TestPop_LongPollClientGone(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.post("/api/v1/configure", `{"queue":"gone"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet,
			e.url+"/api/v1/pop/queue/gone?wait=true&timeout=300000&consumerGroup=gone", nil)
		if err != nil {
			done <- err
			return
		}
		res, err := e.client.Do(req)
		if err == nil {
			_ = res.Body.Close()
		}
		done <- err
	}()
	eventually(t, func() bool { return e.p.Intentions() == 1 }, "the long-poll never registered")
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	eventually(t, func() bool { return e.p.Intentions() == 0 }, "the intention outlived its client")

	start := time.Now()
	e.ts.Close() // waits for outstanding requests
	assert.Less(t, time.Since(start), 5*time.Second)
}

// TestPop_Drain: Drain answers waiting long-polls 204 at once; a long-poll
// that comes later is refused 503 with Retry-After (it would wait on an
// instance going away: another instance serves it), and a pop that does
// not wait is still served.
func TestPop_Drain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.post("/api/v1/configure", `{"queue":"drain"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	start := time.Now()
	got := e.waitingPop("/api/v1/pop/queue/drain?wait=true&timeout=60000&consumerGroup=d1")
	e.srv.Drain()
	e.srv.Drain() // twice is fine
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("Drain did not end the long-poll")
	}
	assert.Equal(t, http.StatusNoContent, r.status, "%s", r)
	assert.Empty(t, r.body)
	assert.Less(t, time.Since(start), 5*time.Second)

	pushed := e.push("drain", `{"d":1}`)
	r = e.get("/api/v1/pop/queue/drain?wait=true&timeout=60000")
	assert.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r)
	assert.NotEmpty(t, r.header.Get("Retry-After"))
	got2 := e.pop("/api/v1/pop/queue/drain?wait=false")
	require.Len(t, got2.Messages, 1)
	assert.Equal(t, pushed[0].MessageID, got2.Messages[0].ID)
}

// TestPop_LongPollConcurrent: several consumers wait on one queue with one
// partition per consumer; every pushed message is delivered exactly once.
func TestPop_LongPollConcurrent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const n = 4
	var wg sync.WaitGroup
	results := make(chan resp, n)
	for range n {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctxT(t), http.MethodGet,
				e.url+"/api/v1/pop/queue/many?wait=true&timeout=10000&batch=10", nil)
			if !assert.NoError(t, err) {
				return
			}
			res, err := e.client.Do(req)
			if !assert.NoError(t, err) {
				return
			}
			defer func() { _ = res.Body.Close() }()
			var p json.RawMessage
			if res.StatusCode == http.StatusOK {
				assert.NoError(t, json.NewDecoder(res.Body).Decode(&p))
			}
			results <- resp{status: res.StatusCode, body: p}
		})
	}
	items := make([]string, n)
	for i := range n {
		items[i] = fmt.Sprintf(`{"queue":"many","partition":"p%d","payload":{"i":%d}}`, i, i)
	}
	e.pushItems("[" + strings.Join(items, ",") + "]")
	wg.Wait()
	close(results)
	seen := map[string]bool{}
	for r := range results {
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		var p popResult
		require.NoError(t, json.Unmarshal(r.body, &p))
		for _, m := range p.Messages {
			assert.False(t, seen[m.ID], "delivered twice: %s", m.ID)
			seen[m.ID] = true
		}
	}
	assert.Len(t, seen, n)
}

// TestPop_LongPollTimeoutAccuracy: the 204 comes within ±100 ms of timeout.
// Never early by more than that; late only when the machine is starved (the
// race detector with every package at once on 2 cores), so each timeout
// gets three tries at being on time.
func TestPop_LongPollTimeoutAccuracy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, timeout := range []time.Duration{200 * time.Millisecond, 700 * time.Millisecond, 1500 * time.Millisecond} {
		var tries []time.Duration
		for range 3 {
			start := time.Now()
			r := e.get(fmt.Sprintf("/api/v1/pop/queue/acc?wait=true&timeout=%d", timeout.Milliseconds()))
			elapsed := time.Since(start)
			assert.Equal(t, http.StatusNoContent, r.status, "%s", r)
			assert.Greater(t, elapsed, timeout-100*time.Millisecond, "timeout %v answered early, after %v", timeout, elapsed)
			tries = append(tries, elapsed)
			if elapsed < timeout+100*time.Millisecond {
				break
			}
		}
		assert.Less(t, tries[len(tries)-1], timeout+100*time.Millisecond, "timeout %v answered after %v", timeout, tries)
	}
}

// TestPop_LongPollDisconnectSwallowsNothing: a client that leaves takes
// nothing with it. Once the server has seen it go, a message pushed next is
// not leased to it but available at once to the next consumer (the lease
// time is 300 s, so nothing here waits for an expiry), with no attempt
// counted. Pushes racing the disconnect must never lose a message either:
// each one is either received by its client or still available.
func TestPop_LongPollDisconnectSwallowsNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	received := map[string]bool{}
	var mu sync.Mutex
	for i := 1; i < 20; i += 2 {
		r := e.post("/api/v1/configure", fmt.Sprintf(`{"queue":"leave-%d","options":{"leaseTime":1}}`, i))
		require.Equal(t, http.StatusOK, r.status, "%s", r)
	}
	for i := range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/api/v1/pop/queue/leave-%d?wait=true&timeout=10000", e.url, i), nil)
			res, err := e.client.Do(req)
			if err != nil {
				return
			}
			defer func() { _ = res.Body.Close() }()
			var p popResult
			if res.StatusCode == http.StatusOK && json.NewDecoder(res.Body).Decode(&p) == nil {
				mu.Lock()
				for _, m := range p.Messages {
					received[string(m.Data)] = true
				}
				mu.Unlock()
			}
		}()
		eventually(t, func() bool { return e.p.Intentions() == 1 }, "registered")
		payload := fmt.Sprintf(`{"i":%d}`, i)
		if i%2 == 0 {
			cancel()
			eventually(t, func() bool { return e.p.Intentions() == 0 }, "the server saw the client leave")
			e.push(fmt.Sprintf("leave-%d", i), payload)
		} else {
			e.push(fmt.Sprintf("leave-%d", i), payload)
			cancel()
		}
		<-done
		eventually(t, func() bool { return e.p.Intentions() == 0 }, "intention withdrawn")
	}
	available := map[string]bool{}
	for i := range 20 {
		r := e.get(fmt.Sprintf("/api/v1/pop/queue/leave-%d?wait=false&batch=100", i))
		if r.status == http.StatusOK {
			var p popResult
			require.NoError(t, json.Unmarshal(r.body, &p))
			for _, m := range p.Messages {
				available[string(m.Data)] = true
				// Pushed after its client left: never leased. A message
				// pushed before may have been written to its leaving client
				// and be back from its 1 s lease already, one attempt counted.
				if i%2 == 0 {
					assert.Equal(t, 0, m.RetryCount, "message %s", m.Data)
				}
			}
		}
	}
	for i := range 20 {
		payload := fmt.Sprintf(`{"i":%d}`, i)
		if i%2 == 0 {
			assert.True(t, available[payload], "message %s pushed after its client left was not available at once", payload)
		} else if !available[payload] && !received[payload] {
			// The server wrote the message to a client that was already
			// leaving: HTTP cannot tell. It is leased, not lost: it comes
			// back when the lease (1 s on these queues) expires.
			eventually(t, func() bool {
				r := e.get(fmt.Sprintf("/api/v1/pop/queue/leave-%d?wait=false", i))
				return r.status == http.StatusOK && strings.Contains(string(r.body), `"retryCount":1`)
			}, "message "+payload+" lost")
		}
	}
}

// scrape sums a metric family (all label sets) from /metrics.
func (e *env) scrape(name string) float64 {
	e.t.Helper()
	r := e.get("/metrics")
	require.Equal(e.t, http.StatusOK, r.status)
	sum := 0.0
	for _, line := range strings.Split(string(r.body), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		var v float64
		_, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
		require.NoError(e.t, err, line)
		sum += v
	}
	return sum
}

// TestPop_IdleLongPollsCostOnlyTheSweep: 1,000 concurrent long-polls on 10
// empty queues for 10 s cost at most the sweep's statements, counted by
// herald_db_queries_total (a pgx tracer sees every statement).
func TestPop_IdleLongPollsCostOnlyTheSweep(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const waiters, queues = 1000, 10
	ctx, cancel := context.WithCancel(context.Background())
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: waiters}}
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet,
				fmt.Sprintf("%s/api/v1/pop/queue/idle-%d?wait=true&timeout=60000", e.url, i%queues), nil)
			if res, err := client.Do(req); err == nil {
				_ = res.Body.Close()
			}
		})
	}
	defer func() {
		cancel()
		wg.Wait()
		client.CloseIdleConnections()
	}()
	eventually(t, func() bool { return e.scrape("herald_intentions") == waiters }, "all long-polls registered")
	e.quiet() // the registration cycles are over

	before := e.scrape("herald_db_queries_total")
	<-time.After(10 * time.Second) // the measured window itself
	spent := e.scrape("herald_db_queries_total") - before
	// Idle, each of the 2 workers sweeps every 5 s ±10%: at most 3 times in
	// 10 s, one pre-flight each (10 queues are far below the split size).
	t.Logf("%d idle long-polls on %d queues, 10 s: %v statements", waiters, queues, spent)
	assert.LessOrEqual(t, spent, float64(2*3))
	assert.Equal(t, float64(waiters), e.scrape("herald_intentions"), "all still waiting")
}

// A long-poll with autoAck and partitions=N claims several partitions at
// once, and leaves no lease behind.
func TestPop_LongPollAutoAckMultiPartition(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	got := e.waitingPop("/api/v1/pop/queue/lpmulti?wait=true&timeout=10000&autoAck=true&partitions=3&batch=10")
	e.pushItems(`[{"queue":"lpmulti","partition":"a","payload":1},{"queue":"lpmulti","partition":"b","payload":2},` +
		`{"queue":"lpmulti","partition":"c","payload":3}]`)
	var r resp
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("long-poll did not return")
	}
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	var p popResult
	require.NoError(t, json.Unmarshal(r.body, &p))
	assert.Empty(t, p.LeaseID)
	total := len(p.Messages)
	// A push wakes per partition, so one delivery may hold one or all three;
	// the rest is available to the next pop at once (autoAck left no lease).
	for total < 3 {
		more := e.pop("/api/v1/pop/queue/lpmulti?wait=true&timeout=5000&autoAck=true&partitions=3&batch=10")
		total += len(more.Messages)
	}
	assert.Equal(t, 3, total)
	e.popEmpty("/api/v1/pop/queue/lpmulti?wait=false&partitions=3&batch=10")
}

// On a queue with windowBuffer, partitions pushed to more
// often than the window filled the pre-flight's range, so a partition past
// its window behind them was never offered to a waiting consumer while the
// pushes went on (an HTTP pop without wait found it). A long-poll must get
// it within its timeout.
func TestPop_LongPollWindowedPartitionsDoNotStarveAQuietOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.post("/api/v1/configure", `{"queue":"winq","options":{"windowBuffer":1}}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	// busy-a and busy-b come first in the index (created first).
	e.pushItems(`[{"queue":"winq","partition":"busy-a","payload":{"n":0}},{"queue":"winq","partition":"busy-b","payload":{"n":0}}]`)
	e.pushItems(`[{"queue":"winq","partition":"quiet","payload":{"quiet":true}}]`)

	stop := make(chan struct{})
	pushed := make(chan struct{})
	go func() {
		defer close(pushed)
		tick := time.NewTicker(150 * time.Millisecond) // well inside the 1 s window
		defer tick.Stop()
		for n := 1; ; n++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			e.pushItems(fmt.Sprintf(`[{"queue":"winq","partition":"busy-a","payload":{"n":%d}},{"queue":"winq","partition":"busy-b","payload":{"n":%d}}]`, n, n))
		}
	}()
	defer func() { close(stop); <-pushed }()

	// The quiet partition's window ends 1 s after its push; the busy ones'
	// never do while the pushes go on, unless a push comes late on a
	// loaded machine: then a busy one's messages may come first, and the
	// consumer asks again. Starved, the quiet one never comes.
	var delivered []string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		got := e.get("/api/v1/pop/queue/winq?wait=true&timeout=6000&consumerGroup=g&batch=10")
		if got.status == http.StatusNoContent {
			continue
		}
		require.Equal(t, http.StatusOK, got.status, "%s", got)
		var body struct {
			Messages []struct {
				Partition string          `json:"partition"`
				Data      json.RawMessage `json:"data"`
			} `json:"messages"`
		}
		require.NoError(t, json.Unmarshal(got.body, &body))
		for _, m := range body.Messages {
			if m.Partition == "quiet" {
				return
			}
			delivered = append(delivered, m.Partition)
		}
	}
	t.Fatalf("the quiet partition was not delivered while the others were pushed to (delivered: %v)", delivered)
}

// A waiting long-poll is answered by the push itself (the hand-off, as a
// subscription is): the push leases it the message in its own
// transaction, and no pre-flight or pop runs for it. Its lease is real:
// the ack completes it.
func TestPop_WaitingLongPollIsHandedThePush(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// A first message, popped and acked: the group's row exists and is
	// caught up.
	e.push("lp-hand", `{"n":0}`)
	first := e.pop("/api/v1/pop/queue/lp-hand?wait=false")
	require.Len(t, first.Messages, 1)
	require.True(t, e.ack(first.Messages[0], "completed", "").Success)
	got := e.waitingPop("/api/v1/pop/queue/lp-hand?wait=true&timeout=10000&batch=10")
	e.quiet() // its registration's cycle is over
	count := func(op string) float64 { return e.scrape(`herald_db_queries_total{op="` + op + `"}`) }
	handoffs, preflights, pops := e.scrape("herald_handoffs_total"), count("preflight"), count("pop_assigned")

	pushed := e.push("lp-hand", `{"n":1}`)
	m := receive(t, got, pushed[0].MessageID)
	assert.NotEmpty(t, m.LeaseID)
	assert.Equal(t, handoffs+1, e.scrape("herald_handoffs_total"), "handed off by the push")
	assert.Equal(t, preflights, count("preflight"), "no pre-flight")
	assert.Equal(t, pops, count("pop_assigned"), "no pop")
	assert.True(t, e.ack(m, "completed", "").Success)
	e.popEmpty("/api/v1/pop/queue/lp-hand?wait=false")
}

// A long-poll client asks again once it has acked its answer. That answer
// drained the queue, so the poller knows that what can wait for the next
// long-poll is what was pushed (or given back) since: the next one is
// served from that as a push serves a waiting one, by one pop with no
// pre-flight (each ran a pre-flight and a pop: at 1,000 msgs/s a
// long-poll's p50 was 4.5 ms on one partition, 10.5 ms on 16).
func TestPop_LongPollAfterAnAckedAnswerIsServedWithoutPreflight(t *testing.T) {
	t.Parallel()
	// The sweep, which forgets what the poller knows, is out of the test.
	e := newEnvPolling(t, func(c *poller.Config) { c.SweepMin, c.SweepMax = time.Minute, time.Minute })
	const path = "/api/v1/pop/queue/lp-again?wait=true&timeout=10000&batch=10"
	e.push("lp-again", `{"n":1}`)
	first := e.pop(path)
	require.Len(t, first.Messages, 1)
	pushed := e.push("lp-again", `{"n":2}`) // while its lease is held: nobody waits
	require.True(t, e.ack(first.Messages[0], "completed", "").Success)
	e.quiet()
	count := func(op string) float64 { return e.scrape(`herald_db_queries_total{op="` + op + `"}`) }
	preflights, pops := count("preflight"), count("pop_assigned")

	next := e.pop(path)
	require.Len(t, next.Messages, 1)
	assert.Equal(t, pushed[0].MessageID, next.Messages[0].ID)
	e.quiet()
	assert.Equal(t, preflights, count("preflight"), "no pre-flight")
	assert.Equal(t, pops+1, count("pop_assigned"), "one pop")
	require.True(t, e.ack(next.Messages[0], "completed", "").Success)
	e.popEmpty("/api/v1/pop/queue/lp-again?wait=false")
}

// A long-poll is served, within its wait, a young message queued behind
// many older than the queue's ttl: a pop skips only so many expired
// messages (and delivers nothing then), and the poller looks again at once
// rather than at its next sweep (one sweep per 8 expired messages: with
// 400 ahead, 16 s or so, past its wait).
func TestLongPoll_YoungMessageBehindManyExpiredIsServedWithinTheWait(t *testing.T) {
	e := newEnv(t)
	r := e.post("/api/v1/configure", `{"queue":"ttlb","options":{"ttl":60}}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	old := make([]string, 400)
	for i := range old {
		old[i] = fmt.Sprintf(`{"n":%d}`, i)
	}
	e.push("ttlb", old...)
	e.exec(`UPDATE messages SET created_at = created_at - interval '2 minutes'`)
	e.push("ttlb", `{"n":"young"}`)
	lp := e.pop("/api/v1/pop/queue/ttlb?wait=true&timeout=10000&batch=1")
	require.Len(t, lp.Messages, 1)
	assert.JSONEq(t, `{"n":"young"}`, string(lp.Messages[0].Data))
}
