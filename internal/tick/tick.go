package tick

import (
	"math/rand/v2"
	"time"
)

// anchor is the process's origin of periods (a monotonic reading, so
// that Next does not move with the wall clock).
var anchor = time.Now().Add(-rand.N(time.Minute)) // #nosec G404 -- a phase, not a secret

// Next is the first instant after now that is a whole number of period
// from the process's anchor.
func Next(period time.Duration) time.Time { return After(time.Now(), period) }

// After is the first instant after t that is a whole number of period from
// the process's anchor: where a wait that may not end before t ends with
// the process's other loops of that period.
func After(t time.Time, period time.Duration) time.Time { return next(anchor, t, period) }

// next is the first instant after now that is a whole number of period
// from anchor (before or after now).
func next(anchor, now time.Time, period time.Duration) time.Time {
	if period <= 0 {
		return now
	}
	k := now.Sub(anchor) / period
	if now.Sub(anchor) < 0 {
		k-- // towards minus infinity
	}
	at := anchor.Add((k + 1) * period)
	if !at.After(now) {
		at = at.Add(period)
	}
	return at
}

// Timer fires at the process's instants of its period (Next): C receives
// once per Reset, as a time.Timer's channel does.
type Timer struct {
	C      <-chan time.Time
	t      *time.Timer
	anchor time.Time
	period time.Duration
}

// NewTimer returns a Timer armed for the next instant of period.
func NewTimer(period time.Duration) *Timer { return newTimer(anchor, period) }

func newTimer(anchor time.Time, period time.Duration) *Timer {
	t := time.NewTimer(time.Until(next(anchor, time.Now(), period)))
	return &Timer{C: t.C, t: t, anchor: anchor, period: period}
}

// Reset arms the timer for the next instant of its period (call it after
// each receive from C).
func (t *Timer) Reset() { t.t.Reset(time.Until(next(t.anchor, time.Now(), t.period))) }

// Stop stops the timer.
func (t *Timer) Stop() { t.t.Stop() }
