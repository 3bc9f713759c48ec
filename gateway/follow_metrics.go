package gateway

import "github.com/prometheus/client_golang/prometheus"

// followMetrics are the follow streams' series (no queue label: a
// follower count per queue is on /internal/api/status's followers).
type followMetrics struct {
	hubs      prometheus.Gauge
	followers prometheus.Gauge
	reads     prometheus.Counter
	delivered prometheus.Counter
	slow      prometheus.Counter
}

func newFollowMetrics(reg prometheus.Registerer) (*followMetrics, error) {
	m := &followMetrics{
		hubs: prometheus.NewGauge(prometheus.GaugeOpts{Name: "herald_follow_hubs",
			Help: "Queues this instance has followers of (one hub, one read per wake-up, each)."}),
		followers: prometheus.NewGauge(prometheus.GaugeOpts{Name: "herald_followers",
			Help: "Follow streams joined to a hub (SSE, WebSocket follows, waiting long-polls)."}),
		reads: prometheus.NewCounter(prometheus.CounterOpts{Name: "herald_follow_reads_total",
			Help: "Follow reads: a hub's for all its followers, and a follower's own while it catches up."}),
		delivered: prometheus.NewCounter(prometheus.CounterOpts{Name: "herald_follow_hub_messages_total",
			Help: "Messages hubs read and handed to their followers (counted once, whatever the followers)."}),
		slow: prometheus.NewCounter(prometheus.CounterOpts{Name: "herald_follow_slow_total",
			Help: "Followers closed because their buffer was full (4001 slow consumer)."}),
	}
	for _, c := range []prometheus.Collector{m.hubs, m.followers, m.reads, m.delivered, m.slow} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
