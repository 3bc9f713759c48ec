package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/heraldmq/herald/internal/benchstat"
)

// The end-to-end throughput scenario: e2eProducers
// producers push batches of e2eBatch messages as fast as the system takes
// them, one consumer per consumer group acks each message, and the
// producers pause while the slowest group is more than e2eBacklog messages
// behind, so that what is measured is the rate messages go through, not
// the rate a backlog can grow.
const (
	e2eProducers = 4
	e2eBatch     = 100
	e2eBacklog   = 10_000
	// e2eDrain bounds the wait, after the producers stop, for every group
	// to have every message pushed: the check that nothing was lost.
	e2eDrain = 60 * time.Second
)

// e2eRunner is a system that takes part in the end-to-end scenario.
type e2eRunner interface {
	system
	// e2e measures with groups consumer groups, each receiving every
	// message: warm of warm-up, then dur measured.
	e2e(ctx context.Context, groups int, warm, dur time.Duration) (e2eSample, error)
	// e2eMaxGroups is the most consumer groups the system can fan out to.
	e2eMaxGroups() int
}

// e2eSample is one end-to-end measurement.
type e2eSample struct {
	Delivered float64 // messages delivered and acked per second, all groups together
	Pushed    float64 // messages pushed per second
	cpuCost           // per 1,000 messages delivered
	// ClientCPU is this process's CPU per 1,000 messages delivered: the
	// producers and consumers, counted in no system's figure, shown so
	// that a run limited by its load generator can be told.
	ClientCPU float64
	Dups      int // deliveries of a message its group had already had
}

// e2eRun is the shared state of one end-to-end measurement.
type e2eRun struct {
	next   atomic.Int64 // index of the next message to push
	pushed atomic.Int64 // messages whose push was confirmed
	groups []*e2eGroup
}

func newE2ERun(groups int) *e2eRun {
	r := &e2eRun{}
	for range groups {
		r.groups = append(r.groups, &e2eGroup{})
	}
	return r
}

// e2eGroup counts what one consumer group received, once per message.
type e2eGroup struct {
	mu   sync.Mutex
	seen []uint64 // bit per message index
	n    atomic.Int64
	dups atomic.Int64
}

// deliverJSON counts the message whose payload is data (a stamp).
func (g *e2eGroup) deliverJSON(data []byte) {
	var s benchstat.Stamp
	if json.Unmarshal(data, &s) != nil {
		return
	}
	g.deliver(s.I)
}

func (g *e2eGroup) deliver(i int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	w := i / 64
	for len(g.seen) <= w {
		g.seen = append(g.seen, make([]uint64, len(g.seen)+1024)...)
	}
	if g.seen[w]&(1<<(i%64)) != 0 {
		g.dups.Add(1)
		return
	}
	g.seen[w] |= 1 << (i % 64)
	g.n.Add(1)
}

// delivered is the distinct messages all groups received together.
func (r *e2eRun) delivered() int64 {
	var n int64
	for _, g := range r.groups {
		n += g.n.Load()
	}
	return n
}

// backlog is how far the slowest group is behind the confirmed pushes.
func (r *e2eRun) backlog() int64 {
	p := r.pushed.Load()
	var b int64
	for _, g := range r.groups {
		b = max(b, p-g.n.Load())
	}
	return b
}

// e2eBatchPush pushes payloads, whose message indexes start at first, as
// one batch, and returns once the system has confirmed them.
type e2eBatchPush func(ctx context.Context, first int, payloads [][]byte) error

// measureE2E runs the producers for warm+dur with push, reads the messages
// delivered and the CPU spent over the last dur, then waits for every group
// to have every message pushed (e2eDrain at most). The consumers must be
// running already.
func measureE2E(ctx context.Context, r *e2eRun, warm, dur time.Duration, cpu cpuMeter, push e2eBatchPush) (e2eSample, error) {
	var stop atomic.Bool
	errc := make(chan error, e2eProducers)
	var wg sync.WaitGroup
	for range e2eProducers {
		wg.Go(func() {
			for !stop.Load() && ctx.Err() == nil {
				if r.backlog() > e2eBacklog {
					// A poll, not a signal: the wait is cheap next to a
					// batch, and the consumers stay free of producer code.
					time.Sleep(2 * time.Millisecond)
					continue
				}
				first := int(r.next.Add(e2eBatch)) - e2eBatch
				ps := make([][]byte, e2eBatch)
				for k := range ps {
					ps[k] = makePayload(first + k)
				}
				if err := push(ctx, first, ps); err != nil {
					errc <- err
					return
				}
				r.pushed.Add(e2eBatch)
			}
		})
	}
	fail := func(err error) (e2eSample, error) {
		stop.Store(true)
		wg.Wait()
		return e2eSample{}, err
	}
	wait := func(d time.Duration) error {
		select {
		case <-time.After(d):
			return nil
		case err := <-errc:
			return fmt.Errorf("pushing: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := wait(warm); err != nil {
		return fail(err)
	}
	s0, pg0 := cpu()
	c0 := procCPU(os.Getpid())
	d0, p0, t0 := r.delivered(), r.pushed.Load(), time.Now()
	if err := wait(dur); err != nil {
		return fail(err)
	}
	s1, pg1 := cpu()
	c1 := procCPU(os.Getpid())
	d1, p1, t1 := r.delivered(), r.pushed.Load(), time.Now()
	stop.Store(true)
	wg.Wait()
	select {
	case err := <-errc:
		return e2eSample{}, fmt.Errorf("pushing: %w", err)
	default:
	}
	secs := t1.Sub(t0).Seconds()
	n := float64(d1 - d0)
	out := e2eSample{Delivered: n / secs, Pushed: float64(p1-p0) / secs}
	if n > 0 {
		out.cpuCost, out.ClientCPU = costOf(s0, pg0, s1, pg1, n), per1k(c1-c0, n)
	}
	for _, g := range r.groups {
		out.Dups += int(g.dups.Load())
	}
	// Drain: every group must get every message pushed.
	deadline := time.Now().Add(e2eDrain)
	pushed := r.pushed.Load()
	for {
		behind := -1
		for i, g := range r.groups {
			if g.n.Load() < pushed {
				behind = i
				break
			}
		}
		if behind < 0 {
			return out, nil
		}
		if time.Now().After(deadline) {
			g := r.groups[behind]
			return out, fmt.Errorf("group %d had %d of %d messages %v after the producers stopped", behind,
				g.n.Load(), pushed, e2eDrain)
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return out, ctx.Err()
		}
	}
}
