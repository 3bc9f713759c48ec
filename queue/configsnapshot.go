package queue

import (
	"maps"
	"sync"
	"sync/atomic"
)

// ConfigSnapshot is the ConfigCache the store uses unless given another: a
// bounded copy-on-write map, since queue settings are read on every request
// and written rarely. A read is one atomic load and a map lookup, with no
// lock; a write copies the map under a mutex and publishes the copy. When
// full, a write evicts an arbitrary entry: the cache is advisory, and a
// miss only costs a lookup in the database.
type ConfigSnapshot struct {
	max int
	mu  sync.Mutex // serialises writers
	cur atomic.Pointer[map[string]QueueInfo]

	hits, misses, evictions atomic.Uint64
}

// NewConfigCache returns an empty ConfigSnapshot of ConfigCacheSize
// entries, for Config.Configs when the caller wants its stats.
func NewConfigCache() *ConfigSnapshot { return newConfigSnapshot(ConfigCacheSize) }

// newConfigSnapshot returns an empty ConfigSnapshot holding at most max
// entries (zero: no bound).
func newConfigSnapshot(max int) *ConfigSnapshot {
	s := &ConfigSnapshot{max: max}
	m := map[string]QueueInfo{}
	s.cur.Store(&m)
	return s
}

// Get returns the cached value of key, counting a hit or a miss.
func (s *ConfigSnapshot) Get(key string) (QueueInfo, bool) {
	v, ok := (*s.cur.Load())[key]
	if ok {
		s.hits.Add(1)
	} else {
		s.misses.Add(1)
	}
	return v, ok
}

// Peek is Get without counting.
func (s *ConfigSnapshot) Peek(key string) (QueueInfo, bool) {
	v, ok := (*s.cur.Load())[key]
	return v, ok
}

// Set stores v under key; accept, when not nil, is asked with the cached
// value (if any) and may refuse the write (v is an older version).
func (s *ConfigSnapshot) Set(key string, v QueueInfo, accept func(old QueueInfo) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.cur.Load()
	if o, ok := old[key]; ok && accept != nil && !accept(o) {
		return
	}
	next := make(map[string]QueueInfo, len(old)+1)
	maps.Copy(next, old)
	if _, ok := next[key]; !ok && s.max > 0 && len(next) >= s.max {
		for k := range next { // map order is random enough
			delete(next, k)
			s.evictions.Add(1)
			break
		}
	}
	next[key] = v
	s.cur.Store(&next)
}

// Delete removes key.
func (s *ConfigSnapshot) Delete(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.cur.Load()
	if _, ok := old[key]; !ok {
		return
	}
	next := maps.Clone(old)
	delete(next, key)
	s.cur.Store(&next)
}

// Keys returns the cached keys.
func (s *ConfigSnapshot) Keys() []string {
	m := *s.cur.Load()
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

// Replace publishes fresh values for the given keys and drops the keys in
// gone, in one copy (a periodic refresh from the database).
func (s *ConfigSnapshot) Replace(fresh map[string]QueueInfo, gone []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := maps.Clone(*s.cur.Load())
	maps.Copy(next, fresh)
	for _, k := range gone {
		delete(next, k)
	}
	s.cur.Store(&next)
}

// Len is the number of cached entries.
func (s *ConfigSnapshot) Len() int { return len(*s.cur.Load()) }

// CacheStats are an advisory cache's counters (the config cache, the
// partition id cache).
type CacheStats struct {
	Entries   int    `json:"entries"`
	Max       int    `json:"max"`
	Hits      uint64 `json:"hits"`
	Misses    uint64 `json:"misses"`
	Evictions uint64 `json:"evictions"`
	// HitRate is hits / lookups; 0 before any lookup.
	HitRate float64 `json:"hitRate"`
}

// Stats reports the counters.
func (s *ConfigSnapshot) Stats() CacheStats {
	st := CacheStats{Entries: s.Len(), Max: s.max, Hits: s.hits.Load(), Misses: s.misses.Load(),
		Evictions: s.evictions.Load()}
	st.HitRate = HitRate(st.Hits, st.Misses)
	return st
}

// HitRate is hits / (hits + misses), 0 when both are 0.
func HitRate(hits, misses uint64) float64 {
	if hits+misses == 0 {
		return 0
	}
	return float64(hits) / float64(hits+misses)
}
