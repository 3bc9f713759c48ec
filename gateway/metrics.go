package gateway

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/internal/history"
	"github.com/heraldmq/herald/queue"
)

// MetricsMaxQueuesDefault is how many distinct queues get a queue label
// value of their own by default (--metrics-max-queues).
const MetricsMaxQueuesDefault = 100

// OtherLabel is the label value shared by every queue (or consumer group)
// past a LabelLimiter's bound.
const OtherLabel = "__other__"

// MetricsConfig bounds the label values of the herald_* series and may
// guard /metrics. The zero value keeps at most MetricsMaxQueuesDefault
// queues apart, puts no group names in labels and leaves /metrics open.
type MetricsConfig struct {
	// Queues gives every queue label value: the first distinct queues up
	// to its bound are named, the rest are OtherLabel. nil means
	// NewLabelLimiter(MetricsMaxQueuesDefault). cmd/herald shares one with
	// herald_retention_deleted_total, so both name the same queues.
	Queues *LabelLimiter
	// GroupLabels puts consumer group names in the group label of
	// herald_messages_popped_total, bounded as the queues are. Off (the
	// default) queue mode is "__QUEUE_MODE__" and every named group
	// OtherLabel: a consumer cannot add series by inventing group names.
	GroupLabels bool
	// Auth requires a token with role admin on /metrics when Config.Auth
	// is set (401 without one, 403 with a lesser role). Off (the default)
	// /metrics is open, as a Prometheus without a token expects; without
	// Config.Auth there is nothing to check it with and it stays open.
	Auth bool
}

// role is the least role /metrics needs.
func (c MetricsConfig) role() auth.Role {
	if c.Auth {
		return auth.RoleAdmin
	}
	return auth.RoleNone
}

// LabelLimiter bounds the values a label takes: the first Max distinct
// values it sees keep their name, every later one is OtherLabel. Names are
// kept for the process's life (counters never forget a series either).
// Safe for concurrent use.
type LabelLimiter struct {
	max   int
	mu    sync.RWMutex
	named map[string]struct{}
}

// NewLabelLimiter returns a LabelLimiter naming at most max values; zero
// or less names none.
func NewLabelLimiter(max int) *LabelLimiter {
	return &LabelLimiter{max: max, named: map[string]struct{}{}}
}

// Max is the bound.
func (l *LabelLimiter) Max() int { return l.max }

