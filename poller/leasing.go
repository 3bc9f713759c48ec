package poller

import (
	"sync"

	"github.com/heraldmq/herald/queue"
)

// Statements under way that lease. A reconciliation of this instance's
// leases with the database (queue.Store.ReconcileInstanceLeases, after the
// database changed) gives back every lease of the instance's streams that
// none holds; a lease a pop has made, or is making, and not yet handed to
// its subscription is held by none. Lease ids are UUIDv7, increasing in
// this process, so each such statement marks where it begins (a NewID taken
// before its lease ids) and LeaseBound is the lowest mark still under way:
// every lease below it was delivered (or given back) before LeaseBound
// returned.

// leasing is the marks of the statements under way, by token.
type leasing struct {
	mu   sync.Mutex
	next uint64
	open map[uint64]string
}

// begin marks a statement that leases under ids it makes after this call;
// end (idempotent) is called once what it leased is delivered, or given
// back.
func (l *leasing) begin() (end func()) {
	l.mu.Lock()
	if l.open == nil {
		l.open = map[uint64]string{}
	}
	tok := l.next
	l.next++
	l.open[tok] = queue.NewID()
	l.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			delete(l.open, tok)
			l.mu.Unlock()
		})
	}
}

// LeaseBound returns a lease id below which every lease this poller made
// has been delivered to its intention (or given back) by the time it
// returns: the lowest mark of a statement under way, or a new id when none
// is. Read the leases the streams hold after it.
func (p *Poller) LeaseBound() string {
	l := &p.leasing
	l.mu.Lock()
	defer l.mu.Unlock()
	bound := queue.NewID()
	for _, m := range l.open {
		if m < bound {
			bound = m
		}
	}
	return bound
}
