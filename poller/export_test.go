package poller

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
// marked for a pre-flight or holding push hints.
func (p *Poller) Pending() bool {
	for _, w := range p.workers {
		if len(w.wake) > 0 || w.woke.Load() != w.done.Load() {
			return true
		}
		w.mu.Lock()
		for _, ks := range w.keys {
			if ks.dirty || len(ks.hints) > 0 {
				w.mu.Unlock()
				return true
			}
		}
		w.mu.Unlock()
	}
	return false
}
