package poller

import (
	"fmt"
	"slices"
)

// WorkerRuns is how many cycles the workers ran (a signal or their timer).
func (p *Poller) WorkerRuns() uint64 {
	var n uint64
	for _, w := range p.workers {
		n += w.woke.Load()
	}
	return n
}

// BeforePop runs f on the worker, with no lock held, just before each pop
// statement of a cycle (after its intentions were chosen and held), until
// the test ends.
func (p *Poller) BeforePop(f func()) func() {
	beforePop.Store(&f)
	return func() { beforePop.Store(nil) }
}

// AfterSettle runs f in a push's Settle of each hand-off that leased
// something, once the credit its reservation held is given back and before
// the delivery, until the test ends.
func (p *Poller) AfterSettle(f func()) func() {
	afterSettle.Store(&f)
	return func() { afterSettle.Store(nil) }
}

// Pending reports whether a worker has a cycle to run or running: a
// signal not yet taken, a cycle begun and not ended (one starved between
// taking its keys and its first statement looks quiet otherwise), or a key
// marked for a pre-flight or holding push hints an intention may take.
func (p *Poller) Pending() bool { return p.PendingWhy() != "" }

// PendingWhy is what makes Pending true ("" when it is false): which
// worker, and its signal, its cycle under way or which key.
func (p *Poller) PendingWhy() string {
	for i, w := range p.workers {
		if len(w.wake) > 0 {
			return fmt.Sprintf("worker %d: a signal not yet taken", i)
		}
		if woke, done := w.woke.Load(), w.done.Load(); woke != done {
			return fmt.Sprintf("worker %d: cycle %d under way", i, woke)
		}
		w.mu.Lock()
		for k, ks := range w.keys {
			// Hints a cycle would take now (collect): a key with no
			// intention that may take them (a long-poll's, between two)
			// keeps them for the next.
			if ks.dirty || (len(ks.hints) > 0 && w.takesHints(ks)) {
				why := fmt.Sprintf("worker %d: key %s dirty=%v hints=%v", i, k, ks.dirty, ks.hints)
				w.mu.Unlock()
				return why
			}
		}
		w.mu.Unlock()
	}
	return ""
}

// takesHints reports whether collect would hand ks's hints to the fast
// path: a live intention may take them, or is a subscription (which the
// fast path marks missed). Called with w.mu.
func (w *worker) takesHints(ks *keyState) bool {
	return slices.ContainsFunc(ks.intentions, func(in *Intention) bool { return !in.gone && (in.Standing || in.ready()) })
}

// ReadBackGap starts the read-back (worker.fill) of a gap in lease, which
// in holds on partitionID, as a push whose answer was lost starts it; f
// runs after each read that failed, until the test ends.
func (p *Poller) ReadBackGap(in *Intention, partitionID, lease string, f func()) func() {
	readBackFailed.Store(&f)
	p.settle(in)
	w := p.workerFor(in.key)
	e := &streamLease{in: in, partitionID: partitionID, lease: lease, next: 2, gap: true}
	w.mu.Lock()
	w.fillIfDue(in.key, e)
	w.mu.Unlock()
	return func() { readBackFailed.Store(nil) }
}
