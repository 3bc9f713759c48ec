package syncnet

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
)

// A wake-up merged at the window's end names every partition the window's
// held-back datagrams named, so the poller serves them on its fast path (a
// pop, no pre-flight), not as a whole queue to look at again.
func TestWakeLimiter_MergedWakeUpNamesEveryPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, l := limiter(t, 5*time.Millisecond)
		l.wake("q", "p1")
		l.wake("q", "p2")
		assert.Equal(t, []string{"q/p1", "q/p2"}, gotOf(w), "each partition's first at once")
		l.wake("q", "p2")
		l.wake("q", "p1")
		l.wake("q", "p2")
		l.wake("other", "x")
		assert.Equal(t, []string{"q/p1", "q/p2", "other/x"}, gotOf(w), "the rest wait for the window's end; another queue does not")
		waitWakes(t, w, 5)
		synctest.Wait()
		assert.Equal(t, []string{"q/p1", "q/p2", "other/x", "q/p2", "q/p1"}, gotOf(w), "each partition named once, in order")
		assert.Equal(t, int64(4), l.passes.Load(), "p1, p2 and other at once, then one merged wake-up of q")
	})
}

// A window that named the whole queue twice, or more partitions than a
// window passes and a wake-up names, ends in one wake-up of the whole
// queue.
func TestWakeLimiter_ManyPartitionsOrTheQueueMergeIntoTheQueue(t *testing.T) {
	many := func(from, n int) (ps []string) {
		for i := range n {
			ps = append(ps, fmt.Sprintf("p%d", from+i))
		}
		return ps
	}
	for _, tc := range []struct {
		name  string
		parts []string
		now   []string // what goes through at once
	}{
		{"the whole queue named twice", []string{"", "p2", "", "p3"}, []string{"q/p1", "q/", "q/p2"}},
		{"more partitions than a wake-up names", many(2, 2*wakeNamedMax), func() (got []string) {
			for _, p := range many(1, wakeNamedMax) {
				got = append(got, "q/"+p)
			}
			return got
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w, l := limiter(t, 5*time.Millisecond)
				l.wake("q", "p1")
				for _, p := range tc.parts {
					l.wake("q", p)
				}
				assert.Equal(t, tc.now, gotOf(w))
				waitWakes(t, w, len(tc.now)+1)
				synctest.Wait()
				assert.Equal(t, append(tc.now, "q/"), gotOf(w))
			})
		})
	}
}

// A wake-up of the whole queue covers what was held back: nothing more
// comes at the window's end.
func TestWakeLimiter_QueueWakeUpTakesThePendingOnesWithIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, l := limiter(t, 5*time.Millisecond)
		l.wake("q", "p1")
		l.wake("q", "p1")
		l.wake("q", "")
		assert.Equal(t, []string{"q/p1", "q/"}, gotOf(w))
		<-time.After(time.Second)
		synctest.Wait()
		assert.Equal(t, []string{"q/p1", "q/"}, gotOf(w), "nothing at the window's end")
	})
}

// limiter is a wake limiter with the given window passing its wake-ups to
// a recording Waker, closed when the test ends.
func limiter(t *testing.T, window time.Duration) (*wakes, *wakeLimiter) {
	w := newWakes()
	l := newWakeLimiter(w, window)
	t.Cleanup(l.close)
	return w, l
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

// A datagram that comes just after a wake-up of its partition went through
// waits at most 2 ms for its merged one (the default window): the wait is
// part of a cross-instance delivery's latency.
func TestWakeLimiter_MergedWakeUpComesWithin2ms(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, l := limiter(t, WakeWindowDefault)
		start := time.Now()
		l.wake("q", "p1")
		// p1 again 100 µs later, inside the window its first opened (a
		// timer's channel on the bubble's clock).
		<-time.After(100 * time.Microsecond)
		l.wake("q", "p1")
		waitWakes(t, w, 2)
		assert.Equal(t, []string{"q/p1", "q/p1"}, gotOf(w))
		assert.LessOrEqual(t, time.Since(start), 2*time.Millisecond, "merged wake-up within 2 ms of the window's start")
	})
}