// Value is v if v is one of the named values (naming it if there is room),
// else OtherLabel.
func (l *LabelLimiter) Value(v string) string {
	if v == OtherLabel {
		return v
	}
	l.mu.RLock()
	_, ok := l.named[v]
	full := len(l.named) >= l.max
	l.mu.RUnlock()
	if ok {
		return v
	}
	if full {
		return OtherLabel
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.named[v]; !ok {
		if len(l.named) >= l.max {
			return OtherLabel
		}
		l.named[v] = struct{}{}
	}
	return v
}

// queueCounter is a CounterVec whose first label is a queue, passed
// through the limiter, so the handlers give raw names.
type queueCounter struct {
	vec    *prometheus.CounterVec
	queues *LabelLimiter
	// second maps the second label value; nil passes it through (a fixed
	// set, such as an ack's status).
	second func(string) string
}

func (c queueCounter) WithLabelValues(q string, more ...string) prometheus.Counter {
	lv := append([]string{c.queues.Value(q)}, more...)
	if c.second != nil && len(lv) > 1 {
		lv[1] = c.second(lv[1])
	}
	return c.vec.WithLabelValues(lv...)
}

// groupLabel maps a pop's consumer group to its label value: queue mode
// keeps its fixed name; named groups go through a limiter as bounded as
// the queues' with GroupLabels, else they are all OtherLabel.
func groupLabel(cfg MetricsConfig, queues *LabelLimiter) func(string) string {
	groups := NewLabelLimiter(0)
	if cfg.GroupLabels {
		groups = NewLabelLimiter(queues.Max())
	}
	return func(g string) string {
		if g == queue.DefaultGroup {
			return g
		}
		return groups.Value(g)
	}
}

// metrics are the herald_* series. Labels are routes, methods, statuses,
// and queues and groups through a LabelLimiter, never ids, so cardinality
// stays bounded by configuration.
type metrics struct {
	requests    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	pushed      queueCounter
	duplicates  queueCounter
	popped      queueCounter
	acks        queueCounter
	dlq         queueCounter
	dropped     queueCounter
	expired     queueCounter
	dlqReplayed queueCounter
	dlqPurged   queueCounter
	// What the admin's analytics and rates routes read (admin/analytics.go):
	// the push path, the pops and the acks record into them as they count.
	rates       *history.Rates   // push and ack samples for GET /api/v1/status/rates
	history     *history.Minutes // minutes for the /api/v1/analytics/* routes and /api/v1/status
	wsBadFrames prometheus.Counter

	wsConns        prometheus.Gauge
	sseStreams     prometheus.Gauge
	sseRefused     prometheus.Counter
	sseResumedAcks prometheus.Counter
	authFailures   *prometheus.CounterVec
	slowBodies     prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, store *queue.Store, cfg MetricsConfig) (*metrics, error) {
	queues := cfg.Queues
	if queues == nil {
		queues = NewLabelLimiter(MetricsMaxQueuesDefault)
	}
	counter := func(name, help string, labels ...string) queueCounter {
		return queueCounter{vec: prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels),
			queues: queues}
	}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "herald_http_requests_total",
			Help: "HTTP requests by route, method and status code."}, []string{"route", "method", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "herald_http_request_duration_seconds",
			Help: "HTTP request duration by route (long-polls include their wait).", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18)},
			[]string{"route"}),
		pushed:     counter("herald_messages_pushed_total", "Messages stored by push.", "queue"),
		duplicates: counter("herald_messages_duplicate_total", "Pushed items not stored because their transactionId existed.", "queue"),
		popped:     counter("herald_messages_popped_total", "Messages delivered by pop.", "queue", "group"),
		acks:       counter("herald_acks_total", "Successful acknowledgements by status.", "queue", "status"),
		dlq: counter("herald_messages_dead_lettered_total",
			"Messages moved to the dead-letter queue (by an ack, or by a pop after too many expired leases).", "queue"),
		dropped: counter("herald_messages_dropped_total",
			"Messages given up on (acked dlq, failed past the retry limit) on a queue that keeps no dead letter of them (deadLetterQueue or dlqAfterMaxRetries false).", "queue"),
		expired: counter("herald_messages_expired_total",
			"Messages a pop skipped, undelivered, because they were older than their queue's ttl (retention deletes them: herald_retention_deleted_total{reason=\"ttl\"}).", "queue"),
		dlqReplayed: counter("herald_dlq_replayed_total", "Dead letters replayed (POST /api/v1/dlq/replay).", "queue"),
		dlqPurged:   counter("herald_dlq_purged_total", "Dead letters purged (POST /api/v1/dlq/purge).", "queue"),
	}
	m.popped.second = groupLabel(cfg, queues)
	m.rates = history.NewRates(queues.Value)
	m.history = history.NewMinutes(NewLabelLimiter(history.HistoryMaxQueues).Value)
	m.wsBadFrames = newCounter("herald_ws_bad_frames_total",
		"WebSocket frames that were not the protocol (answered with an error frame).")
	m.wsConns = newGauge("herald_ws_connections", "Open WebSocket connections.")
	m.sseStreams = newGauge("herald_sse_streams", "Open SSE (EventSource) streams.")
	m.sseRefused = newCounter("herald_sse_refused_total", "SSE connections answered with retry: and closed (overloaded or draining).")
	m.sseResumedAcks = newCounter("herald_sse_resumed_acks_total", "Messages acknowledged by an SSE reconnect's Last-Event-ID.")
	m.authFailures = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "herald_auth_failures_total",
		Help: "Requests refused by authentication (401), by role (403) or by the cookie rule (403, reason cross_site)."}, []string{"reason"})
	m.slowBodies = newCounter("herald_http_slow_body_total",
		"Requests whose body was not received within the body read timeout (answered 408, connection closed).")
	cs := []prometheus.Collector{m.slowBodies, m.requests, m.duration, m.pushed.vec, m.duplicates.vec, m.popped.vec, m.acks.vec,
		m.dlq.vec, m.dropped.vec, m.expired.vec, m.dlqReplayed.vec, m.dlqPurged.vec, m.wsBadFrames,
		m.wsConns, m.sseStreams, m.sseRefused, m.sseResumedAcks, m.authFailures}
	pool := store.Pool()
	gauge := func(name, help string, f func() float64) {
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f))
	}
	gauge("herald_db_pool_total_conns", "Connections in the database pool.", func() float64 { return float64(pool.Stat().TotalConns()) })
	gauge("herald_db_pool_acquired_conns", "Pool connections in use.", func() float64 { return float64(pool.Stat().AcquiredConns()) })
	gauge("herald_db_pool_idle_conns", "Idle pool connections.", func() float64 { return float64(pool.Stat().IdleConns()) })
	gauge("herald_db_pool_max_conns", "Pool size limit.", func() float64 { return float64(pool.Stat().MaxConns()) })
	counterFunc := func(name, help string, f func() float64) {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, f))
	}
	counterFunc("herald_db_pool_acquires_total", "Connections acquired from the pool.",
		func() float64 { return float64(pool.Stat().AcquireCount()) })
	counterFunc("herald_db_pool_empty_acquires_total", "Acquires that had to wait for a connection.",
		func() float64 { return float64(pool.Stat().EmptyAcquireCount()) })
	counterFunc("herald_db_pool_acquire_wait_seconds_total",
		"Time acquires spent waiting for a connection (the pool was empty): its rate over the rate of herald_db_pool_empty_acquires_total is the mean wait.",
		func() float64 { return pool.Stat().EmptyAcquireWaitTime().Seconds() })
	counterFunc("herald_db_pool_canceled_acquires_total", "Acquires given up because their context ended while waiting for a connection.",
		func() float64 { return float64(pool.Stat().CanceledAcquireCount()) })
	counterFunc("herald_decrypt_failures_total",
		"Encrypted payloads that failed to decrypt (tampered, or copied from another message): dead-lettered, never delivered.",
		func() float64 { return float64(store.DecryptFailures()) })
	if stats := store.QueryStats(); stats != nil {
		cs = append(cs, queryCollector{stats: stats, desc: prometheus.NewDesc("herald_db_queries_total",
			"Statements sent to the database, by operation (every query, batch member, begin and commit).",
			[]string{"op"}, nil)})
	}
	if err := register(reg, cs...); err != nil {
		return nil, err
	}
	return m, nil
}

// newCounter and newGauge make a herald_* series without labels.
func newCounter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

func newGauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
}

// register registers cs on reg, stopping at the first it refuses.
func register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// RunAnalytics samples the gauges of the analytics history every
// history.HistorySample until ctx ends (internal/server runs it with the
// other loops). Without it the history has counts but no gauges.
func (s *Server) RunAnalytics(ctx context.Context) error { return s.metrics.history.Run(ctx, s.store) }

// RecordRetention adds what a retention run deleted to the analytics
// history (the retention route); internal/server reports each run here
// as it does to RetentionMetrics.
func (s *Server) RecordRetention(ds []queue.RetentionDeleted) { s.metrics.history.Retained(ds) }

func (m *metrics) observeRequest(route, method string, status int, d time.Duration) {
	m.requests.WithLabelValues(route, methodLabel(method), strconv.Itoa(status)).Inc()
	m.duration.WithLabelValues(route).Observe(d.Seconds())
}

// methodLabel is the method label value: a client may send any token as
// its method (the "/" route answers every one), so those outside the
// standard ones share OTHER.
func methodLabel(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete,
		http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return m
	}
	return "OTHER"
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
