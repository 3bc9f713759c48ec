package admin

import (
	"math"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"time"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/internal/history"
	"github.com/heraldmq/herald/internal/httpapi"
)

// The reference server's /api/v1/analytics/* routes, which its dashboard's
// Queue Operations, System and overview pages chart, answered with its
// shapes from this instance's history (internal/history, Deps.History):
// the last 24 h of what it did, recorded by the message path where it
// happens. docs/api.md says which figure is what here, and which the
// reference has that Herald has no equivalent of (those are zero, never
// absent). Also GET /api/v1/status's throughput and workers
// (statusSeries) and GET /api/v1/status/rates (Deps.Rates).

// AnalyticsMaxWindow bounds to − from on the analytics routes: 7 days.
const AnalyticsMaxWindow = 7 * 24 * time.Hour

// analyticsRoutes registers the routes (all reads), the rates' with them.
// Their queue figures are those of the queues the token may consume;
// postgres-stats, which shows the SQL the database is running for any
// client, needs an admin.
func (s *service) analyticsRoutes() {
	s.routes.Read("GET /api/v1/analytics/system-metrics", "analytics_system", auth.RoleReadOnly, s.analyticsHandler(s.handleSystemMetrics))
	s.routes.Read("GET /api/v1/analytics/worker-metrics", "analytics_worker", auth.RoleReadOnly, s.analyticsHandler(s.handleWorkerMetrics))
	s.routes.Read("GET /api/v1/analytics/queue-lag", "analytics_queue_lag", auth.RoleReadOnly, s.analyticsHandler(s.handleQueueLag))
	s.routes.Read("GET /api/v1/analytics/queue-ops", "analytics_queue_ops", auth.RoleReadOnly, s.analyticsHandler(s.handleQueueOps))
	s.routes.Read("GET /api/v1/analytics/queue-parked-replicas", "analytics_parked", auth.RoleReadOnly, s.analyticsHandler(s.handleParkedReplicas))
	s.routes.Read("GET /api/v1/analytics/retention", "analytics_retention", auth.RoleReadOnly, s.analyticsHandler(s.handleRetentionSeries))
	s.routes.Read("GET /api/v1/analytics/postgres-stats", "analytics_postgres", auth.RoleAdmin, s.handlePostgresStats)
	s.routes.Read("GET /api/v1/status/rates", "status_rates", auth.RoleReadOnly, s.handleRates)
}

// analyticsQuery is what an analytics request asks for.
type analyticsQuery struct {
	from, to time.Time
	bucket   int // minutes
	// ours is false when hostname or workerId name another replica: the
	// answer then has the right shape and nothing in it.
	ours bool
	// keep reports whether a queue's figures are shown: the queue asked
	// for (all without one) among those the token may consume.
	keep func(q string) bool
}

// analyticsHandler adapts a handler of a route that reads the history: it is
// given the window, bucket and filters of the request (analyticsParams),
// and a request whose parameters are wrong is answered before it runs.
func (s *service) analyticsHandler(h func(w http.ResponseWriter, r *http.Request, a analyticsQuery) error) httpapi.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		a, err := s.analyticsParams(r)
		if err != nil {
			return err
		}
		return h(w, r, a)
	}
}

// analyticsParams reads from and to (the last hour by default, at most
// AnalyticsMaxWindow apart), queue, hostname and workerId.
func (s *service) analyticsParams(r *http.Request) (analyticsQuery, error) {
	q := r.URL.Query()
	var a analyticsQuery
	var err error
	if a.from, a.to, err = timeRange(q, time.Hour); err != nil {
		return a, err
	}
	if a.to.Sub(a.from) > AnalyticsMaxWindow {
		return a, httpapi.BadRequestf("from and to must be at most %s apart", AnalyticsMaxWindow)
	}
	a.bucket = bucketMinutes(a.to.Sub(a.from))
	name, err := nameParam(q, "queue", "queue")
	if err != nil {
		return a, err
	}
	rights := auth.RightsFrom(r.Context())
	if err := checkQueueRead(rights, name); err != nil {
		return a, err
	}
	a.keep = func(qn string) bool {
		return (name == "" || qn == name) && rights.MaySeeQueue(qn)
	}
	a.ours = true
	if h := q.Get("hostname"); h != "" {
		if len(h) > 255 {
			return a, httpapi.BadRequestf("hostname must be at most 255 bytes")
		}
		a.ours = h == s.hostname()
	}
	if v := q.Get("workerId"); v != "" {
		id, err := strconv.Atoi(v)
		if err != nil || id < 0 || id > math.MaxInt32 {
			return a, httpapi.BadRequestf("workerId must be an integer between 0 and %d", math.MaxInt32)
		}
		a.ours = a.ours && id == analyticsWorkerID
	}
	return a, nil
}

