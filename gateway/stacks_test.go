package gateway

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Work given one after another runs on one kept goroutine; at most
// warmStacksKept are kept however much runs at once; close ends them and
// work given after it still runs.
func TestWarmStacks_KeepsAndEnds(t *testing.T) {
	p := newWarmStacks()
	for range 100 {
		ran := false
		p.do(func() { ran = true })
		require.True(t, ran)
		// Work given while the last is still on its way back to wait
		// starts a second goroutine: wait until it waits (idle counts it
		// a moment before its select receives, so one more may start).
		waitFor(t, func() bool { return p.idle.Load() == p.kept.Load() })
	}
	assert.LessOrEqual(t, p.kept.Load(), int32(3), "sequential work reuses its goroutines (without reuse: %d)", warmStacksKept)

	// More at once than are kept: every piece runs, the extra ones on
	// goroutines of their own.
	const n = 3 * warmStacksKept
	var started, done sync.WaitGroup
	release := make(chan struct{})
	started.Add(n)
	done.Add(n)
	for range n {
		p.goDo(func() {
			started.Done()
			<-release
			done.Done()
		})
	}
	waitGroup(t, &started)
	assert.Equal(t, int32(warmStacksKept), p.kept.Load())
	close(release)
	waitGroup(t, &done)

	p.close()
	assert.Equal(t, int32(0), p.kept.Load(), "close ends every kept goroutine")
	ran := make(chan struct{})
	p.goDo(func() { close(ran) })
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("work given after close did not run")
	}
	assert.Equal(t, int32(0), p.kept.Load(), "nothing is kept after close")

	var nilPool *warmStacks
	ok := false
	nilPool.do(func() { ok = true })
	assert.True(t, ok, "a nil pool runs work too")
	nilPool.close()
}

func waitGroup(t *testing.T, wg *sync.WaitGroup) {
	t.Helper()
	c := make(chan struct{})
	go func() { wg.Wait(); close(c) }()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatal("work did not finish within 10 s")
	}
}

// deep uses about 32 KiB of stack, as a frame's JSON and SQL calls do.
//
//go:noinline
func deep(n int) byte {
	var buf [512]byte
	buf[n%512] = byte(n)
	if n == 0 {
		return buf[0]
	}
	return deep(n-1) + buf[n%512]
}

// BenchmarkWarmStacks: deep work on a new goroutine each time (as before)
// against a kept one.
func BenchmarkWarmStacks(b *testing.B) {
	b.Run("new goroutine", func(b *testing.B) {
		for b.Loop() {
			done := make(chan struct{})
			go func() {
				deep(60)
				close(done)
			}()
			<-done
		}
	})
	b.Run("kept goroutine", func(b *testing.B) {
		p := newWarmStacks()
		defer p.close()
		for b.Loop() {
			p.do(func() { deep(60) })
		}
	})
}
