package poller

// SetPaused stops (true) or resumes (false) every lease the poller takes
// for intentions: pop maintenance (docs/design.md, "Maintenance modes").
// While paused, cycles send no SQL, a push hands off to nobody, and a
// cycle that was already running when the pause began gives back what it
// leased at once (no attempt counted) instead of delivering it. Intentions
// stay registered: standing ones (WebSocket and SSE subscriptions) are
// served again on resume, which marks every queue with waiting intentions,
// whatever the wake mode. Long-polls are the caller's to answer. Safe for
// concurrent use.
func (p *Poller) SetPaused(paused bool) {
	if p.paused.Swap(paused) == paused || paused {
		return
	}
	p.markAllDirty()
}

// Paused reports whether SetPaused(true) is in force.
func (p *Poller) Paused() bool { return p.paused.Load() }
