package gateway

import (
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/heraldmq/herald/internal/httpapi"
)

// Push and ack rates for the console's sparklines: per queue, messages
// pushed and acknowledged on this instance in each of the last
// RateSamples intervals of RateInterval, kept in memory where the
// gateway counts them for /metrics (afterPush, afterAck). Queues are the
// metrics' label values (a LabelLimiter), so the memory is bounded: at
// most --metrics-max-queues rings plus one for "__other__". No goroutine:
// a ring's slot is reset when a count or a read finds it holding an older
// interval.

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

// rates holds a ring per queue label.
type rates struct {
	queues *LabelLimiter
	now    func() time.Time
	mu     sync.Mutex
	rings  map[string]*rateRing
}

func newRates(queues *LabelLimiter) *rates {
	return &rates{queues: queues, now: time.Now, rings: map[string]*rateRing{}}
}

func bucketOf(t time.Time) int64 { return t.UnixNano() / int64(RateInterval) }

// add counts pushed and acked messages of queue q now.
func (r *rates) add(q string, pushed, acked int64) {
	if pushed == 0 && acked == 0 {
		return
	}
	q = r.queues.Value(q)
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

// queueRates is one queue's samples, oldest first; the last is the
// interval in progress.
type queueRates struct {
	Queue  string  `json:"queue"`
	Pushed []int64 `json:"pushed"`
	Acked  []int64 `json:"acked"`
}

// snapshot returns every queue's samples ending with the interval now in
// progress, by queue name, and when the first sample's interval began.
func (r *rates) snapshot(keep func(string) bool) (since time.Time, out []queueRates) {
	last := bucketOf(r.now())
	first := last - RateSamples + 1
	out = []queueRates{}
	r.mu.Lock()
	defer r.mu.Unlock()
	for q, ring := range r.rings {
		if !keep(q) {
			continue
		}
		qr := queueRates{Queue: q, Pushed: make([]int64, RateSamples), Acked: make([]int64, RateSamples)}
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

// handleRates answers GET /api/v1/status/rates: this instance's samples.
// ?queue= narrows to one queue; a token with rights sees the queues it may
// consume whole.
func (s *Server) handleRates(w http.ResponseWriter, r *http.Request) error {
	only := r.URL.Query().Get("queue")
	rights := rightsOf(r.Context())
	since, qs := s.metrics.rates.snapshot(func(q string) bool {
		return (only == "" || q == only) && rights.MayConsume(q, "")
	})
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{"instance": s.cfg.Instance, "intervalSeconds": int(RateInterval / time.Second),
		"samples": RateSamples, "since": httpapi.FormatMilli(since), "queues": qs})
	return nil
}
