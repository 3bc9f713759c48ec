package queue

import (
	"context"
	"sync"
	"time"
)

// Coalescing limits. One merged push takes at most this many items and
// payload bytes (but always at least one whole request), so a statement
// stays well under Postgres' 1 GB message limit and one slow giant request
// does not hold small ones for long.
const (
	coalesceMaxItems = 2000
	coalesceMaxBytes = 4 << 20
	// coalesceTimeout bounds a merged push: it runs on behalf of several
	// callers, so no single caller's context may cancel it.
	coalesceTimeout = 30 * time.Second
)

// pushCoalescer merges push requests that arrive while earlier ones are in
// the database into one transaction (group commit). With no contention a
// request runs at once, alone; under load, N waiting requests cost one
// round trip instead of N, and each partition's row lock is taken once.
//
// There is no goroutine of its own: callers take turns flushing the queue
// from its head, at most `flushers` at a time, until their own request has
// been run. A caller flushes only batches that are ahead of or include its
// own request, so its wait is bounded.
//
// Merging keeps each request's semantics: items keep their order, requests
// are numbered in arrival order, a transactionId seen earlier in the merged
// batch is a duplicate, exactly as if the requests had run one after
// another. If a merged push fails, each request is retried on its own, so
// one bad request cannot fail its neighbours.
type pushCoalescer struct {
	run      func(ctx context.Context, items []PushItem) ([]PushResult, error)
	flushers int

	mu      sync.Mutex
	cond    *sync.Cond
	queue   []*pushCall
	running int
}

type pushCall struct {
	items []PushItem
	bytes int
	res   []PushResult
	err   error
	done  bool
}

func newPushCoalescer(flushers int, run func(context.Context, []PushItem) ([]PushResult, error)) *pushCoalescer {
	c := &pushCoalescer{run: run, flushers: flushers}
	c.cond = sync.NewCond(&c.mu)
	return c
}

func (c *pushCoalescer) push(ctx context.Context, items []PushItem) ([]PushResult, error) {
	call := &pushCall{items: items}
	for _, it := range items {
		call.bytes += len(it.Payload)
	}
	c.mu.Lock()
	c.queue = append(c.queue, call)
	for !call.done {
		if c.running < c.flushers && len(c.queue) > 0 {
			batch := c.take()
			c.running++
			c.mu.Unlock()
			c.flush(ctx, batch)
			c.mu.Lock()
			c.running--
			c.cond.Broadcast()
			continue
		}
		c.cond.Wait()
	}
	c.mu.Unlock()
	return call.res, call.err
}

// take removes a batch from the head of the queue. Called with mu held.
func (c *pushCoalescer) take() []*pushCall {
	n, items, bytes := 0, 0, 0
	for n < len(c.queue) {
		q := c.queue[n]
		if n > 0 && (items+len(q.items) > coalesceMaxItems || bytes+q.bytes > coalesceMaxBytes) {
			break
		}
		items += len(q.items)
		bytes += q.bytes
		n++
	}
	batch := c.queue[:n:n]
	c.queue = c.queue[n:]
	return batch
}

func (c *pushCoalescer) flush(ctx context.Context, batch []*pushCall) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), coalesceTimeout)
	defer cancel()
	if len(batch) == 1 {
		res, err := c.run(ctx, batch[0].items)
		c.finish(batch[0], res, err)
		return
	}
	var merged []PushItem
	for _, call := range batch {
		merged = append(merged, call.items...)
	}
	res, err := c.run(ctx, merged)
	if err != nil {
		for _, call := range batch {
			r, err := c.run(ctx, call.items)
			c.finish(call, r, err)
		}
		return
	}
	off := 0
	for _, call := range batch {
		part := res[off : off+len(call.items) : off+len(call.items)]
		for i := range part {
			part[i].Index = i
		}
		off += len(call.items)
		c.finish(call, part, nil)
	}
}

func (c *pushCoalescer) finish(call *pushCall, res []PushResult, err error) {
	c.mu.Lock()
	call.res, call.err, call.done = res, err, true
	c.mu.Unlock()
}
