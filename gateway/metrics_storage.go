package gateway

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/heraldmq/herald/queue"
)

// The series of the store's own loops (retention, hygiene): the loops run
// in queue, and report what they did to these functions, so that every
// series of /metrics is defined where /metrics is served.

// RetentionMetrics registers herald_retention_deleted_total{queue,reason}
// and returns what the retention loop reports each run to. Queue label
// values go through queues (nil: a limiter of
// MetricsMaxQueuesDefault), so /metrics stays bounded however many
// queues retention touches.
func RetentionMetrics(reg prometheus.Registerer, queues *LabelLimiter) func([]queue.RetentionDeleted) {
	if queues == nil {
		queues = NewLabelLimiter(MetricsMaxQueuesDefault)
	}
	deleted := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "herald_retention_deleted_total",
		Help: "What retention removed, by queue and reason: messages (retention, ttl, completed_retention), messages moved to the DLQ (max_wait) or dropped for want of one (max_wait_dropped), partitions (partition_cleanup), idle consumer groups (idle_group)."}, []string{"queue", "reason"})
	reg.MustRegister(deleted)
	return func(ds []queue.RetentionDeleted) {
		for _, d := range ds {
			deleted.WithLabelValues(queues.Value(d.Queue), d.Reason).Add(float64(d.N))
		}
	}
}

// HygieneMetrics registers the storage gauges (herald_table_bytes,
// herald_table_dead_rows, herald_table_live_rows by table;
// herald_xmin_age, herald_xmin_held_seconds,
// herald_replication_slot_retained_bytes,
// herald_replication_slots_inactive), the backlog gauges by queue and group
// (herald_consumer_lag_messages, herald_consumer_lag_partitions,
// herald_oldest_pending_age_seconds, herald_dead_letters) and returns what
// the hygiene loop reports each sample to. Queue and group label values
// are bounded as those of MetricsConfig (cfg.Queues, cfg.GroupLabels);
// pairs that share a label value add up (the age takes the oldest).
func HygieneMetrics(reg prometheus.Registerer, cfg MetricsConfig) func(*queue.Hygiene) {
	bytes := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "herald_table_bytes",
		Help: "Size of Herald's tables with indexes and TOAST."}, []string{"table"})
	dead := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "herald_table_dead_rows",
		Help: "Dead rows waiting for vacuum, by table."}, []string{"table"})
	live := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "herald_table_live_rows",
		Help: "Live rows, by table (PostgreSQL's estimate)."}, []string{"table"})
	xminAge := newGauge("herald_xmin_age", "Age in transactions of the oldest snapshot a session or replication slot holds.")
	xminHeld := newGauge("herald_xmin_held_seconds", "How long the oldest transaction holding a snapshot has been open.")
	slotBytes := newGauge("herald_replication_slot_retained_bytes",
		"WAL the replication slot furthest behind keeps on disk (0 without slots).")
	slotsInactive := newGauge("herald_replication_slots_inactive",
		"Replication slots no client streams from: each keeps WAL and the catalog xmin until dropped.")
	backlog := newBacklogCollector(cfg)
	reg.MustRegister(bytes, dead, live, xminAge, xminHeld, slotBytes, slotsInactive, backlog)
	return func(h *queue.Hygiene) {
		for name, t := range h.Tables {
			bytes.WithLabelValues(name).Set(float64(t.Bytes))
			dead.WithLabelValues(name).Set(float64(t.Dead))
			live.WithLabelValues(name).Set(float64(t.Live))
		}
		xminAge.Set(float64(h.OldestXminAge))
		xminHeld.Set(h.OldestXminHeld.Seconds())
		slotBytes.Set(float64(h.SlotRetainedBytes))
		slotsInactive.Set(float64(h.InactiveSlots))
		backlog.set(h)
	}
}

// backlogCollector serves the backlog figures of the last hygiene sample.
// A sample replaces the whole set at once, so a pair that caught up (or
// left the queue.BacklogTop) disappears rather than keeping its last
// value, and a scrape never sees half of one sample and half of another.
type backlogCollector struct {
	queues               *LabelLimiter
	group                func(string) string
	lag, parts, age, dlq *prometheus.Desc

	mu   sync.Mutex
	last []prometheus.Metric
}

func newBacklogCollector(cfg MetricsConfig) *backlogCollector {
	queues := cfg.Queues
	if queues == nil {
		queues = NewLabelLimiter(MetricsMaxQueuesDefault)
	}
	labels := []string{"queue", "group"}
	return &backlogCollector{queues: queues, group: groupLabel(cfg, queues),
		lag: prometheus.NewDesc("herald_consumer_lag_messages",
			"Messages a consumer group has not finished in a queue, for the pairs with the most (absent: nothing waits). Sampled every 30 s.",
			labels, nil),
		parts: prometheus.NewDesc("herald_consumer_lag_partitions",
			"Partitions holding messages a consumer group has not finished. Sampled every 30 s.", labels, nil),
		age: prometheus.NewDesc("herald_oldest_pending_age_seconds",
			"Age of the oldest message a consumer group has not finished (a lower bound past 1,000 partitions waiting). Sampled every 30 s.",
			labels, nil),
		dlq: prometheus.NewDesc("herald_dead_letters",
			"Messages in the dead-letter queue, by queue and group. Sampled every 30 s.", labels, nil)}
}

func (c *backlogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.lag
	ch <- c.parts
	ch <- c.age
	ch <- c.dlq
}

func (c *backlogCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	last := c.last
	c.mu.Unlock()
	for _, m := range last {
		ch <- m
	}
}

// set replaces the figures with those of h, adding up the pairs that
// share label values.
func (c *backlogCollector) set(h *queue.Hygiene) {
	type pair struct{ queue, group string }
	lag, parts, age, dlq := map[pair]float64{}, map[pair]float64{}, map[pair]float64{}, map[pair]float64{}
	for _, b := range h.Backlog {
		k := pair{c.queues.Value(b.Queue), c.group(b.Group)}
		lag[k] += float64(b.Waiting)
		parts[k] += float64(b.Partitions)
		age[k] = max(age[k], b.OldestAge.Seconds())
	}
	for _, d := range h.DeadLetters {
		dlq[pair{c.queues.Value(d.Queue), c.group(d.Group)}] += float64(d.N)
	}
	var ms []prometheus.Metric
	for _, s := range []struct {
		desc *prometheus.Desc
		vals map[pair]float64
	}{{c.lag, lag}, {c.parts, parts}, {c.age, age}, {c.dlq, dlq}} {
		for k, v := range s.vals {
			ms = append(ms, prometheus.MustNewConstMetric(s.desc, prometheus.GaugeValue, v, k.queue, k.group))
		}
	}
	c.mu.Lock()
	c.last = ms
	c.mu.Unlock()
}
