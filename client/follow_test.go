package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/client"
)

// follower runs Follow in a goroutine and hands over what it receives.
type follower struct {
	t      *testing.T
	msgs   chan *client.Message
	gaps   chan client.Gap
	errc   chan error
	cancel context.CancelFunc
}

func startFollow(t *testing.T, c *client.Client, opts client.FollowOptions) *follower {
	t.Helper()
	ctx, cancel := context.WithCancel(ctxT(t))
	f := &follower{t: t, msgs: make(chan *client.Message, 1000), gaps: make(chan client.Gap, 10),
		errc: make(chan error, 1), cancel: cancel}
	opts.OnGap = func(g client.Gap) { f.gaps <- g }
	go func() {
		f.errc <- c.Follow(ctx, opts, func(_ context.Context, m *client.Message) error {
			f.msgs <- m
			return nil
		})
	}()
	t.Cleanup(cancel)
	return f
}

// next returns the next message's payload (an int).
func (f *follower) next() (int, *client.Message) {
	f.t.Helper()
	select {
	case m := <-f.msgs:
		v, err := strconv.Atoi(string(m.Data))
		require.NoError(f.t, err)
		require.NotEmpty(f.t, m.EventID, "every followed message names its position")
		return v, m
	case err := <-f.errc:
		f.t.Fatalf("Follow returned %v", err)
	case <-time.After(20 * time.Second):
		f.t.Fatal("no message within 20 s")
	}
	return 0, nil
}

// receive checks that the next payloads are want, in this order: a lost
// message or a duplicate breaks the sequence.
func (f *follower) receive(want ...int) {
	f.t.Helper()
	for _, w := range want {
		v, _ := f.next()
		require.Equal(f.t, w, v, "in order, none lost, none twice")
	}
}

func (f *follower) stop() error {
	f.cancel()
	select {
	case err := <-f.errc:
		return err
	case <-time.After(10 * time.Second):
		return fmt.Errorf("Follow did not return")
	}
}

// followers is this server's follower count of queue (the status route).
func (h *herald) followers(t *testing.T, queue string) int {
	var st struct {
		Followers map[string]int `json:"followers"`
	}
	h.get(t, "/internal/api/status", &st)
	return st.Followers[queue]
}

// pushTo pushes vals in one request, to partition p (or, with p "", to
// p0 and p1 by parity).
func pushTo(t *testing.T, c *client.Client, q, p string, vals ...int) {
	t.Helper()
	items := make([]client.PushItem, len(vals))
	for i, v := range vals {
		part := p
		if part == "" {
			part = "p" + strconv.Itoa(v%2)
		}
		items[i] = client.PushItem{Queue: q, Partition: part, Payload: v}
	}
	_, err := c.Push(ctxT(t), items...)
	require.NoError(t, err)
}

// Every follower gets every message (no group shares them out), each
// partition's in offset order, all in one order the same for every
// follower, with what was stored before the follow from the beginning.
func TestFollow_EveryFollowerReceivesEveryMessageInOrder(t *testing.T) {
	t.Parallel()
	const q = "sdk-follow"
	c := dial(t, shared, client.Options{})
	pushTo(t, c, q, "", 1, 2, 3)
	a := startFollow(t, c, client.FollowOptions{Queue: q, From: "beginning"})
	b := startFollow(t, dial(t, shared, client.Options{}), client.FollowOptions{Queue: q, From: "beginning"})
	for i := 4; i <= 12; i += 3 {
		pushTo(t, c, q, "", i, i+1, i+2)
	}
	var orders [2][]string
	for k, f := range []*follower{a, b} {
		seen := map[int]bool{}
		last := map[string]int64{}
		for range 12 {
			v, m := f.next()
			assert.False(t, seen[v], "message %d twice", v)
			seen[v] = true
			assert.Greater(t, m.Offset, last[m.Partition], "partition order")
			last[m.Partition] = m.Offset
			assert.Empty(t, m.LeaseID)
			assert.Empty(t, m.ConsumerGroup)
			orders[k] = append(orders[k], m.EventID)
		}
		assert.Len(t, seen, 12)
	}
	assert.Equal(t, orders[0], orders[1], "one order for every follower")
	require.NoError(t, a.stop())
	require.NoError(t, b.stop())
}

