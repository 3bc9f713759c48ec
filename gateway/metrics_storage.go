package gateway

import (
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
		Help: "What retention removed, by queue and reason: messages (retention, completed_retention), messages moved to the DLQ (max_wait), partitions (partition_cleanup)."}, []string{"queue", "reason"})
	reg.MustRegister(deleted)
	return func(ds []queue.RetentionDeleted) {
		for _, d := range ds {
			deleted.WithLabelValues(queues.Value(d.Queue), d.Reason).Add(float64(d.N))
		}
	}
}

// HygieneMetrics registers the storage gauges (herald_table_bytes,
// herald_table_dead_rows, herald_table_live_rows by table;
// herald_xmin_age and herald_xmin_held_seconds) and returns what the
// hygiene loop reports each sample to.
func HygieneMetrics(reg prometheus.Registerer) func(*queue.Hygiene) {
	bytes := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "herald_table_bytes",
		Help: "Size of Herald's tables with indexes and TOAST."}, []string{"table"})
	dead := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "herald_table_dead_rows",
		Help: "Dead rows waiting for vacuum, by table."}, []string{"table"})
	live := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "herald_table_live_rows",
		Help: "Live rows, by table (PostgreSQL's estimate)."}, []string{"table"})
	xminAge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "herald_xmin_age",
		Help: "Age in transactions of the oldest snapshot a session or replication slot holds."})
	xminHeld := prometheus.NewGauge(prometheus.GaugeOpts{Name: "herald_xmin_held_seconds",
		Help: "How long the oldest transaction holding a snapshot has been open."})
	reg.MustRegister(bytes, dead, live, xminAge, xminHeld)
	return func(h *queue.Hygiene) {
		for name, t := range h.Tables {
			bytes.WithLabelValues(name).Set(float64(t.Bytes))
			dead.WithLabelValues(name).Set(float64(t.Dead))
			live.WithLabelValues(name).Set(float64(t.Live))
		}
		xminAge.Set(float64(h.OldestXminAge))
		xminHeld.Set(h.OldestXminHeld.Seconds())
	}
}
