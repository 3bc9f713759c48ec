package benchstat

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPace_PushesEachOnItsSchedule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var mu sync.Mutex
		at := map[int]time.Duration{}
		n, err := Pace(t.Context(), 10, 5, func(_ context.Context, i int) error {
			mu.Lock()
			defer mu.Unlock()
			at[i] = time.Since(start)
			return nil
		})
		require.NoError(t, err)
		assert.Equal(t, 5, n)
		for i := range 5 {
			assert.Equal(t, time.Duration(i)*100*time.Millisecond, at[i], "push %d", i)
		}
	})
}

func TestPace_ASlowPushDoesNotDelayTheNext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var mu sync.Mutex
		var second time.Duration
		release := make(chan struct{})
		_, err := Pace(t.Context(), 10, 2, func(_ context.Context, i int) error {
			if i == 0 {
				// The push is slow: it lasts until the next one ran (a
				// second of the bubble's clock at most).
				select {
				case <-release:
				case <-time.After(time.Second):
				}
				return nil
			}
			mu.Lock()
			defer mu.Unlock()
			second = time.Since(start)
			close(release)
			return nil
		})
		require.NoError(t, err)
		assert.Equal(t, 100*time.Millisecond, second)
	})
}

func TestPace_ReturnsAPushError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		boom := errors.New("boom")
		n, err := Pace(t.Context(), 100, 3, func(_ context.Context, i int) error {
			if i == 1 {
				return boom
			}
			return nil
		})
		assert.Equal(t, 3, n, "the other pushes still run")
		assert.ErrorIs(t, err, boom)
	})
}

func TestPace_StopsWhenTheContextEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 250*time.Millisecond)
		defer cancel()
		n, err := Pace(ctx, 10, 100, func(context.Context, int) error { return nil })
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, 3, n, "pushes due at 0, 100 and 200 ms")
	})
}

func TestPool_RunsEveryJobFedAndReturnsTheFirstErrorOnceAllReturned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		boom := errors.New("boom")
		var mu sync.Mutex
		ran := map[int]bool{}
		failed := make(chan struct{}) // closed as the first failing job returns: the later ones return after it
		p := NewPool(t.Context(), 3, 0, func(_ context.Context, i int) error {
			if i > 4 {
				<-failed
			}
			mu.Lock()
			defer mu.Unlock()
			ran[i] = true
			if i == 4 {
				defer close(failed)
			}
			if i >= 4 {
				return boom
			}
			return nil
		})
		for i := range 8 {
			p.Feed(i)
		}
		require.ErrorIs(t, p.Wait(), boom)
		assert.Len(t, ran, 8, "every job fed ran before Wait returned, failing ones too")
	})
}
