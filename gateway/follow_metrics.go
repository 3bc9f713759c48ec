package gateway

import (
	"maps"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

// followMetrics are the follow streams' series. herald_followers{queue}
// is counted at scrape time from the hubs (followersCollector).
type followMetrics struct {
	hubs      prometheus.Gauge
	reads     prometheus.Counter
	delivered prometheus.Counter
	slow      prometheus.Counter
}

func newFollowMetrics(reg prometheus.Registerer, followers prometheus.Collector) (*followMetrics, error) {
	m := &followMetrics{
		hubs: newGauge("herald_follow_hubs", "Queues this instance has followers of (one hub, one read per wake-up, each)."),
		reads: newCounter("herald_follow_reads_total",
			"Follow reads: a hub's for all its followers, and a follower's own while it catches up."),
		delivered: newCounter("herald_follow_hub_messages_total",
			"Messages hubs read and handed to their followers (counted once, whatever the followers)."),
		slow: newCounter("herald_follow_slow_total", "Followers closed because their buffer was full (4001 slow consumer)."),
	}
	if err := register(reg, m.hubs, followers, m.reads, m.delivered, m.slow); err != nil {
		return nil, err
	}
	return m, nil
}

// followersCollector is herald_followers{queue}: this instance's followers
// per queue, counted when scraped; queues past the label bound
// (--metrics-max-queues) are summed under OtherLabel.
type followersCollector struct {
	desc   *prometheus.Desc
	queues *LabelLimiter
	count  func() map[string]int
}

func newFollowersCollector(queues *LabelLimiter, count func() map[string]int) *followersCollector {
	return &followersCollector{queues: queues, count: count, desc: prometheus.NewDesc("herald_followers",
		"Follow streams joined to a hub (SSE, WebSocket follows, waiting long-polls), per queue.", []string{"queue"}, nil)}
}

func (c *followersCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *followersCollector) Collect(ch chan<- prometheus.Metric) {
	count := c.count()
	sums := map[string]int{}
	// In name order, so that the queues a scrape names first are not
	// drawn by map order.
	for _, q := range slices.Sorted(maps.Keys(count)) {
		sums[c.queues.Value(q)] += count[q]
	}
	for q, n := range sums {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), q)
	}
}
