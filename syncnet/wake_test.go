package syncnet

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
)

// A wake-up merged at the window's end names every partition the window's
// datagrams named, so the poller serves them on its fast path (a pop, no
// pre-flight), not as a whole queue to look at again.
func TestWakeLimiter_MergedWakeUpNamesEveryPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWakes()
		l := newWakeLimiter(w, 5*time.Millisecond)
		defer l.close()
		l.wake("q", "p1")
		assert.Equal(t, []string{"q/p1"}, gotOf(w), "the first goes through at once")
		l.wake("q", "p2")
		l.wake("q", "p3")
		l.wake("q", "p2")
		l.wake("other", "x")
		assert.Equal(t, []string{"q/p1", "other/x"}, gotOf(w), "the rest wait for the window's end; another queue does not")
		waitWakes(t, w, 4)
		synctest.Wait()
		assert.Equal(t, []string{"q/p1", "other/x", "q/p2", "q/p3"}, gotOf(w), "each partition named once, in order")
		assert.Equal(t, int64(3), l.passes.Load(), "q at once, other at once, then one merged wake-up of q")
	})
}

// A window that named the whole queue, or more partitions than a wake-up
// names, ends in one wake-up of the whole queue.
func TestWakeLimiter_ManyPartitionsOrTheQueueMergeIntoTheQueue(t *testing.T) {
	for _, tc := range []struct {
		name  string
		parts []string
	}{
		{"the whole queue named", []string{"p2", "", "p3"}},
		{"more partitions than a wake-up names", func() (ps []string) {
			for i := range wakeNamedMax + 1 {
				ps = append(ps, fmt.Sprintf("p%d", i+2))
			}
			return ps
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newWakes()
				l := newWakeLimiter(w, 5*time.Millisecond)
				defer l.close()
				l.wake("q", "p1")
				for _, p := range tc.parts {
					l.wake("q", p)
				}
				waitWakes(t, w, 2)
				synctest.Wait()
				assert.Equal(t, []string{"q/p1", "q/"}, gotOf(w))
			})
		})
	}
}

// waitWakes waits, on the bubble's clock, until w has been woken n times
// (each wake-up signals w.ch), failing after a second.
func waitWakes(t *testing.T, w *wakes, n int) {
	t.Helper()
	ceiling := time.After(time.Second)
	for w.count() < n {
		select {
		case <-w.ch:
		case <-ceiling:
			t.Fatalf("%d wake-ups within a second, want %d: %v", w.count(), n, gotOf(w))
		}
	}
}

// gotOf is what w has been woken for so far.
func gotOf(w *wakes) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.got...)
}

// A datagram that comes just after a wake-up went through waits at most
// 2 ms for its merged one (the default window): at 1,000 msgs/s most
// datagrams come within a window, and the wait is part of every
// cross-instance delivery's latency.
func TestWakeLimiter_MergedWakeUpComesWithin2ms(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWakes()
		l := newWakeLimiter(w, WakeWindowDefault)
		defer l.close()
		start := time.Now()
		l.wake("q", "p1")
		// p2 comes 100 µs later, inside the window p1 opened (a timer's
		// channel on the bubble's clock).
		<-time.After(100 * time.Microsecond)
		l.wake("q", "p2")
		waitWakes(t, w, 2)
		assert.Equal(t, []string{"q/p1", "q/p2"}, gotOf(w))
		assert.LessOrEqual(t, time.Since(start), 2*time.Millisecond, "merged wake-up within 2 ms of the window's start")
	})
}
