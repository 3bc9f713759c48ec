package benchstat

import (
	"context"
	"sync"
	"time"
)

// paceProducers is how many pushes Pace may have under way at once.
const paceProducers = 16

// Pace calls push for i = 0 … total-1 at rate per second on the schedule
// of the start (push i is due i/rate seconds in), from a pool of 16
// producers, so that one slow push does not delay the ones after it. It
// returns how many pushes it started and, once they have all returned,
// the first error one of them returned, or ctx's error when ctx ended
// first.
func Pace(ctx context.Context, rate, total int, push func(ctx context.Context, i int) error) (int, error) {
	p := NewPool(ctx, paceProducers, 1024, push)
	start := time.Now()
	interval := time.Second / time.Duration(rate)
	timer := time.NewTimer(0)
	defer timer.Stop()
	sent := 0
	for ; sent < total; sent++ {
		if d := time.Until(start.Add(time.Duration(sent) * interval)); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
				_ = p.Wait()
				return sent, ctx.Err()
			}
		}
		p.Feed(sent)
	}
	return sent, p.Wait()
}

// Pool calls a job on goroutines of its own, once for each index fed to
// it, and keeps the first error a call returned.
type Pool struct {
	jobs chan int
	errc chan error
	wg   sync.WaitGroup
}

// NewPool starts workers goroutines calling job(ctx, i) for each index i
// fed, with room for buffer indices waiting for one of them.
func NewPool(ctx context.Context, workers, buffer int, job func(ctx context.Context, i int) error) *Pool {
	p := &Pool{jobs: make(chan int, buffer), errc: make(chan error, 1)}
	for range workers {
		p.wg.Go(func() {
			for i := range p.jobs {
				if err := job(ctx, i); err != nil {
					select {
					case p.errc <- err:
					default:
					}
				}
			}
		})
	}
	return p
}

// Feed hands index i to the pool; it waits while every worker is busy and
// the buffer full.
func (p *Pool) Feed(i int) { p.jobs <- i }

// Wait ends the feeding, waits for every call fed to return and returns
// the first error one returned.
func (p *Pool) Wait() error {
	close(p.jobs)
	p.wg.Wait()
	select {
	case err := <-p.errc:
		return err
	default:
		return nil
	}
}