// analyticsWorkerID is this instance's workerId: one process, one worker.
const analyticsWorkerID = 0

// hostname names this instance as a replica: Deps.Instance, else the
// machine's host name.
func (s *service) hostname() string {
	if s.Instance != "" {
		return s.Instance
	}
	if h, err := os.Hostname(); err == nil {
		return h
	}
	return "herald"
}

// localPort is the port the request came in on (0 if unknown).
func localPort(r *http.Request) int {
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		if _, p, err := net.SplitHostPort(a.String()); err == nil {
			n, _ := strconv.Atoi(p)
			return n
		}
	}
	return 0
}

// bucketOfMinute is the start (minutes since the epoch) of the bucket of
// minute m.
func bucketOfMinute(m int64, bucket int) int64 { return m - m%int64(bucket) }

func minuteTime(m int64) string { return time.Unix(m*60, 0).UTC().Format(bucketTime) }

func round2(v float64) float64 { return math.Round(v*100) / 100 }

func perSecond(n int64, bucket int) float64 { return round2(float64(n) / float64(bucket*60)) }

// buckets groups slots (oldest first) by bucket, keeping the order.
func buckets(slots []history.Slot, bucket int) (starts []int64, by map[int64][]history.Slot) {
	by = map[int64][]history.Slot{}
	for _, sl := range slots {
		b := bucketOfMinute(sl.Minute, bucket)
		if _, ok := by[b]; !ok {
			starts = append(starts, b)
		}
		by[b] = append(by[b], sl)
	}
	return starts, by
}

// queueSums adds the kept queues' counts of slots, by queue; parked is
// the average over the minutes of the waiting long-polls.
func queueSums(slots []history.Slot, keep func(string) bool) map[string]*history.QueueOps {
	out := map[string]*history.QueueOps{}
	for _, sl := range slots {
		for q, o := range sl.Queues {
			if !keep(q) {
				continue
			}
			t := out[q]
			if t == nil {
				t = &history.QueueOps{}
				out[q] = t
			}
			c := *o
			if sl.Samples > 0 {
				c.ParkedSum = o.ParkedSum / float64(sl.Samples)
			} else {
				c.ParkedSum = 0
			}
			t.Add(&c)
		}
	}
	for _, t := range out {
		t.ParkedSum /= float64(len(slots))
	}
	return out
}

// perQueue calls f with each bucket of slots (oldest first) and, in it,
// each kept queue's counts, by queue name.
func perQueue(slots []history.Slot, a analyticsQuery, f func(bucket int64, name string, o *history.QueueOps)) {
	starts, by := buckets(slots, a.bucket)
	for _, b := range starts {
		qs := queueSums(by[b], a.keep)
		for _, name := range sortedKeys(qs) {
			f(b, name, qs[name])
		}
	}
}

