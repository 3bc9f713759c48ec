package tick

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
)

// Loops of one period started at different times wake at the same
// instants, whole periods from the anchor; a period that divides another
// wakes at every instant of the longer one too.
func TestNext_LoopsOfOnePeriodWakeAtTheSameInstants(t *testing.T) {
	anchor := time.Date(2026, 11, 28, 7, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return anchor.Add(d) }
	for _, tc := range []struct {
		name   string
		now    time.Duration
		period time.Duration
		want   time.Duration
	}{
		{"just after the anchor", time.Millisecond, 2 * time.Second, 2 * time.Second},
		{"another loop, later in the same period", 1900 * time.Millisecond, 2 * time.Second, 2 * time.Second},
		{"on an instant: the next one", 4 * time.Second, 2 * time.Second, 6 * time.Second},
		{"a period that divides it", 5500 * time.Millisecond, time.Second, 6 * time.Second},
		{"a long period", 31 * time.Second, 30 * time.Second, 60 * time.Second},
		{"before the anchor", -1500 * time.Millisecond, 2 * time.Second, 0},
		{"well before the anchor", -2500 * time.Millisecond, 2 * time.Second, -2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, at(tc.want), next(anchor, at(tc.now), tc.period))
		})
	}
	assert.Equal(t, at(time.Second), next(anchor, at(time.Second), 0), "no period: now")
}

// The process's instants come after now, within one period.
func TestNext_IsWithinOnePeriodAhead(t *testing.T) {
	for _, p := range []time.Duration{time.Millisecond, 2 * time.Second, time.Minute} {
		now := time.Now()
		n := Next(p)
		assert.True(t, n.After(now), "after now (%v)", p)
		assert.LessOrEqual(t, n.Sub(now), p, "within a period (%v)", p)
	}
}

// After, for a time ahead, is an instant of the period (the one Next
// gives once that time has come) within one period of it.
func TestAfter_IsTheInstantOfThePeriodThatFollowsT(t *testing.T) {
	const p = 2 * time.Second
	at := time.Now().Add(3 * time.Second)
	a := After(at, p)
	assert.True(t, a.After(at))
	assert.LessOrEqual(t, a.Sub(at), p)
	assert.Equal(t, a, After(a.Add(-time.Nanosecond), p), "an instant of the period")
	assert.Equal(t, a.Add(p), After(a, p), "the next one after an instant")
}

// Two loops' timers of one period, made at different times, fire at the
// same instants: once after each Reset, a period apart. The second loop
// starts when the first one's timer first fires, a period after it began.
func TestTimer_TwoLoopsOfOnePeriodFireTogether(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		anchor := time.Now().Add(-300 * time.Millisecond) // the bubble's clock: the process's is outside it
		a := newTimer(anchor, 2*time.Second)
		defer a.Stop()
		<-a.C
		assert.Equal(t, anchor.Add(2*time.Second), time.Now(), "whole periods from the anchor")
		b := newTimer(anchor, 2*time.Second)
		defer b.Stop()
		a.Reset()
		var first time.Time
		for round := range 2 {
			<-a.C
			atA := time.Now()
			<-b.C
			assert.Equal(t, atA, time.Now(), "round %d: fired together", round)
			if round == 0 {
				first = atA
			} else {
				assert.Equal(t, 2*time.Second, atA.Sub(first), "a period apart")
			}
			a.Reset()
			b.Reset()
		}
	})
}
