package gateway

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/heraldmq/herald/queue"
)

// metrics are the herald_* series. Labels are routes, queues, groups and
// statuses, never ids, so cardinality stays bounded by configuration.
type metrics struct {
	requests    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	pushed      *prometheus.CounterVec
	duplicates  *prometheus.CounterVec
	popped      *prometheus.CounterVec
	acks        *prometheus.CounterVec
	dlq         *prometheus.CounterVec
	wsBadFrames prometheus.Counter

	wsConns        prometheus.Gauge
	sseStreams     prometheus.Gauge
	sseRefused     prometheus.Counter
	sseResumedAcks prometheus.Counter
	authFailures   *prometheus.CounterVec
	slowBodies     prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, store *queue.Store) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "herald_http_requests_total",
			Help: "HTTP requests by route, method and status code."}, []string{"route", "method", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "herald_http_request_duration_seconds",
			Help: "HTTP request duration by route (long-polls include their wait).", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18)},
			[]string{"route"}),
		pushed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "herald_messages_pushed_total",
			Help: "Messages stored by push."}, []string{"queue"}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "herald_messages_duplicate_total",
			Help: "Pushed items not stored because their transactionId existed."}, []string{"queue"}),
		popped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "herald_messages_popped_total",
			Help: "Messages delivered by pop."}, []string{"queue", "group"}),
		acks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "herald_acks_total",
			Help: "Successful acknowledgements by status."}, []string{"queue", "status"}),
		dlq: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "herald_messages_dead_lettered_total",
			Help: "Messages moved to the dead-letter queue (by an ack, or by a pop after too many expired leases)."}, []string{"queue"}),
	}
	m.wsBadFrames = prometheus.NewCounter(prometheus.CounterOpts{Name: "herald_ws_bad_frames_total",
		Help: "WebSocket frames that were not the protocol (answered with an error frame)."})
	m.wsConns = prometheus.NewGauge(prometheus.GaugeOpts{Name: "herald_ws_connections",
		Help: "Open WebSocket connections."})
	m.sseStreams = prometheus.NewGauge(prometheus.GaugeOpts{Name: "herald_sse_streams",
		Help: "Open SSE (EventSource) streams."})
	m.sseRefused = prometheus.NewCounter(prometheus.CounterOpts{Name: "herald_sse_refused_total",
		Help: "SSE connections answered with retry: and closed (overloaded or draining)."})
	m.sseResumedAcks = prometheus.NewCounter(prometheus.CounterOpts{Name: "herald_sse_resumed_acks_total",
		Help: "Messages acknowledged by an SSE reconnect's Last-Event-ID."})
	m.authFailures = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "herald_auth_failures_total",
		Help: "Requests refused by authentication (401) or by role (403)."}, []string{"reason"})
	m.slowBodies = prometheus.NewCounter(prometheus.CounterOpts{Name: "herald_http_slow_body_total",
		Help: "Requests whose body was not received within the body read timeout (answered 408, connection closed)."})
	cs := []prometheus.Collector{m.slowBodies, m.requests, m.duration, m.pushed, m.duplicates, m.popped, m.acks, m.dlq, m.wsBadFrames,
		m.wsConns, m.sseStreams, m.sseRefused, m.sseResumedAcks, m.authFailures}
	pool := store.Pool()
	gauge := func(name, help string, f func() float64) {
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f))
	}
	gauge("herald_db_pool_total_conns", "Connections in the database pool.", func() float64 { return float64(pool.Stat().TotalConns()) })
	gauge("herald_db_pool_acquired_conns", "Pool connections in use.", func() float64 { return float64(pool.Stat().AcquiredConns()) })
	gauge("herald_db_pool_idle_conns", "Idle pool connections.", func() float64 { return float64(pool.Stat().IdleConns()) })
	gauge("herald_db_pool_max_conns", "Pool size limit.", func() float64 { return float64(pool.Stat().MaxConns()) })
	cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "herald_db_pool_acquires_total",
		Help: "Connections acquired from the pool."}, func() float64 { return float64(pool.Stat().AcquireCount()) }))
	cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "herald_db_pool_empty_acquires_total",
		Help: "Acquires that had to wait for a connection."}, func() float64 { return float64(pool.Stat().EmptyAcquireCount()) }))
	if stats := store.QueryStats(); stats != nil {
		cs = append(cs, queryCollector{stats: stats, desc: prometheus.NewDesc("herald_db_queries_total",
			"Statements sent to the database, by operation (every query, batch member, begin and commit).",
			[]string{"op"}, nil)})
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) observeRequest(route, method string, status int, d time.Duration) {
	m.requests.WithLabelValues(route, method, strconv.Itoa(status)).Inc()
	m.duration.WithLabelValues(route).Observe(d.Seconds())
}

// queryCollector exposes queue.QueryStats, which a pgx tracer keeps, as
// herald_db_queries_total{op}.
type queryCollector struct {
	stats *queue.QueryStats
	desc  *prometheus.Desc
}

func (c queryCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c queryCollector) Collect(ch chan<- prometheus.Metric) {
	for op, n := range c.stats.Snapshot() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(n), op)
	}
}
