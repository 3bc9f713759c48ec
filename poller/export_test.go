package poller

// WorkerRuns is how many cycles the workers ran (a signal or their timer).
func (p *Poller) WorkerRuns() uint64 {
	var n uint64
	for _, w := range p.workers {
		n += w.woke.Load()
	}
	return n
}
