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
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.ts.URL+path, nil)
		if err != nil {
			return
		}
		res, err := e.ts.Client().Do(req)
		if err != nil {
			return
		}
		defer func() { _ = res.Body.Close() }()
		b, _ := io.ReadAll(res.Body)
		out <- resp{status: res.StatusCode, header: res.Header, body: b}
	}()
	eventually(e.t, func() bool { return e.p.Intentions() > before }, "the long-poll never registered")
	return out
}

// receive waits for a long-poll's answer and expects one message.
func receive(t *testing.T, got <-chan resp, wantID string) {
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
			e.ts.URL+"/api/v1/pop/queue/gone?wait=true&timeout=300000&consumerGroup=gone", nil)
		if err != nil {
			done <- err
			return
		}
		res, err := e.ts.Client().Do(req)
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

// TestPop_Drain: Drain answers waiting long-polls 204 at once, and later
// long-polls do not wait; messages are still delivered.
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

	start = time.Now()
	e.popEmpty("/api/v1/pop/queue/drain?wait=true&timeout=60000")
	assert.Less(t, time.Since(start), 5*time.Second)
	pushed := e.push("drain", `{"d":1}`)
	got2 := e.pop("/api/v1/pop/queue/drain?wait=true&timeout=60000")
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
				e.ts.URL+"/api/v1/pop/queue/many?wait=true&timeout=10000&batch=10", nil)
			if !assert.NoError(t, err) {
				return
			}
			res, err := e.ts.Client().Do(req)
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
