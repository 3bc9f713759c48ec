package gateway

import (
	"sync"
	"sync/atomic"
	"time"
)

// warmStacksIdle is how long a kept goroutine waits for work before it
// ends: a burst's goroutines do not outlive it for long.
const warmStacksIdle = time.Second

// warmStacksKept bounds the goroutines warmStacks keeps between uses: about
// as many as frames and acks handled at once on a busy instance. Beyond it,
// work runs on a goroutine of its own, as if there were no pool.
const warmStacksKept = 64

// warmStacks runs the deep work of the streams (a frame's JSON and SQL, an
// ack's transaction, a writer's encoding) on goroutines it keeps between
// uses. A new goroutine starts with an 8 KiB stack and grows it by copying
// each time a call goes deeper (runtime.copystack), and that work is done
// once per goroutine: at 200 messages per second, three short-lived
// goroutines per message spent 9% of the instance's CPU growing stacks.
// A kept goroutine's stack stays grown (the collector halves an idle one at
// most once per cycle) until it has had no work for warmStacksIdle. The connection's own goroutine still never runs
// such work, so an idle connection keeps its small stack.
//
// A nil *warmStacks runs work on new goroutines.
type warmStacks struct {
	work chan func() // unbuffered: a send succeeds only into an idle goroutine
	quit chan struct{}
	kept atomic.Int32
	idle atomic.Int32 // kept goroutines waiting for work (tests read it)
	wg   sync.WaitGroup
	// mu orders a kept goroutine's start (wg.Add) before close's wg.Wait:
	// once closed, nothing more is kept.
	mu     sync.RWMutex
	closed bool
}

func newWarmStacks() *warmStacks {
	return &warmStacks{work: make(chan func()), quit: make(chan struct{})}
}

// goDo runs f on an idle kept goroutine, a new kept one if fewer than
// warmStacksKept are, or a goroutine of its own. It never blocks.
func (p *warmStacks) goDo(f func()) {
	if p == nil {
		go f()
		return
	}
	select {
	case p.work <- f:
		return
	default:
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if !p.closed && p.kept.Add(1) <= warmStacksKept {
		p.wg.Add(1)
		go p.keep(f)
		return
	}
	if !p.closed {
		p.kept.Add(-1)
	}
	go f()
}

// do runs f on a kept goroutine (see goDo) and waits for it.
func (p *warmStacks) do(f func()) {
	done := make(chan struct{})
	p.goDo(func() {
		defer close(done)
		f()
	})
	<-done
}

// keep runs f, then whatever work comes, until close or warmStacksIdle
// without work.
func (p *warmStacks) keep(f func()) {
	defer p.wg.Done()
	defer p.kept.Add(-1)
	idle := time.NewTimer(warmStacksIdle)
	defer idle.Stop()
	for {
		f()
		f = nil // an idle goroutine keeps nothing of its last work alive (a frame, a session)
		idle.Reset(warmStacksIdle)
		p.idle.Add(1)
		select {
		case f = <-p.work:
			p.idle.Add(-1)
		case <-idle.C:
			p.idle.Add(-1)
			return
		case <-p.quit:
			p.idle.Add(-1)
			return
		}
	}
}

// close ends the idle kept goroutines and waits for the busy ones to finish
// their work. Work given after close runs on goroutines of its own.
func (p *warmStacks) close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.quit)
	}
	p.mu.Unlock()
	p.wg.Wait()
}