// A datagram naming another partition than the wake-ups of the window so
// far goes through at once: the window bounds the wake-ups of each
// partition (and of the whole queue), so that at 1,000 msgs/s spread over
// partitions a cross-instance delivery does not wait for the window's end
// behind another partition's message.
func TestWakeLimiter_AnotherPartitionWithinTheWindowGoesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, l := limiter(t, WakeWindowDefault)
		l.wake("q", "p1")
		<-time.After(100 * time.Microsecond)
		start := time.Now()
		l.wake("q", "p2")
		l.wake("q", "p3")
		assert.Equal(t, []string{"q/p1", "q/p2", "q/p3"}, gotOf(w), "each partition's first wake-up of the window at once")
		assert.Zero(t, time.Since(start), "no wait on the bubble's clock")
		l.wake("q", "p2")
		assert.Equal(t, []string{"q/p1", "q/p2", "q/p3"}, gotOf(w), "p2's second within its window waits")
		waitWakes(t, w, 4)
		assert.Equal(t, "q/p2", gotOf(w)[3])
		assert.LessOrEqual(t, time.Since(start), WakeWindowDefault, "at the end of p2's window")
	})
}

// Each partition gets at most one wake-up per window, also when its
// held-back one is merged with another partition's whose window ends
// sooner: it goes at the end of its own window (still at most a window
// after it was named), not with the other's.
func TestWakeLimiter_MergedPartitionWaitsForTheEndOfItsOwnWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		window := WakeWindowDefault
		w, l := limiter(t, window)
		start := time.Now()
		l.wake("q", "p1")
		<-time.After(window / 2)
		l.wake("q", "p2")
		l.wake("q", "p1") // held to start+window
		l.wake("q", "p2") // held to start+1.5 windows
		waitWakes(t, w, 3)
		synctest.Wait()
		assert.Equal(t, []string{"q/p1", "q/p2", "q/p1"}, gotOf(w), "p1's at the end of its window, p2's not yet")
		assert.Equal(t, window, time.Since(start))
		waitWakes(t, w, 4)
		assert.Equal(t, "q/p2", gotOf(w)[3])
		assert.Equal(t, window+window/2, time.Since(start), "p2's at the end of its own window")
		<-time.After(time.Second)
		synctest.Wait()
		assert.Len(t, gotOf(w), 4, "nothing more")
		assert.Equal(t, int64(4), l.passes.Load())
	})
}

// The whole queue gets at most one wake-up (a pre-flight) per window, also
// when one naming it is merged into a wake-up held back for a partition
// whose window ends sooner: the merged one waits for the end of the
// queue's window (still at most a window after the partition was named,
// the queue's last having gone through before it).
func TestWakeLimiter_WholeQueueWaitsForTheEndOfItsOwnWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		window := WakeWindowDefault
		w, l := limiter(t, window)
		start := time.Now()
		l.wake("q", "p1")
		<-time.After(window / 2)
		l.wake("q", "") // the queue's window: to start+1.5 windows
		<-time.After(window / 4)
		named := time.Now()
		l.wake("q", "p1") // held to start+window
		l.wake("q", "")   // merged: the whole queue
		assert.Equal(t, []string{"q/p1", "q/"}, gotOf(w))
		waitWakes(t, w, 3)
		assert.Equal(t, []string{"q/p1", "q/", "q/"}, gotOf(w))
		assert.Equal(t, window+window/2, time.Since(start), "at the end of the queue's window, not p1's")
		assert.LessOrEqual(t, time.Since(named), window, "p1 waited at most a window")
		<-time.After(time.Second)
		synctest.Wait()
		assert.Len(t, gotOf(w), 3, "nothing more")
	})
}
