package queue

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Coalescing limits. One merged run takes at most this many items and (for
// pushes) payload bytes, but always at least one whole request, so a
// statement stays well under Postgres' 1 GB message limit and one slow
// giant request does not hold small ones for long.
const (
	coalesceMaxItems = 2000
	coalesceMaxBytes = 4 << 20
	// coalesceTimeout bounds one merged run: it runs on behalf of several
	// callers, so no single caller's context may cancel it (it ends when
	// all of theirs have). A hung database fails it within this, and its
	// connection is dropped, so a failover is followed within seconds.
	coalesceTimeout = 10 * time.Second
)

// coalescer merges requests that arrive while earlier ones are in the
// database into one transaction (group commit). With no contention a
// request runs at once, alone; under load, N waiting requests cost one
// transaction instead of N. Pushes (pushReq) and acks (ackReq) use it.
//
// There is no goroutine of its own: callers take turns flushing the queue
// from its head, at most `flushers` at a time, until their own request has
// been run. The head of the queue joins the batch being taken unless it must
// run after a batch still running (busy), so a caller's wait is bounded: a
// request a batcher held back (wait) is at the head of a later batch, and
// requests that must follow one another never run at once.
//
// run must give each request of a merged batch exactly the results it would
// get alone; the batcher keeps out of a batch what would break that (a
// request past the limits, an ack overlapping an earlier request). If a
// merged run fails, each request is run again on its own, so one bad
// request cannot fail its neighbours.
//
// A caller whose context ends before its request is taken into a batch gets
// the context's error and its request is never run; once taken, the request
// runs to the end under coalesceTimeout (its neighbours' results depend on
// it) and the caller gets its results, unless every caller of its batch has
// gone: then nobody waits for the results and the run is cancelled.
type coalescer[Req, Res any] struct {
	// run runs reqs in one transaction and returns one result per request,
	// in order. It is called with one request when there is no merging, or
	// to retry a request of a failed merged run.
	run func(ctx context.Context, reqs []Req) ([]Res, error)
	// newBatcher returns the admission state of one batch.
	newBatcher func() batcher[Req]
	flushers   int

	mu      sync.Mutex
	cond    *sync.Cond
	queue   []*coalescedCall[Req, Res]
	running int
	active  []*coalescedCall[Req, Res] // the requests of the batches running
}

// verdict is a batcher's answer about one queued request.
type verdict int8

const (
	join verdict = iota // the request joins the batch
	wait                // it waits for a later batch; later requests may join
	full                // it and every request after it wait
)

// A batcher decides which queued requests one merged run takes. take offers
// it the queued requests in arrival order and obeys its verdicts, except
// that the first request always joins.
type batcher[Req any] interface {
	offer(r Req) verdict
	// busy tells it of a request of a batch still running, before any
	// offer: a request that must run after it waits (even at the head).
	busy(r Req)
}

type coalescedCall[Req, Res any] struct {
	ctx   context.Context
	req   Req
	res   Res
	err   error
	taken bool // in a batch: it will run, whatever its context says
	done  bool
}

func newCoalescer[Req, Res any](flushers int, newBatcher func() batcher[Req],
	run func(context.Context, []Req) ([]Res, error)) *coalescer[Req, Res] {
	c := &coalescer[Req, Res]{run: run, newBatcher: newBatcher, flushers: flushers}
	c.cond = sync.NewCond(&c.mu)
	return c
}

// do runs req, merged with whatever requests are waiting with it.
func (c *coalescer[Req, Res]) do(ctx context.Context, req Req) (Res, error) {
	return c.wait(c.enqueue(ctx, req))
}

// enqueue puts req in the queue, behind every request enqueued before it
// (requests on the same rows run in that order), without running it: wait
// does. A caller may enqueue several requests in order and wait for them
// on other goroutines.
func (c *coalescer[Req, Res]) enqueue(ctx context.Context, req Req) *coalescedCall[Req, Res] {
	call := &coalescedCall[Req, Res]{ctx: ctx, req: req}
	if err := ctx.Err(); err != nil {
		call.err, call.done = err, true
		return call
	}
	c.mu.Lock()
	c.queue = append(c.queue, call)
	c.mu.Unlock()
	return call
}

// wait runs the queue from its head, in turns with other waiters, until
// call has run, and returns its results.
func (c *coalescer[Req, Res]) wait(call *coalescedCall[Req, Res]) (Res, error) {
	ctx := call.ctx
	c.mu.Lock()
	for !call.done {
		if !call.taken && ctx.Err() != nil {
			// Gone before its turn: nothing of it ran.
			c.queue = slices.DeleteFunc(c.queue, func(q *coalescedCall[Req, Res]) bool { return q == call })
			call.err, call.done = ctx.Err(), true
			break
		}
		if c.running < c.flushers && len(c.queue) > 0 {
			batch := c.take()
			if len(batch) == 0 {
				// Everything queued must run after a batch still
				// running: wait for it.
				c.cond.Wait()
				continue
			}
			c.running++
			c.active = append(c.active, batch...)
			c.mu.Unlock()
			c.flush(batch)
			c.mu.Lock()
			c.running--
			c.active = slices.DeleteFunc(c.active, func(a *coalescedCall[Req, Res]) bool { return slices.Contains(batch, a) })
			c.cond.Broadcast()
			continue
		}
		c.cond.Wait()
	}
	c.mu.Unlock()
	return call.res, call.err
}

// take removes a batch from the queue: the requests the batcher lets join,
// in arrival order. A request whose caller has gone is dropped with its
// context's error. Called with mu held.
func (c *coalescer[Req, Res]) take() []*coalescedCall[Req, Res] {
	b := c.newBatcher()
	for _, a := range c.active {
		b.busy(a.req)
	}
	batch := make([]*coalescedCall[Req, Res], 0, len(c.queue))
	keep := c.queue[:0]
	for i, q := range c.queue {
		if err := q.ctx.Err(); err != nil {
			q.err, q.done = err, true
			continue
		}
		v := b.offer(q.req)
		if len(batch) == 0 && v == full {
			v = join // one request past the limits runs alone
		}
		if v == full {
			keep = append(keep, c.queue[i:]...)
			break
		}
		if v == wait {
			keep = append(keep, q)
			continue
		}
		q.taken = true
		batch = append(batch, q)
	}
	clear(c.queue[len(keep):])
	c.queue = keep
	return batch
}

// flush runs batch merged, or request by request if the merged run fails.
func (c *coalescer[Req, Res]) flush(batch []*coalescedCall[Req, Res]) {
	if len(batch) == 0 {
		return
	}
	reqs := make([]Req, len(batch))
	for i, call := range batch {
		reqs[i] = call.req
	}
	res, err := c.runDetached(batch, reqs)
	if err == nil || len(batch) == 1 {
		c.finish(batch, res, err)
		return
	}
	for i := range batch {
		r, err := c.runDetached(batch[i:i+1], reqs[i:i+1])
		c.finish(batch[i:i+1], r, err)
	}
}

// runDetached runs reqs under a context no one caller can cancel, with the
// first caller's values (a tracer's span), bounded by coalesceTimeout and
// cancelled once every caller of calls has gone.
func (c *coalescer[Req, Res]) runDetached(calls []*coalescedCall[Req, Res], reqs []Req) ([]Res, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(calls[0].ctx), coalesceTimeout)
	defer cancel()
	var left atomic.Int32
	left.Store(int32(len(calls))) // #nosec G115 -- a batch is small
	for _, call := range calls {
		stop := context.AfterFunc(call.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
		defer stop()
	}
	res, err := c.run(ctx, reqs)
	if err != nil && left.Load() <= 0 {
		// Cancelled for its callers: they get their own reason (a
		// deadline, or a client gone), not this context's.
		return nil, fmt.Errorf("running a group commit every caller gave up on: %w", context.Cause(calls[0].ctx))
	}
	return res, err
}

func (c *coalescer[Req, Res]) finish(batch []*coalescedCall[Req, Res], res []Res, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, call := range batch {
		if err == nil {
			call.res = res[i]
		}
		call.err, call.done = err, true
	}
}

// mergedRun makes a coalescer's run of run, which takes items and gives one
// result per item in order: the requests' items go in as one slice, and the
// results are split back and numbered per request (setIndex).
func mergedRun[Req, Item, Res any](run func(context.Context, []Item) ([]Res, error), itemsOf func(Req) []Item,
	setIndex func(*Res, int)) func(context.Context, []Req) ([][]Res, error) {
	return func(ctx context.Context, reqs []Req) ([][]Res, error) {
		if len(reqs) == 1 {
			res, err := run(ctx, itemsOf(reqs[0]))
			if err != nil {
				return nil, err
			}
			return [][]Res{res}, nil
		}
		n := 0
		for _, r := range reqs {
			n += len(itemsOf(r))
		}
		merged := make([]Item, 0, n)
		for _, r := range reqs {
			merged = append(merged, itemsOf(r)...)
		}
		res, err := run(ctx, merged)
		if err != nil {
			return nil, err
		}
		out := make([][]Res, len(reqs))
		off := 0
		for i, r := range reqs {
			end := off + len(itemsOf(r))
			part := res[off:end:end]
			for j := range part {
				setIndex(&part[j], j)
			}
			out[i], off = part, end
		}
		return out, nil
	}
}