func total(by map[string]*history.QueueOps) history.QueueOps {
	var t history.QueueOps
	for _, o := range by {
		t.Add(o)
	}
	return t
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func lagAvg(o *history.QueueOps) float64 {
	if o.LagCount == 0 {
		return 0
	}
	return round2(o.LagSumMs / float64(o.LagCount))
}

type timeRangeJSON struct {
	From string `json:"from"`
	To   string `json:"to"`
}

func (a analyticsQuery) timeRange() timeRangeJSON {
	return timeRangeJSON{From: httpapi.FormatMilli(a.from), To: httpapi.FormatMilli(a.to)}
}

// slots is this instance's minutes of the window; none for another
// replica.
func (s *service) slots(a analyticsQuery) []history.Slot {
	if !a.ours {
		return nil
	}
	return s.History.Window(a.from, a.to)
}

type workerPointJSON struct {
	Timestamp         string  `json:"timestamp"`
	PushMessages      int64   `json:"pushMessages"`
	PopMessages       int64   `json:"popMessages"`
	AckMessages       int64   `json:"ackMessages"`
	PushRequests      int64   `json:"pushRequests"`
	PopRequests       int64   `json:"popRequests"`
	AckRequests       int64   `json:"ackRequests"`
	JobsDone          int64   `json:"jobsDone"`
	PushPerSecond     float64 `json:"pushPerSecond"`
	PopPerSecond      float64 `json:"popPerSecond"`
	AckPerSecond      float64 `json:"ackPerSecond"`
	AvgEventLoopLagMs float64 `json:"avgEventLoopLagMs"`
	MaxEventLoopLagMs float64 `json:"maxEventLoopLagMs"`
	AvgFreeSlots      float64 `json:"avgFreeSlots"`
	MinFreeSlots      float64 `json:"minFreeSlots"`
	DBConnections     float64 `json:"dbConnections"`
	AvgJobQueueSize   float64 `json:"avgJobQueueSize"`
	MaxJobQueueSize   float64 `json:"maxJobQueueSize"`
	BackoffSize       int     `json:"backoffSize"`
	AvgLagMs          float64 `json:"avgLagMs"`
	MaxLagMs          float64 `json:"maxLagMs"`
	LagCount          int64   `json:"lagCount"`
	DBErrors          int64   `json:"dbErrors"`
	AckSuccess        int64   `json:"ackSuccess"`
	AckFailed         int64   `json:"ackFailed"`
	DLQCount          int64   `json:"dlqCount"`
}

// workerGaugesJSON is this instance as a worker: the first keys of both
// worker answers.
type workerGaugesJSON struct {
	Hostname          string  `json:"hostname"`
	WorkerID          int     `json:"workerId"`
	AvgEventLoopLagMs float64 `json:"avgEventLoopLagMs"`
	MaxEventLoopLagMs float64 `json:"maxEventLoopLagMs"`
	FreeSlots         float64 `json:"freeSlots"`
	DBConnections     float64 `json:"dbConnections"`
	JobQueueSize      float64 `json:"jobQueueSize"`
}

// recentWorker sums this instance's slots of the last window (the queues
// keep keeps): its gauges, the messages it processed (pushed and acked)
// and the minute of its last slot; ok is false when it has none.
func (s *service) recentWorker(window time.Duration, keep func(string) bool) (g workerGaugesJSON, processed, last int64, ok bool) {
	now := time.Now()
	recent := s.History.Window(now.Add(-window), now)
	if len(recent) == 0 {
		return g, 0, 0, false
	}
	t := sumSlots(recent)
	q := total(queueSums(recent, keep))
	g = workerGaugesJSON{Hostname: s.hostname(), WorkerID: analyticsWorkerID, AvgEventLoopLagMs: schedAvg(t),
		MaxEventLoopLagMs: round2(t.SchedMaxMs), FreeSlots: t.FreeSlots.Min, DBConnections: t.PoolTotal.Max,
		JobQueueSize: t.Runnable.Max}
	return g, q.PushMessages + q.AckSuccess + q.AckFailed, recent[len(recent)-1].Minute, true
}

type workerJSON struct {
	workerGaugesJSON
	BackoffSize       int    `json:"backoffSize"`
	MessagesProcessed int64  `json:"messagesProcessed"`
	LastSeen          string `json:"lastSeen"`
}

type queueLagJSON struct {
	QueueName string  `json:"queueName"`
	PopCount  int64   `json:"popCount"`
	AvgLagMs  float64 `json:"avgLagMs"`
	MaxLagMs  float64 `json:"maxLagMs"`
}

type summaryJSON struct {
	TotalPushMessages int64 `json:"totalPushMessages"`
	TotalPopMessages  int64 `json:"totalPopMessages"`
	TotalAckMessages  int64 `json:"totalAckMessages"`
	TotalPushRequests int64 `json:"totalPushRequests"`
	TotalPopRequests  int64 `json:"totalPopRequests"`
	TotalAckRequests  int64 `json:"totalAckRequests"`
	TotalDBErrors     int64 `json:"totalDbErrors"`
	TotalAckFailed    int64 `json:"totalAckFailed"`
	TotalDLQ          int64 `json:"totalDlq"`
	PendingMessages   int64 `json:"pendingMessages"`
}

// sumSlots is the instance figures of slots summed (history.Slot's
// AddInstance): samples, gauges, scheduler latency, requests, errors,
// statements.
func sumSlots(slots []history.Slot) history.Slot {
	var t history.Slot
	for i := range slots {
		t.AddInstance(&slots[i])
	}
	return t
}

// schedAvg is the mean scheduler latency of t, in ms.
func schedAvg(t history.Slot) float64 {
	if t.SchedCount == 0 {
		return 0
	}
	return round2(t.SchedSumMs / float64(t.SchedCount))
}

// handleWorkerMetrics answers worker-metrics: per bucket (newest first)
// this instance's message and request counts, Go scheduler latency for
// the event loop's, the pool's free connections, runnable goroutines for
// the job queue, lag from push to delivery, errors; the instance as the
// one worker of the last 5 minutes; lag by queue; totals since it
// started.
func (s *service) handleWorkerMetrics(w http.ResponseWriter, r *http.Request, a analyticsQuery) error {
	slots := s.slots(a)
	starts, by := buckets(slots, a.bucket)
	series := make([]workerPointJSON, 0, len(starts))
	for i := len(starts) - 1; i >= 0; i-- {
		in := by[starts[i]]
		q := total(queueSums(in, a.keep))
		t := sumSlots(in)
		series = append(series, workerPointJSON{Timestamp: minuteTime(starts[i]),
			PushMessages: q.PushMessages, PopMessages: q.PopMessages, AckMessages: q.AckSuccess + q.AckFailed,
			PushRequests: q.PushRequests, PopRequests: t.PopRequests, AckRequests: q.AckRequests, JobsDone: t.Statements,
			PushPerSecond: perSecond(q.PushMessages, a.bucket), PopPerSecond: perSecond(q.PopMessages, a.bucket),
			AckPerSecond:      perSecond(q.AckSuccess+q.AckFailed, a.bucket),
			AvgEventLoopLagMs: schedAvg(t), MaxEventLoopLagMs: round2(t.SchedMaxMs),
			AvgFreeSlots: round2(t.FreeSlots.Avg()), MinFreeSlots: t.FreeSlots.Min, DBConnections: t.PoolTotal.Max,
			AvgJobQueueSize: round2(t.Runnable.Avg()), MaxJobQueueSize: t.Runnable.Max,
			AvgLagMs: lagAvg(&q), MaxLagMs: round2(q.LagMaxMs), LagCount: q.LagCount,
			DBErrors: t.DBErrors, AckSuccess: q.AckSuccess, AckFailed: q.AckFailed, DLQCount: q.DLQ})
	}
	workers := []workerJSON{}
	if a.ours {
		if g, processed, last, ok := s.recentWorker(5*time.Minute, a.keep); ok {
			workers = append(workers, workerJSON{workerGaugesJSON: g, MessagesProcessed: processed, LastSeen: minuteTime(last)})
		}
	}
	byQueue := queueSums(slots, a.keep)
	queues := make([]queueLagJSON, 0, len(byQueue))
	for _, name := range sortedKeys(byQueue) {
		o := byQueue[name]
		queues = append(queues, queueLagJSON{QueueName: name, PopCount: o.PopMessages, AvgLagMs: lagAvg(o), MaxLagMs: round2(o.LagMaxMs)})
	}
	sort.SliceStable(queues, func(i, j int) bool { return queues[i].PopCount > queues[j].PopCount })
	var sum summaryJSON
	if a.ours {
		var t history.QueueOps
		for q, o := range s.History.Since() {
			if a.keep(q) {
				t.Add(&o)
			}
		}
		sum = summaryJSON{TotalPushMessages: t.PushMessages, TotalPopMessages: t.PopMessages,
			TotalAckMessages: t.AckSuccess + t.AckFailed, TotalPushRequests: t.PushRequests, TotalAckRequests: t.AckRequests,
			TotalAckFailed: t.AckFailed, TotalDLQ: t.DLQ, PendingMessages: t.PushMessages - t.PopMessages}
		all := sumSlots(s.History.Window(time.Now().Add(-history.HistoryMinutes*time.Minute), time.Now()))
		sum.TotalPopRequests, sum.TotalDBErrors = all.PopRequests, all.DBErrors
	}
	httpapi.WriteJSON(w, http.StatusOK, struct {
		TimeRange     timeRangeJSON     `json:"timeRange"`
		BucketMinutes int               `json:"bucketMinutes"`
		PointCount    int               `json:"pointCount"`
		TimeSeries    []workerPointJSON `json:"timeSeries"`
		Workers       []workerJSON      `json:"workers"`
		Queues        []queueLagJSON    `json:"queues"`
		Summary       summaryJSON       `json:"summary"`
	}{a.timeRange(), a.bucket, len(series), series, workers, queues, sum})
	return nil
}

type queueLagRowJSON struct {
	queueLagJSON
	BucketTime string `json:"bucketTime"`
}

// handleQueueLag answers queue-lag: a bare array of each queue's pops and
// lag by minute, newest first (one-minute rows whatever the window, as
// the reference's).
func (s *service) handleQueueLag(w http.ResponseWriter, r *http.Request, a analyticsQuery) error {
	slots := s.slots(a)
	out := []queueLagRowJSON{}
	for i := len(slots) - 1; i >= 0; i-- {
		by := queueSums(slots[i:i+1], a.keep)
		for _, name := range sortedKeys(by) {
			o := by[name]
			out = append(out, queueLagRowJSON{queueLagJSON{QueueName: name, PopCount: o.PopMessages, AvgLagMs: lagAvg(o),
				MaxLagMs: round2(o.LagMaxMs)}, minuteTime(slots[i].Minute)})
		}
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

type queueOpsJSON struct {
	Bucket            string  `json:"bucket"`
	QueueName         string  `json:"queueName"`
	PushRequests      int64   `json:"pushRequests"`
	PushMessages      int64   `json:"pushMessages"`
	PopMessages       int64   `json:"popMessages"`
	PopEmpty          int64   `json:"popEmpty"`
	AckRequests       int64   `json:"ackRequests"`
	AckSuccess        int64   `json:"ackSuccess"`
	AckFailed         int64   `json:"ackFailed"`
	Transactions      int64   `json:"transactions"`
	PartitionsCreated int64   `json:"partitionsCreated"`
	PartitionsDeleted int64   `json:"partitionsDeleted"`
	PartitionCount    *int64  `json:"partitionCount"`
	AvgLagMs          float64 `json:"avgLagMs"`
	MaxLagMs          float64 `json:"maxLagMs"`
	PushPerSecond     float64 `json:"pushPerSecond"`
	PopPerSecond      float64 `json:"popPerSecond"`
	AckPerSecond      float64 `json:"ackPerSecond"`
	EmptyPerSecond    float64 `json:"emptyPerSecond"`
	ParkedCount       float64 `json:"parkedCount"`
}

// handleQueueOps answers queue-ops: each queue's counts by bucket, oldest
// first, and the queues seen. Herald does not learn when a push creates a
// partition (partitionsCreated 0) nor snapshots partition counts
// (partitionCount null, as the reference's rows without a snapshot).
func (s *service) handleQueueOps(w http.ResponseWriter, r *http.Request, a analyticsQuery) error {
	series := []queueOpsJSON{}
	seen := map[string]bool{}
	perQueue(s.slots(a), a, func(b int64, name string, o *history.QueueOps) {
		seen[name] = true
		series = append(series, queueOpsJSON{Bucket: minuteTime(b), QueueName: name,
			PushRequests: o.PushRequests, PushMessages: o.PushMessages, PopMessages: o.PopMessages, PopEmpty: o.PopEmpty,
			AckRequests: o.AckRequests, AckSuccess: o.AckSuccess, AckFailed: o.AckFailed, Transactions: o.Transactions,
			PartitionsDeleted: o.PartitionsDeleted, AvgLagMs: lagAvg(o), MaxLagMs: round2(o.LagMaxMs),
			PushPerSecond: perSecond(o.PushMessages, a.bucket), PopPerSecond: perSecond(o.PopMessages, a.bucket),
			AckPerSecond:   perSecond(o.AckSuccess+o.AckFailed, a.bucket),
			EmptyPerSecond: perSecond(o.PopEmpty, a.bucket), ParkedCount: round2(o.ParkedSum)})
	})
	httpapi.WriteJSON(w, http.StatusOK, struct {
		TimeRange     timeRangeJSON  `json:"timeRange"`
		BucketMinutes int            `json:"bucketMinutes"`
		Series        []queueOpsJSON `json:"series"`
		Queues        []string       `json:"queues"`
	}{a.timeRange(), a.bucket, series, sortedKeys(seen)})
	return nil
}

type replicaJSON struct {
	Hostname string `json:"hostname"`
	WorkerID int    `json:"workerId"`
}

type parkedJSON struct {
	Bucket      string  `json:"bucket"`
	QueueName   string  `json:"queueName"`
	Hostname    string  `json:"hostname"`
	WorkerID    int     `json:"workerId"`
	ParkedCount float64 `json:"parkedCount"`
}

// handleParkedReplicas answers queue-parked-replicas: the long-polls
// waiting on each queue (the average of the samples), by bucket, on this
// replica.
func (s *service) handleParkedReplicas(w http.ResponseWriter, r *http.Request, a analyticsQuery) error {
	series := []parkedJSON{}
	perQueue(s.slots(a), a, func(b int64, name string, o *history.QueueOps) {
		if o.ParkedSum > 0 {
			series = append(series, parkedJSON{Bucket: minuteTime(b), QueueName: name, Hostname: s.hostname(),
				WorkerID: analyticsWorkerID, ParkedCount: round2(o.ParkedSum)})
		}
	})
	replicas := []replicaJSON{}
	if len(series) > 0 {
		replicas = append(replicas, replicaJSON{s.hostname(), analyticsWorkerID})
	}
	httpapi.WriteJSON(w, http.StatusOK, struct {
		TimeRange     timeRangeJSON `json:"timeRange"`
		BucketMinutes int           `json:"bucketMinutes"`
		Series        []parkedJSON  `json:"series"`
		Replicas      []replicaJSON `json:"replicas"`
	}{a.timeRange(), a.bucket, series, replicas})
	return nil
}

type retentionJSON struct {
	Bucket                 string `json:"bucket,omitempty"`
	RetentionMsgs          int64  `json:"retentionMsgs"`
	CompletedRetentionMsgs int64  `json:"completedRetentionMsgs"`
	EvictionMsgs           int64  `json:"evictionMsgs"`
	TotalMsgs              int64  `json:"totalMsgs"`
	EventCount             int64  `json:"eventCount"`
}

func retentionOf(o history.QueueOps) retentionJSON {
	return retentionJSON{RetentionMsgs: o.RetentionMsgs, CompletedRetentionMsgs: o.CompletedMsgs, EvictionMsgs: o.EvictionMsgs,
		TotalMsgs: o.RetentionMsgs + o.CompletedMsgs + o.EvictionMsgs, EventCount: o.RetentionEvents}
}

// handleRetentionSeries answers retention: messages retention deleted on
// this instance (by age, once completed, and evicted after maxWait) by
// bucket, oldest first, and their totals. Retention runs on one instance
// at a time, so another's series can be empty.
func (s *service) handleRetentionSeries(w http.ResponseWriter, r *http.Request, a analyticsQuery) error {
	starts, by := buckets(s.slots(a), a.bucket)
	series := []retentionJSON{}
	var all history.QueueOps
	for _, b := range starts {
		t := total(queueSums(by[b], a.keep))
		if t.RetentionEvents == 0 {
			continue
		}
		all.Add(&t)
		row := retentionOf(t)
		row.Bucket = minuteTime(b)
		series = append(series, row)
	}
	httpapi.WriteJSON(w, http.StatusOK, struct {
		TimeRange     timeRangeJSON   `json:"timeRange"`
		BucketMinutes int             `json:"bucketMinutes"`
		Series        []retentionJSON `json:"series"`
		Totals        retentionJSON   `json:"totals"`
	}{a.timeRange(), a.bucket, series, retentionOf(all)})
	return nil
}

// statJSON is a gauge over a bucket, as the reference reports each.
type statJSON struct {
	Avg  float64 `json:"avg"`
	Min  float64 `json:"min"`
	Max  float64 `json:"max"`
	Last float64 `json:"last"`
}

func statOf(g history.Gauge) statJSON {
	return statJSON{Avg: round2(g.Avg()), Min: g.Min, Max: g.Max, Last: g.Last}
}

// handleSystemMetrics answers system-metrics: this instance as the one
// replica, its CPU (percent × 100 of one core, as the reference's), memory,
// database pool and Go scheduler (GOMAXPROCS and runnable goroutines as
// the system thread pool) by bucket, oldest first.
func (s *service) handleSystemMetrics(w http.ResponseWriter, r *http.Request, a analyticsQuery) error {
	starts, by := buckets(s.slots(a), a.bucket)
	type pointJSON struct {
		Timestamp   string         `json:"timestamp"`
		SampleCount int            `json:"sampleCount"`
		Metrics     map[string]any `json:"metrics"`
	}
	points := []pointJSON{}
	for _, b := range starts {
		m := sumSlots(by[b])
		if m.Samples == 0 {
			continue // counts only: no sample this bucket
		}
		zero := statJSON{}
		points = append(points, pointJSON{Timestamp: httpapi.FormatMilli(time.Unix(b*60, 0)), SampleCount: m.Samples,
			Metrics: map[string]any{
				"cpu":      map[string]statJSON{"user_us": statOf(m.CPUUser), "system_us": statOf(m.CPUSys)},
				"memory":   map[string]statJSON{"rss_bytes": statOf(m.RSS), "virtual_bytes": statOf(m.VSize)},
				"database": map[string]statJSON{"pool_size": statOf(m.PoolSize), "pool_idle": statOf(m.PoolIdle), "pool_active": statOf(m.PoolActive)},
				"threadpool": map[string]map[string]statJSON{
					"db":     {"pool_size": statOf(m.PoolSize), "queue_size": zero},
					"system": {"pool_size": statOf(m.GoMaxProcs), "queue_size": statOf(m.Runnable)}},
				"shared_state": map[string]any{"enabled": false}}})
	}
	type replicaSeriesJSON struct {
		Hostname   string      `json:"hostname"`
		Port       int         `json:"port"`
		WorkerID   int         `json:"workerId"`
		TimeSeries []pointJSON `json:"timeSeries"`
	}
	replicas := []replicaSeriesJSON{}
	if len(points) > 0 {
		replicas = append(replicas, replicaSeriesJSON{s.hostname(), localPort(r), analyticsWorkerID, points})
	}
	httpapi.WriteJSON(w, http.StatusOK, struct {
		TimeRange     timeRangeJSON       `json:"timeRange"`
		Replicas      []replicaSeriesJSON `json:"replicas"`
		ReplicaCount  int                 `json:"replicaCount"`
		BucketMinutes int                 `json:"bucketMinutes"`
		PointCount    int                 `json:"pointCount"`
	}{a.timeRange(), replicas, len(replicas), a.bucket, len(points)})
	return nil
}

// handlePostgresStats answers postgres-stats: PostgreSQL's statistics of
// Herald's tables and indexes (its schema), the database's cache hits, and
// the statements running over a second; no query parameters.
func (s *service) handlePostgresStats(w http.ResponseWriter, r *http.Request) error {
	doc, err := s.Store.PostgresStats(r.Context())
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(doc)
	return nil
}

type statusPointJSON struct {
	Timestamp          string  `json:"timestamp"`
	Ingested           int64   `json:"ingested"`
	Processed          int64   `json:"processed"`
	PopMessages        int64   `json:"popMessages"`
	IngestedPerSecond  float64 `json:"ingestedPerSecond"`
	ProcessedPerSecond float64 `json:"processedPerSecond"`
	PopPerSecond       float64 `json:"popPerSecond"`
	AvgLagMs           float64 `json:"avgLagMs"`
	MaxLagMs           float64 `json:"maxLagMs"`
	AvgEventLoopLagMs  float64 `json:"avgEventLoopLagMs"`
	MaxEventLoopLagMs  float64 `json:"maxEventLoopLagMs"`
	MinFreeSlots       float64 `json:"minFreeSlots"`
	DBErrors           int64   `json:"dbErrors"`
	AckFailed          int64   `json:"ackFailed"`
	DLQCount           int64   `json:"dlqCount"`
	CPUUserPct         float64 `json:"queenCpuUserPct"`
	CPUSysPct          float64 `json:"queenCpuSysPct"`
	RSSMb              float64 `json:"queenRssMb"`
	DBPoolActive       float64 `json:"dbPoolActive"`
	DBPoolIdle         float64 `json:"dbPoolIdle"`
	DBPoolSize         float64 `json:"dbPoolSize"`
}

type statusWorkerJSON struct {
	workerGaugesJSON
	MessagesProcessed int64 `json:"messagesProcessed"`
}

// statusSeries is GET /api/v1/status's throughput (newest bucket first:
// pushes ingested, acks processed, pops, lag, scheduler latency, the
// process's CPU and memory, the pool) and workers (this instance, over
// the last 2 minutes), from this instance's history, for queueName (""
// for all) within the request's rights.
func (s *service) statusSeries(r *http.Request, from, to time.Time, bucket int, queueName string) (throughput []statusPointJSON, workers []statusWorkerJSON) {
	rights := auth.RightsFrom(r.Context())
	keep := func(qn string) bool { return (queueName == "" || qn == queueName) && rights.MaySeeQueue(qn) }
	starts, by := buckets(s.History.Window(from, to), bucket)
	throughput = []statusPointJSON{}
	for i := len(starts) - 1; i >= 0; i-- {
		in := by[starts[i]]
		q := total(queueSums(in, keep))
		t := sumSlots(in)
		processed := q.AckSuccess + q.AckFailed
		throughput = append(throughput, statusPointJSON{Timestamp: minuteTime(starts[i]),
			Ingested: q.PushMessages, Processed: processed, PopMessages: q.PopMessages,
			IngestedPerSecond: perSecond(q.PushMessages, bucket), ProcessedPerSecond: perSecond(processed, bucket),
			PopPerSecond: perSecond(q.PopMessages, bucket), AvgLagMs: lagAvg(&q), MaxLagMs: round2(q.LagMaxMs),
			AvgEventLoopLagMs: schedAvg(t), MaxEventLoopLagMs: round2(t.SchedMaxMs), MinFreeSlots: t.FreeSlots.Min,
			DBErrors: t.DBErrors, AckFailed: q.AckFailed, DLQCount: q.DLQ,
			CPUUserPct: round2(t.CPUUser.Avg() / 100), CPUSysPct: round2(t.CPUSys.Avg() / 100), RSSMb: round2(t.RSS.Avg() / (1 << 20)),
			DBPoolActive: round2(t.PoolActive.Avg()), DBPoolIdle: round2(t.PoolIdle.Avg()), DBPoolSize: round2(t.PoolSize.Max)})
	}
	workers = []statusWorkerJSON{}
	if g, processed, _, ok := s.recentWorker(2*time.Minute, keep); ok {
		workers = append(workers, statusWorkerJSON{workerGaugesJSON: g, MessagesProcessed: processed})
	}
	return throughput, workers
}

// handleRates answers GET /api/v1/status/rates: this instance's samples.
// ?queue= narrows to one queue; a token with rights sees the queues it may
// consume whole.
func (s *service) handleRates(w http.ResponseWriter, r *http.Request) error {
	only := r.URL.Query().Get("queue")
	rights := auth.RightsFrom(r.Context())
	since, qs := s.Rates.Snapshot(func(q string) bool {
		return (only == "" || q == only) && rights.MayConsume(q, "")
	})
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{"instance": s.Instance, "intervalSeconds": int(history.RateInterval / time.Second),
		"samples": history.RateSamples, "since": httpapi.FormatMilli(since), "queues": qs})
	return nil
}
