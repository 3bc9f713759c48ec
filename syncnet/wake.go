package syncnet

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// wakeLimiter stands between the network and the Waker: each wake-up from
// a peer (MESSAGE_AVAILABLE, LEASE_HINT_RELEASED) costs the poller a cycle,
// a pre-flight query at worst, so a queue gets at most one per window
// however many datagrams name it (one replayed datagram once cost 4,143
// pre-flights in 5 s). The first goes through at once; any more within the
// window become one at the window's end, naming each partition they named
// (once, in the order first named) so that the poller leases them on its
// fast path with no pre-flight, or the whole queue ("") when one named it
// or they named more than wakeNamedMax partitions: nothing announced is
// lost, only merged.
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
	last    time.Time // when a wake-up of the queue last went through
	pending bool      // one is due at last+window
	// named: the partitions the pending one names; nil with pending when
	// it names the whole queue.
	named []string
	timer *time.Timer
}

// wakeNamedMax: a merged wake-up names at most this many partitions, one
// poller wake-up each; more make it name the whole queue (a pre-flight).
const wakeNamedMax = 32

func newWakeLimiter(w Waker, window time.Duration) *wakeLimiter {
	return &wakeLimiter{waker: w, window: window, queues: map[string]*wakeState{}}
}

// wake passes a wake-up of queue/partition on, now or at the end of the
// queue's window.
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
	switch {
	case !s.pending && now.Sub(s.last) >= l.window:
		s.last = now
		l.mu.Unlock()
		l.passes.Add(1)
		l.waker.Wake(SourceSync, queue, partition)
		return
	case !s.pending:
		s.pending, s.named = true, nil
		if partition != "" {
			s.named = []string{partition}
		}
		s.timer = time.AfterFunc(s.last.Add(l.window).Sub(now), func() { l.fire(queue) })
	case s.named == nil: // the whole queue already
	case partition == "" || len(s.named) >= wakeNamedMax && !slices.Contains(s.named, partition):
		s.named = nil
	case !slices.Contains(s.named, partition):
		s.named = append(s.named, partition)
	}
	l.mu.Unlock()
}

// fire sends a queue's coalesced wake-up.
func (l *wakeLimiter) fire(queue string) {
	l.mu.Lock()
	s := l.queues[queue]
	if l.closed || s == nil || !s.pending {
		l.mu.Unlock()
		return
	}
	s.pending, s.last, s.timer = false, time.Now(), nil
	named := s.named
	s.named = nil
	l.mu.Unlock()
	l.passes.Add(1)
	if named == nil {
		l.waker.Wake(SourceSync, queue, "")
		return
	}
	for _, p := range named {
		l.waker.Wake(SourceSync, queue, p)
	}
}

// sweep forgets the queues whose window has passed with nothing pending:
// the map holds only recently woken queues.
func (l *wakeLimiter) sweep() {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for q, s := range l.queues {
		if !s.pending && now.Sub(s.last) >= l.window {
			delete(l.queues, q)
		}
	}
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
