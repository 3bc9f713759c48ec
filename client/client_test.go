package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/client"
)

func dial(t *testing.T, s *herald, opts client.Options) *client.Client {
	t.Helper()
	if opts.MinBackoff == 0 {
		opts.MinBackoff, opts.MaxBackoff = 20*time.Millisecond, 200*time.Millisecond
	}
	c, err := client.Dial(ctxT(t), s.url(), opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func push(t *testing.T, c *client.Client, q string, from, n int) {
	t.Helper()
	items := make([]client.PushItem, n)
	for i := range items {
		items[i] = client.PushItem{Queue: q, Payload: from + i}
	}
	res, err := c.Push(ctxT(t), items...)
	require.NoError(t, err)
	require.Len(t, res, n)
}

// cursor is how far the queue-mode consumer of queue has acknowledged.
func cursor(t *testing.T, s *herald, queue string) int {
	return s.groupPositions(t, queue)["__QUEUE_MODE__"].Cursor
}

// collect subscribes until n messages arrived and returns their payloads.
func collect(t *testing.T, c *client.Client, opts client.SubscribeOptions, n int, h client.Handler) []int {
	t.Helper()
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	var mu sync.Mutex
	var got []int
	errc := make(chan error, 1)
	go func() {
		errc <- c.Subscribe(ctx, opts, func(ctx context.Context, m *client.Message) error {
			v, err := strconv.Atoi(string(m.Data))
			require.NoError(t, err)
			var herr error
			if h != nil {
				herr = h(ctx, m)
			}
			mu.Lock()
			got = append(got, v)
			if len(got) == n {
				cancel()
			}
			mu.Unlock()
			return herr
		})
	}()
	select {
	case err := <-errc:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("subscription did not receive everything")
	}
	mu.Lock()
	defer mu.Unlock()
	return got
}

func seq(from, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

func TestSubscribe_AcksOnNil(t *testing.T) {
	t.Parallel()
	s := shared
	c := dial(t, s, client.Options{})
	push(t, c, "sdk-ack", 1, 20)
	got := collect(t, c, client.SubscribeOptions{Queue: "sdk-ack", Batch: 5}, 20, nil)
	assert.Equal(t, seq(1, 20), got)
	require.Eventually(t, func() bool { return cursor(t, s, "sdk-ack") == 20 }, 10*time.Second, 10*time.Millisecond,
		"every message acknowledged")
}

func TestSubscribe_ErrorFailsThenDLQ(t *testing.T) {
	t.Parallel()
	s := shared
	c := dial(t, s, client.Options{})
	s.post(t, `/api/v1/configure`, `{"queue":"sdk-fail","options":{"retryLimit":2}}`)
	push(t, c, "sdk-fail", 1, 2)
	var retries []int
	got := collect(t, c, client.SubscribeOptions{Queue: "sdk-fail", Batch: 1}, 4, func(_ context.Context, m *client.Message) error {
		if string(m.Data) == "1" {
			retries = append(retries, m.RetryCount)
			return errors.New("cannot process 1")
		}
		return nil
	})
	// 1 is tried three times (retry limit 2) and dead-lettered; then 2.
	assert.Equal(t, []int{1, 1, 1, 2}, got)
	assert.Equal(t, []int{0, 1, 2}, retries)
	var dlq struct {
		Messages []struct {
			ErrorMessage string `json:"errorMessage"`
			Data         json.RawMessage
		} `json:"messages"`
	}
	s.get(t, "/api/v1/dlq?queue=sdk-fail", &dlq)
	require.Len(t, dlq.Messages, 1)
	assert.Contains(t, fmt.Sprint(dlq), "cannot process 1")
}

func TestSubscribe_ManualAck(t *testing.T) {
	t.Parallel()
	s := shared
	c := dial(t, s, client.Options{})
	push(t, c, "sdk-manual", 1, 2)
	first := true
	got := collect(t, c, client.SubscribeOptions{Queue: "sdk-manual", Batch: 1, ManualAck: true}, 3,
		func(ctx context.Context, m *client.Message) error {
			if string(m.Data) == "1" && first {
				first = false
				return m.Settle(ctx, client.StatusRetry, "") // again, without counting
			}
			return m.Ack(ctx)
		})
	assert.Equal(t, []int{1, 1, 2}, got)
	require.Eventually(t, func() bool { return cursor(t, s, "sdk-manual") == 2 }, 10*time.Second, 10*time.Millisecond)
}

func TestSubscribe_AutoAckAndGroups(t *testing.T) {
	t.Parallel()
	s := shared
	c := dial(t, s, client.Options{})
	push(t, c, "sdk-groups", 1, 5)
	for _, g := range []string{"a", "b"} {
		got := collect(t, c, client.SubscribeOptions{Queue: "sdk-groups", ConsumerGroup: g, AutoAck: true}, 5, nil)
		assert.Equal(t, seq(1, 5), got, "group %s", g)
	}
}

// The server restarts: the client reconnects by itself, resubscribes, and
// receives what was pushed while it was down; nothing is missed, order
// holds.
func TestReconnect_ServerRestart(t *testing.T) {
	t.Parallel()
	s := newHerald(t)
	var mu sync.Mutex
	var states []client.StateKind
	c := dial(t, s, client.Options{OnState: func(st client.State) {
		mu.Lock()
		states = append(states, st.Kind)
		mu.Unlock()
	}})
	push(t, c, "sdk-restart", 1, 5)

	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	got := make(chan int, 100)
	errc := make(chan error, 1)
	go func() {
		errc <- c.Subscribe(ctx, client.SubscribeOptions{Queue: "sdk-restart", Batch: 2},
			func(_ context.Context, m *client.Message) error {
				v, _ := strconv.Atoi(string(m.Data))
				got <- v
				return nil
			})
	}()
	seen := map[int]int{}
	last := 0
	receive := func(upTo int) {
		t.Helper()
		for last < upTo {
			select {
			case v := <-got:
				seen[v]++
				if seen[v] == 1 {
					require.Equal(t, last+1, v, "in order")
					last = v
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("received up to %d of %d", last, upTo)
			}
		}
	}
	receive(5)
	require.NoError(t, s.stop())
	// Pushed while this server is down, through another instance on the
	// same database.
	push(t, dial(t, shared, client.Options{}), "sdk-restart", 6, 5)
	require.NoError(t, s.start(), "restarting on %s", s.addr)
	receive(10)
	cancel()
	require.NoError(t, <-errc)
	mu.Lock()
	assert.Contains(t, states, client.StateReconnecting)
	assert.Equal(t, client.StateConnected, states[len(states)-1])
	mu.Unlock()
	for v, n := range seen {
		if n > 1 {
			t.Logf("message %d delivered %d times (at-least-once)", v, n)
		}
	}
}

// closeUnauthorized is the server's close code for a missing, bad or
// expired token (gateway.CloseUnauthorized).
const closeUnauthorized = 4501

func TestAuth_BadTokenIsTerminal(t *testing.T) {
	t.Parallel()
	const secret = "0123456789abcdef0123456789abcdef"
	s := newHerald(t, "--auth-secret", secret)
	bad := dial(t, s, client.Options{Token: "not-a-token"})
	err := bad.Subscribe(ctxT(t), client.SubscribeOptions{Queue: "sdk-auth"}, func(context.Context, *client.Message) error { return nil })
	var ce *client.CloseError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, closeUnauthorized, ce.Code)
	assert.True(t, ce.Terminal())

	good := dial(t, s, client.Options{Token: signToken(t, secret, "sdk", "read-write", time.Hour)})
	push(t, good, "sdk-auth", 1, 1)
	reader := dial(t, s, client.Options{Token: signToken(t, secret, "r", "read-only", time.Hour)})
	_, err = reader.Push(ctxT(t), client.PushItem{Queue: "sdk-auth", Payload: 1})
	var he *client.HTTPError
	require.ErrorAs(t, err, &he)
	assert.Equal(t, http.StatusForbidden, he.Status)
	// Consuming leases: read-write, as the reference server's roles.
	consumer := dial(t, s, client.Options{Token: signToken(t, secret, "c", "read-write", time.Hour)})
	var sub *string
	collect(t, consumer, client.SubscribeOptions{Queue: "sdk-auth"}, 1, func(_ context.Context, m *client.Message) error {
		sub = m.ProducerSub
		return nil
	})
	require.NotNil(t, sub)
	assert.Equal(t, "sdk", *sub)
}

func TestPush_Duplicates(t *testing.T) {
	t.Parallel()
	s := shared
	c := dial(t, s, client.Options{})
	res, err := c.Push(ctxT(t), client.PushItem{Queue: "sdk-dup", Payload: map[string]int{"n": 1}, TransactionID: "t1"},
		client.PushItem{Queue: "sdk-dup", Payload: json.RawMessage(`{"n":2}`), TransactionID: "t1"})
	require.NoError(t, err)
	assert.Equal(t, "queued", res[0].Status)
	assert.Equal(t, "duplicate", res[1].Status)

	_, err = c.Push(ctxT(t), client.PushItem{Queue: ""})
	var he *client.HTTPError
	require.ErrorAs(t, err, &he)
	assert.Equal(t, http.StatusBadRequest, he.Status)
}

func TestClient_SubscribeAndFollowOnAClosedClientReturnErrClosed(t *testing.T) {
	t.Parallel()
	s := newHerald(t)
	c := dial(t, s, client.Options{})
	require.NoError(t, c.Close())
	noop := func(context.Context, *client.Message) error { return nil }
	for name, start := range map[string]func() error{
		"subscribe": func() error { return c.Subscribe(ctxT(t), client.SubscribeOptions{Queue: "sdk-closed"}, noop) },
		"follow":    func() error { return c.Follow(ctxT(t), client.FollowOptions{Queue: "sdk-closed"}, noop) },
	} {
		done := make(chan error, 1)
		go func() { done <- start() }()
		select {
		case err := <-done:
			assert.ErrorIs(t, err, client.ErrClosed, name)
		case <-time.After(10 * time.Second):
			t.Fatalf("%s on a closed client did not return", name)
		}
	}
}
