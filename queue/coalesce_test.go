package queue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// echoRun stands in for the database: it answers each item with its
// transaction id, and records the batches it was given.
type echoRun struct {
	mu      sync.Mutex
	batches [][]string
	gate    chan struct{} // the first call waits on it
	entered chan struct{}
	once    sync.Once
}

func (e *echoRun) run(_ context.Context, items []PushItem) ([]PushResult, error) {
	first := false
	e.once.Do(func() { first = true })
	if first {
		close(e.entered)
		<-e.gate
	}
	var ids []string
	res := make([]PushResult, len(items))
	for i, it := range items {
		if it.TransactionID == "bad" && len(items) > 1 {
			return nil, errors.New("merged batch failed")
		}
		if it.TransactionID == "bad" {
			return nil, errors.New("bad request")
		}
		ids = append(ids, it.TransactionID)
		res[i] = PushResult{Index: i, TransactionID: it.TransactionID, Status: StatusQueued}
	}
	e.mu.Lock()
	e.batches = append(e.batches, ids)
	e.mu.Unlock()
	return res, nil
}

func TestPushCoalescer_MergesWaitingRequests(t *testing.T) {
	e := &echoRun{gate: make(chan struct{}), entered: make(chan struct{})}
	c := newPushCoalescer(1, e.run)
	ctx := context.Background()

	type result struct {
		res []PushResult
		err error
	}
	first := make(chan result, 1)
	go func() {
		r, err := c.do(ctx, pushReq{items: []PushItem{{TransactionID: "a0"}}})
		first <- result{r, err}
	}()
	<-e.entered // the first push is "in the database"

	const waiting = 5
	results := make([]chan result, waiting)
	for i := range results {
		results[i] = make(chan result, 1)
		go func() {
			items := []PushItem{{TransactionID: fmt.Sprintf("r%d-0", i)}, {TransactionID: fmt.Sprintf("r%d-1", i)}}
			if i == 3 {
				items = append(items, PushItem{TransactionID: "bad"})
			}
			r, err := c.do(ctx, pushReq{items: items})
			results[i] <- result{r, err}
		}()
	}
	// Wait until all five are queued behind the first.
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.queue) == waiting
	}, 5*time.Second, time.Millisecond)
	close(e.gate)

	r := <-first
	require.NoError(t, r.err)
	for i, ch := range results {
		r := <-ch
		if i == 3 {
			assert.Error(t, r.err, "the bad request fails on its own")
			continue
		}
		require.NoError(t, r.err, "request %d is not failed by its bad neighbour", i)
		require.Len(t, r.res, 2)
		for j, pr := range r.res {
			assert.Equal(t, j, pr.Index, "indexes are per request")
			assert.Equal(t, fmt.Sprintf("r%d-%d", i, j), pr.TransactionID, "each caller gets its own results")
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	// One batch for the first push; the merged batch failed (bad item) and
	// was retried request by request: four good singles.
	assert.Len(t, e.batches, 1+4)
}

func TestPushCoalescer_TakeRespectsLimits(t *testing.T) {
	c := newPushCoalescer(1, nil)
	big := make([]PushItem, coalesceMaxItems-1)
	queued := func(reqs ...pushReq) []*coalescedCall[pushReq, []PushResult] {
		out := make([]*coalescedCall[pushReq, []PushResult], len(reqs))
		for i, r := range reqs {
			out[i] = &coalescedCall[pushReq, []PushResult]{ctx: context.Background(), req: r}
		}
		return out
	}
	c.queue = queued(pushReq{items: big}, pushReq{items: make([]PushItem, 5)}, pushReq{items: make([]PushItem, 1)})
	assert.Len(t, c.take(), 1, "the next request would pass the item limit")
	assert.Len(t, c.take(), 2)
	c.queue = queued(pushReq{items: make([]PushItem, coalesceMaxItems+10)})
	assert.Len(t, c.take(), 1, "a request larger than the limit still runs")
	c.queue = queued(pushReq{items: make([]PushItem, 1), bytes: coalesceMaxBytes}, pushReq{items: make([]PushItem, 1), bytes: 1})
	assert.Len(t, c.take(), 1, "byte limit")
}

func TestAckCoalescer_TakeKeepsPairsApart(t *testing.T) {
	c := newAckCoalescer(1, nil)
	k := func(p string) consumerKey { return consumerKey{p, DefaultGroup} }
	req := func(name string, keys ...consumerKey) *coalescedCall[ackReq, []AckResult] {
		return &coalescedCall[ackReq, []AckResult]{ctx: context.Background(),
			req: ackReq{acks: []Ack{{TransactionID: name}}, keys: keys}}
	}
	names := func(batch []*coalescedCall[ackReq, []AckResult]) []string {
		var out []string
		for _, q := range batch {
			out = append(out, q.req.acks[0].TransactionID)
		}
		return out
	}
	c.queue = []*coalescedCall[ackReq, []AckResult]{
		req("a", k("p1")),
		req("b", k("p1")),          // shares p1 with a
		req("c", k("p2")),          // disjoint: joins a
		req("d", k("p3"), k("p1")), // shares p1
		req("e", k("p3")),          // shares p3 with d, which waits: waits behind it
		req("f"),                   // locks nothing
	}
	assert.Equal(t, []string{"a", "c", "f"}, names(c.take()))
	assert.Equal(t, []string{"b"}, names(c.take()), "d shares p1 with b")
	assert.Equal(t, []string{"d"}, names(c.take()), "e keeps its place behind d")
	assert.Equal(t, []string{"e"}, names(c.take()))
	assert.Empty(t, c.queue)

	big := &coalescedCall[ackReq, []AckResult]{ctx: context.Background(), req: ackReq{acks: make([]Ack, coalesceMaxItems)}}
	c.queue = []*coalescedCall[ackReq, []AckResult]{req("a", k("p1")), big, req("c", k("p2"))}
	assert.Equal(t, []string{"a"}, names(c.take()), "the item limit stops the batch")
	assert.Len(t, c.take(), 1, "a request at the limit runs alone")

	gone, cancel := context.WithCancel(context.Background())
	cancel()
	dropped := req("x", k("p1"))
	dropped.ctx = gone
	c.queue = []*coalescedCall[ackReq, []AckResult]{dropped, req("y", k("p1"))}
	assert.Equal(t, []string{"y"}, names(c.take()), "a call whose caller has gone is not run")
	assert.True(t, dropped.done)
	assert.ErrorIs(t, dropped.err, context.Canceled)
}
