package history

import (
	"sort"
	"sync"
	"time"
)

// RateInterval and RateSamples: 30 samples of 10 s, five minutes.
const (
	RateInterval = 10 * time.Second
	RateSamples  = 30
)

// rateSlot is one interval's counts; bucket numbers the interval since the
// epoch, so a slot left from an older lap of the ring is recognised.
type rateSlot struct {
	bucket        int64
	pushed, acked int64
}

type rateRing [RateSamples]rateSlot

// Rates are the push and ack rates for the console's sparklines
// (GET /api/v1/status/rates, admin/analytics.go): per queue, messages
// pushed and acknowledged on this instance in each of the last
// RateSamples intervals of RateInterval, kept in memory where the
// gateway counts them for /metrics (its afterPush, afterAck). Queues are
// the metrics' label values, so the memory is bounded: at most
// --metrics-max-queues rings plus one for "__other__". No goroutine: a
// ring's slot is reset when a count or a read finds it holding an older
// interval. Safe for concurrent use.
type Rates struct {
	label func(string) string
	now   func() time.Time
	mu    sync.Mutex
	rings map[string]*rateRing // by queue label
}

// NewRates returns empty rates; label gives a queue's name as they keep
// it (the metrics' label limiter).
func NewRates(label func(string) string) *Rates {
	return &Rates{label: label, now: time.Now, rings: map[string]*rateRing{}}
}

func bucketOf(t time.Time) int64 { return t.UnixNano() / int64(RateInterval) }

// Add counts pushed and acked messages of queue q now.
func (r *Rates) Add(q string, pushed, acked int64) {
	if pushed == 0 && acked == 0 {
		return
	}
	q = r.label(q)
	b := bucketOf(r.now())
	r.mu.Lock()
	defer r.mu.Unlock()
	ring := r.rings[q]
	if ring == nil {
		ring = &rateRing{}
		r.rings[q] = ring
	}
	s := &ring[b%RateSamples]
	if s.bucket != b {
		*s = rateSlot{bucket: b}
	}
	s.pushed += pushed
	s.acked += acked
}

// QueueRates is one queue's samples, oldest first; the last is the
// interval in progress.
type QueueRates struct {
	Queue  string  `json:"queue"`
	Pushed []int64 `json:"pushed"`
	Acked  []int64 `json:"acked"`
}

// Snapshot returns the samples of every queue keep keeps, ending with the
// interval now in progress, by queue name, and when the first sample's
// interval began.
func (r *Rates) Snapshot(keep func(string) bool) (since time.Time, out []QueueRates) {
	last := bucketOf(r.now())
	first := last - RateSamples + 1
	out = []QueueRates{}
	r.mu.Lock()
	defer r.mu.Unlock()
	for q, ring := range r.rings {
		if !keep(q) {
			continue
		}
		qr := QueueRates{Queue: q, Pushed: make([]int64, RateSamples), Acked: make([]int64, RateSamples)}
		for i := range RateSamples {
			b := first + int64(i)
			if s := ring[b%RateSamples]; s.bucket == b {
				qr.Pushed[i], qr.Acked[i] = s.pushed, s.acked
			}
		}
		out = append(out, qr)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Queue < out[j].Queue })
	return time.Unix(0, first*int64(RateInterval)).UTC(), out
}
