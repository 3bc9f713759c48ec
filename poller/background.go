package poller

import (
	"context"
	"sync"
	"time"
)

// background runs the goroutines the poller starts off its workers' (a
// lost hand-off's read-back: worker.fill) under one context, which Run's
// end cancels, and waits for them: Run returns only when they have. Once
// stopped it starts none.
type background struct {
	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex
	done   bool
	wg     sync.WaitGroup
}

// start runs f in a goroutine with the background's context, unless the
// poller has stopped (false then: f does not run).
func (b *background) start(f func(ctx context.Context)) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return false
	}
	b.wg.Go(func() { f(b.ctx) })
	return true
}

// stop cancels the background's context and waits for what runs under
// it. Stopping twice is harmless.
func (b *background) stop() {
	b.mu.Lock()
	b.done = true
	b.mu.Unlock()
	b.cancel()
	b.wg.Wait()
}

// sleep waits d, or until ctx ends (false then).
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
