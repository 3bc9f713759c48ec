package poller

import (
	"math/rand/v2"
	"time"
)

// sweep is the adaptive safety-sweep interval of seed 002: the minimum right
// after a cycle that found work, doubling on every idle cycle up to the
// maximum, with ±10% jitter so that instances do not sweep in lockstep.
type sweep struct {
	min, max time.Duration
	cur      time.Duration
}

// newSweep starts idle, at the maximum: with nothing known to do there is
// nothing to poll for (new intentions are checked when they arrive).
func newSweep(lo, hi time.Duration) *sweep { return &sweep{min: lo, max: hi, cur: hi} }

// next records whether the last cycle found work and returns how long to
// wait before the next sweep.
func (s *sweep) next(worked bool) time.Duration {
	if worked {
		s.cur = s.min
	} else {
		s.cur = min(s.cur*2, s.max)
	}
	return jitter(s.cur)
}

// jitter spreads d by ±10%.
func jitter(d time.Duration) time.Duration {
	spread := int64(d) / 10
	if spread <= 0 {
		return d
	}
	return d + time.Duration(rand.Int64N(2*spread+1)-spread) // #nosec G404 -- jitter, not security
}
