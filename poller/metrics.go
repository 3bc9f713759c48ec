package poller

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/heraldmq/herald/queue"
)

// woke counts a wake-up from source.
func (m *metrics) woke(source string) {
	m.wakeups.WithLabelValues(source).Inc()
	c, ok := m.wakeCounts.Load(source)
	if !ok {
		c, _ = m.wakeCounts.LoadOrStore(source, new(atomic.Uint64))
	}
	c.(*atomic.Uint64).Add(1)
}

type metrics struct {
	wakeCounts sync.Map // source → *atomic.Uint64, for Wakeups
	cycles     prometheus.Counter
	claims     prometheus.Counter
	preflight  prometheus.Histogram
	intentions prometheus.Gauge
	skipped    *prometheus.CounterVec
	wakeups    *prometheus.CounterVec
	double     prometheus.Counter
	delivered  prometheus.Counter
	handoffs   prometheus.Counter
	latency    prometheus.Histogram
	orphans    prometheus.Counter
	// parkedByRead: see handOnAfterRead.
	parkedByRead prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		cycles: prometheus.NewCounter(prometheus.CounterOpts{Name: "herald_poll_cycles_total",
			Help: "Poll cycles that ran a pre-flight."}),
		claims: prometheus.NewCounter(prometheus.CounterOpts{Name: "herald_poll_claims_total",
			Help: "Poll cycles that claimed from a queue's ready rows for its only subscription, with no pre-flight."}),
		preflight: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "herald_preflight_duration_seconds",
			Help: "Duration of the pre-flight availability query.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
		intentions: prometheus.NewGauge(prometheus.GaugeOpts{Name: "herald_intentions",
			Help: "Registered intentions (waiting long-polls and subscriptions)."}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "herald_intentions_skipped_total",
			Help: "Intentions a cycle could not serve, by reason; skipping costs no query."}, []string{"reason"}),
		wakeups: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "herald_wakeups_total",
			Help: "Wake-ups received, by source."}, []string{"source"}),
		double: prometheus.NewCounter(prometheus.CounterOpts{Name: "herald_double_assignment_total",
			Help: "A (partition, group) assigned twice in one cycle. Must stay 0."}),
		delivered: prometheus.NewCounter(prometheus.CounterOpts{Name: "herald_poll_deliveries_total",
			Help: "Leased batches handed to waiting consumers."}),
		handoffs: prometheus.NewCounter(prometheus.CounterOpts{Name: "herald_handoffs_total",
			Help: "Batches a push leased to a waiting consumer in its own transaction (no pop of their own)."}),
		// 1 ms to 9 min: a wake-up delivery takes milliseconds, a sweep's
		// up to its interval, a backlog's minutes.
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "herald_delivery_latency_seconds",
			Help:    "From a message's creation (the database clock) to its first delivery to a waiting consumer (this instance's clock).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 20)}),
		orphans: prometheus.NewCounter(prometheus.CounterOpts{Name: "herald_orphaned_leases_total",
			Help: "Lease ids given back because the statement that took them lost its answer (or their release failed)."}),
		parkedByRead: prometheus.NewCounter(prometheus.CounterOpts{Name: "herald_follow_parked_by_read_total",
			Help: "Deliveries under a stream's following lease, parked behind offsets not yet delivered, that a read-back of the lease handed on rather than the delivery before them (a gap in the hand-off order). 0 unless a push's answer was lost."}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.cycles, m.claims, m.preflight, m.intentions, m.skipped, m.wakeups, m.double, m.delivered, m.handoffs,
		m.latency, m.orphans, m.parkedByRead} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// observeDelivered records each first delivery's age; redeliveries would
// measure the retry delay and lease time, not the path.
func (m *metrics) observeDelivered(res *queue.PopResult, now time.Time) {
	for _, msg := range res.Messages {
		if msg.RetryCount == 0 && !msg.CreatedAt.IsZero() {
			m.latency.Observe(max(now.Sub(msg.CreatedAt).Seconds(), 0))
		}
	}
}
