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
	jobs := make(chan int, 1024)
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	for range paceProducers {
		wg.Go(func() {
			for i := range jobs {
				if err := push(ctx, i); err != nil {
					select {
					case errc <- err:
					default:
					}
				}
			}
		})
	}
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
				close(jobs)
				wg.Wait()
				return sent, ctx.Err()
			}
		}
		jobs <- sent
	}
	close(jobs)
	wg.Wait()
	select {
	case err := <-errc:
		return sent, err
	default:
		return sent, nil
	}
}
