package queue

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
)

// v is a cached entry told apart by its version.
func v(n int64) QueueInfo { return QueueInfo{ID: "id", Version: n} }

func TestConfigSnapshot(t *testing.T) {
	s := newConfigSnapshot(3)
	_, ok := s.Get("a")
	assert.False(t, ok)
	s.Set("a", v(1), nil)
	got, ok := s.Get("a")
	assert.True(t, ok)
	assert.Equal(t, v(1), got)

	s.Set("a", v(0), newer(v(0)))
	got, _ = s.Peek("a")
	assert.Equal(t, v(1), got, "an older version is refused")
	s.Set("a", v(2), newer(v(2)))
	got, _ = s.Peek("a")
	assert.Equal(t, v(2), got)

	s.Set("b", v(1), nil)
	s.Set("c", v(1), nil)
	s.Set("d", v(1), nil) // full: one entry goes
	assert.Equal(t, 3, s.Len())
	_, ok = s.Peek("d")
	assert.True(t, ok)

	s.Replace(map[string]QueueInfo{"d": v(9)}, []string{"b", "c", "a"})
	assert.ElementsMatch(t, []string{"d"}, s.Keys())
	s.Delete("d")
	s.Delete("d")
	assert.Zero(t, s.Len())
	assert.Equal(t, CacheStats{Max: 3, Hits: 1, Misses: 1, Evictions: 1, HitRate: 0.5}, s.Stats())
}

func TestNewConfigCache_IsBounded(t *testing.T) {
	assert.Equal(t, ConfigCacheSize, NewConfigCache().Stats().Max)
}

// Readers never block on, nor see a half-made, write (go test -race).
func TestConfigSnapshot_ConcurrentReaders(t *testing.T) {
	s := newConfigSnapshot(0)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if got, ok := s.Get("k"); ok {
					assert.GreaterOrEqual(t, got.Version, int64(0))
				}
			}
		})
	}
	for i := range 1000 {
		s.Set("k", v(int64(i)), nil)
	}
	close(stop)
	wg.Wait()
	got, _ := s.Peek("k")
	assert.Equal(t, v(999), got)
}

func TestHitRate(t *testing.T) {
	assert.Zero(t, HitRate(0, 0), "no lookup yet")
	assert.Equal(t, 0.75, HitRate(3, 1))
}
