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
