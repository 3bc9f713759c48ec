package poller

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestSweep_Adaptive(t *testing.T) {
	s := newSweep(100*time.Millisecond, 5*time.Second)
	within := func(d, want time.Duration) {
		t.Helper()
		assert.GreaterOrEqual(t, d, want-want/10)
		assert.LessOrEqual(t, d, want+want/10)
	}
	within(s.next(false), 5*time.Second) // starts idle
	within(s.next(true), 100*time.Millisecond)
	for _, want := range []time.Duration{200, 400, 800, 1600, 3200, 5000, 5000} {
		within(s.next(false), want*time.Millisecond)
	}
	within(s.next(true), 100*time.Millisecond) // instant reset when work appears
	within(s.next(false), 200*time.Millisecond)
}

func TestJitter_Spreads(t *testing.T) {
	seen := map[time.Duration]bool{}
	for range 50 {
		seen[jitter(time.Second)] = true
	}
	assert.Greater(t, len(seen), 1, "jitter varies")
	assert.Equal(t, time.Duration(5), jitter(5), "too small to spread")
}
