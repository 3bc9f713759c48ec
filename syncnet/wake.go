package syncnet

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// wakeLimiter stands between the network and the Waker: each wake-up from
// a peer (MESSAGE_AVAILABLE, LEASE_HINT_RELEASED) costs the poller work —
// a targeted pop for a named partition, a pre-flight query for the whole
// queue — so each partition of a queue, and the queue as a whole, gets at
// most one per window however many datagrams name it (one replayed
// datagram once cost 4,143 pre-flights in 5 s). A partition's first in
// its window goes through at once, whatever other partitions were named:
// at 1,000 msgs/s spread over a queue's partitions a datagram comes every
// millisecond, and a window per queue made most cross-instance deliveries
// wait for its end. Any more within a partition's window, or past
// wakeNamedMax partitions gone through in one window, become one wake-up
// at the window's end naming each partition they named (once, in the
// order first named; one whose own window ends later is held to its end,
// so that each partition gets at most one per window) so that the poller
// leases them on its fast path with no pre-flight — or the whole queue
// ("") when one named it or they named more than wakeNamedMax partitions:
// nothing announced is lost, only merged.
type wakeLimiter struct {
	waker  Waker
	window time.Duration
	// onAdd, when set, is called (without mu) when a queue enters the
	// map, which sweep then empties: the node's kick.
	onAdd func()

	passes atomic.Int64 // wake-ups passed on, merged ones counted once

	mu     sync.Mutex
	queues map[string]*wakeState
	closed bool
}

type wakeState struct {
	last time.Time // when a wake-up of the whole queue last went through
	// parts: when each partition's wake-up last went through, for those
	// within the window (older ones are dropped as it fills).
	parts   map[string]time.Time
	pending bool // one is due when timer fires
	// named: the partitions the pending one names; nil with pending when
	// it names the whole queue.
	named []string
	timer *time.Timer
}

// wakeNamedMax: a window passes at once, and a merged wake-up names, at
// most this many partitions of a queue, one poller wake-up each; more make
// the merged one name the whole queue (a pre-flight).
const wakeNamedMax = 32

func newWakeLimiter(w Waker, window time.Duration) *wakeLimiter {
	return &wakeLimiter{waker: w, window: window, queues: map[string]*wakeState{}}
}

// wake passes a wake-up of queue/partition on, now or at the end of a
// window.
func (l *wakeLimiter) wake(queue, partition string) {
	now := time.Now()
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	s := l.queues[queue]
	if s == nil {
		s = &wakeState{}
		l.queues[queue] = s
		if l.onAdd != nil {
			defer l.onAdd()
		}
	}
	if due, ok := s.passes(now, partition, l.window); ok {
		if partition == "" && s.pending { // the queue covers what was pending
			s.timer.Stop()
			s.pending, s.named, s.timer = false, nil, nil
		}
		l.mu.Unlock()
		l.passes.Add(1)
		l.waker.Wake(SourceSync, queue, partition)
		return
	} else if !s.pending {
		var named []string
		if partition != "" {
			named = []string{partition}
		}
		l.hold(s, queue, named, due.Sub(now))
		l.mu.Unlock()
		return
	}
	switch {
	case s.named == nil: // the whole queue already
	case partition == "" || len(s.named) >= wakeNamedMax && !slices.Contains(s.named, partition):
		s.named = nil
	case !slices.Contains(s.named, partition):
		s.named = append(s.named, partition)
	}
	l.mu.Unlock()
}

// passes tells whether a wake-up of partition ("": the whole queue) goes
// through now, and records it when it does; when it does not, due is the
// end of the window that holds it back. Called with the limiter's mutex.
func (s *wakeState) passes(now time.Time, partition string, window time.Duration) (due time.Time, ok bool) {
	if s.pending && (s.named == nil || slices.Contains(s.named, partition)) {
		return time.Time{}, false // merged into the pending one
	}
	if partition == "" {
		if now.Sub(s.last) < window {
			return s.last.Add(window), false
		}
		s.last = now
		return time.Time{}, true
	}
	if t, ok := s.parts[partition]; ok && now.Sub(t) < window {
		return t.Add(window), false
	}
	if len(s.parts) >= wakeNamedMax {
		oldest := now
		for p, t := range s.parts {
			if now.Sub(t) >= window {
				delete(s.parts, p)
			} else if t.Before(oldest) {
				oldest = t
			}
		}
		if len(s.parts) >= wakeNamedMax {
			return oldest.Add(window), false
		}
	}
	if s.parts == nil {
		s.parts = map[string]time.Time{}
	}
	s.parts[partition] = now
	return time.Time{}, true
}

// hold makes a wake-up of queue pending, naming named (nil: the whole
// queue), fired after d. Called with the limiter's mutex.
func (l *wakeLimiter) hold(s *wakeState, queue string, named []string, d time.Duration) {
	s.pending, s.named = true, named
	s.timer = time.AfterFunc(d, func() { l.fire(queue) })
}

// fire sends a queue's coalesced wake-up.
func (l *wakeLimiter) fire(queue string) {
	l.mu.Lock()
	s := l.queues[queue]
	if l.closed || s == nil || !s.pending {
		l.mu.Unlock()
		return
	}
	now := time.Now()
	s.pending, s.timer = false, nil
	named := s.named
	s.named = nil
	whole := named == nil
	if whole && now.Sub(s.last) < l.window {
		// The queue went through since this was held back (it took what
		// was pending then with it, so what is pending now was named
		// after): the queue's window ends later.
		l.hold(s, queue, nil, s.last.Add(l.window).Sub(now))
		l.mu.Unlock()
		return
	}
	if whole {
		s.last = now
	} else {
		var later []string
		var next time.Time
		named, later, next = s.due(now, named, l.window)
		if len(later) > 0 { // their windows end later: they wait for them
			l.hold(s, queue, later, next.Sub(now))
		}
	}
	l.mu.Unlock()
	if !whole && len(named) == 0 {
		return
	}
	l.passes.Add(1)
	if whole {
		l.waker.Wake(SourceSync, queue, "")
		return
	}
	for _, p := range named {
		l.waker.Wake(SourceSync, queue, p)
	}
}

// due splits the partitions a merged wake-up names: those whose window
// has ended are ready (and recorded as gone through now), the others wait
// for later, the first of their windows ending at next. Called with the
// limiter's mutex.
func (s *wakeState) due(now time.Time, named []string, window time.Duration) (ready, later []string, next time.Time) {
	if s.parts == nil {
		s.parts = map[string]time.Time{}
	}
	for _, p := range named {
		if t, ok := s.parts[p]; ok && now.Sub(t) < window {
			if later == nil || t.Add(window).Before(next) {
				next = t.Add(window)
			}
			later = append(later, p)
			continue
		}
		s.parts[p] = now
		ready = append(ready, p)
	}
	return ready, later, next
}

// sweep forgets the queues whose window has passed with nothing pending:
// the map holds only recently woken queues.
func (l *wakeLimiter) sweep() {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for q, s := range l.queues {
		if !s.pending && now.Sub(s.latest()) >= l.window {
			delete(l.queues, q)
		}
	}
}

// latest is when a wake-up of the queue or one of its partitions last
// went through.
func (s *wakeState) latest() time.Time {
	t := s.last
	for _, pt := range s.parts {
		if pt.After(t) {
			t = pt
		}
	}
	return t
}

// size is how many queues the map holds.
func (l *wakeLimiter) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.queues)
}

// close drops what is pending: the node stops.
func (l *wakeLimiter) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	for _, s := range l.queues {
		if s.timer != nil {
			s.timer.Stop()
		}
	}
}