// The server restarts twice: once before the follow's first message (it
// resumes after the start the server named, not at a new "now"), once
// mid-stream (after its last event id). What was pushed meanwhile, through
// another instance, arrives: none lost, none twice, in order.
func TestFollow_ResumesAcrossRestartsWithNoLossNoDuplicate(t *testing.T) {
	t.Parallel()
	const q = "sdk-follow-restart"
	s := newHerald(t)
	var states = make(chan client.StateKind, 100)
	c := dial(t, s, client.Options{OnState: func(st client.State) { states <- st.Kind }})
	other := dial(t, shared, client.Options{})
	f := startFollow(t, c, client.FollowOptions{Queue: q}) // from now
	require.Eventually(t, func() bool { return s.followers(t, q) == 1 }, 10*time.Second, 10*time.Millisecond)

	require.NoError(t, s.stop())
	pushTo(t, other, q, "p", 1, 2, 3) // pushed while the follower is cut off
	require.NoError(t, s.start(), "restarting on %s", s.addr)
	f.receive(1, 2, 3)

	require.NoError(t, s.stop())
	pushTo(t, other, q, "p", 4, 5)
	require.NoError(t, s.start(), "restarting on %s", s.addr)
	pushTo(t, other, q, "p", 6)
	f.receive(4, 5, 6)
	pushTo(t, c, q, "p", 7)
	f.receive(7)
	select {
	case m := <-f.msgs:
		t.Fatalf("unexpected message %s", m.Data)
	default:
	}
	require.NoError(t, f.stop())
	reconnects := 0
	for len(states) > 0 {
		if <-states == client.StateReconnecting {
			reconnects++
		}
	}
	assert.GreaterOrEqual(t, reconnects, 2, "the connection was cut twice")
}

// A follow that comes back after retention deleted messages it had not
// received is told (OnGap), before the messages after them.
func TestFollow_RetentionGapIsSurfaced(t *testing.T) {
	t.Parallel()
	const q = "sdk-follow-gap"
	s := newHerald(t, "--retention-interval", "200ms")
	s.post(t, "/api/v1/configure", `{"queue":"`+q+`","options":{"retentionEnabled":true,"retentionSeconds":1}}`)
	c := dial(t, s, client.Options{})
	pushTo(t, c, q, "p", 1, 2, 3)
	f := startFollow(t, c, client.FollowOptions{Queue: q, From: "beginning"})
	_, first := f.next()
	require.NoError(t, f.stop())
	// Retention deletes all three.
	require.Eventually(t, func() bool {
		res, err := http.Get(s.url() + "/api/v1/follow/queue/" + url.PathEscape(q) + "?from=beginning&wait=false")
		require.NoError(t, err)
		var page struct {
			Messages []any `json:"messages"`
		}
		_ = json.NewDecoder(res.Body).Decode(&page)
		_ = res.Body.Close()
		return res.StatusCode == http.StatusNoContent || res.StatusCode == http.StatusOK && len(page.Messages) == 0
	}, 20*time.Second, 100*time.Millisecond, "retention deleted the messages")
	pushTo(t, c, q, "p", 4)

	g := startFollow(t, c, client.FollowOptions{Queue: q, From: first.EventID})
	select {
	case gap := <-g.gaps:
		assert.NotEmpty(t, gap.GoneThrough)
	case <-time.After(20 * time.Second):
		t.Fatal("no gap reported")
	}
	v, m := g.next()
	assert.Equal(t, 4, v, "then what is still stored")
	assert.NotEqual(t, first.EventID, m.EventID)
	require.NoError(t, g.stop())
}

// A follow the server refuses (no consume rights) ends with its error.
func TestFollow_RefusedFollowReturnsTheServerError(t *testing.T) {
	t.Parallel()
	c := dial(t, shared, client.Options{})
	err := c.Follow(ctxT(t), client.FollowOptions{Queue: "sdk-follow", From: "f1nope"},
		func(context.Context, *client.Message) error { return nil })
	var se *client.ServerError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, "bad_request", se.Code)
}
