package queue

import (
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// partCache is the partition-id cache: an LRU of (queue, partition) → ids
// whose entries are trusted for a time to live, expired as they are read.
// It runs no goroutine and no timer (golang-lru's expirable LRU ticks every
// hundredth of its TTL for the life of the process, waking an idle
// instance for nothing). An expired entry not read again stays until the
// LRU evicts it; Len counts it meanwhile.
type partCache struct {
	lru *lru.Cache[partKey, partEntry]
	ttl time.Duration
}

type partEntry struct {
	ref     partRef
	expires time.Time
}

// newPartCache holds up to size entries (positive) for ttl each.
func newPartCache(size int, ttl time.Duration) *partCache {
	c, _ := lru.New[partKey, partEntry](size) // size is positive: no error
	return &partCache{lru: c, ttl: ttl}
}

// Get returns k's ids if held and not expired (an expired entry is
// dropped), marking it recently used.
func (c *partCache) Get(k partKey) (partRef, bool) {
	e, ok := c.lru.Get(k)
	if !ok {
		return partRef{}, false
	}
	if !time.Now().Before(e.expires) {
		c.lru.Remove(k)
		return partRef{}, false
	}
	return e.ref, true
}

// Peek is Get without marking the entry used or dropping it.
func (c *partCache) Peek(k partKey) (partRef, bool) {
	e, ok := c.lru.Peek(k)
	if !ok || !time.Now().Before(e.expires) {
		return partRef{}, false
	}
	return e.ref, true
}

// Add holds ref for k for the TTL from now; evicted says whether the
// oldest entry made room.
func (c *partCache) Add(k partKey, ref partRef) (evicted bool) {
	return c.lru.Add(k, partEntry{ref: ref, expires: time.Now().Add(c.ttl)})
}

// Remove drops k.
func (c *partCache) Remove(k partKey) { c.lru.Remove(k) }

// Keys lists the keys held, oldest first.
func (c *partCache) Keys() []partKey { return c.lru.Keys() }

// Len is how many entries are held.
func (c *partCache) Len() int { return c.lru.Len() }
