package gateway

import (
	"math"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"time"

	"github.com/heraldmq/herald/admin"
	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/internal/httpapi"
)

// The reference server's /api/v1/analytics/* routes, which its dashboard's
// Queue Operations, System and overview pages chart, answered with its
// shapes from this instance's history (analytics_history.go): the last
// HistoryMinutes of what it did, measured where it happens. docs/api.md
// says which figure is what here, and which the reference has that Herald
// has no equivalent of (those are zero, never absent).

// AnalyticsMaxWindow bounds to − from on the analytics routes: 7 days.
const AnalyticsMaxWindow = 7 * 24 * time.Hour

// analyticsRoutes registers the routes (all reads). Their queue figures
// are those of the queues the token may consume; postgres-stats, which
// shows the SQL the database is running for any client, needs an admin.
func (s *Server) analyticsRoutes() {
	s.read("GET /api/v1/analytics/system-metrics", "analytics_system", auth.RoleReadOnly, s.handleSystemMetrics)
	s.read("GET /api/v1/analytics/worker-metrics", "analytics_worker", auth.RoleReadOnly, s.handleWorkerMetrics)
	s.read("GET /api/v1/analytics/queue-lag", "analytics_queue_lag", auth.RoleReadOnly, s.handleQueueLag)
	s.read("GET /api/v1/analytics/queue-ops", "analytics_queue_ops", auth.RoleReadOnly, s.handleQueueOps)
	s.read("GET /api/v1/analytics/queue-parked-replicas", "analytics_parked", auth.RoleReadOnly, s.handleParkedReplicas)
	s.read("GET /api/v1/analytics/retention", "analytics_retention", auth.RoleReadOnly, s.handleRetentionSeries)
	s.read("GET /api/v1/analytics/postgres-stats", "analytics_postgres", auth.RoleAdmin, s.handlePostgresStats)
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

// analyticsParams reads from and to (the last hour by default, at most
// AnalyticsMaxWindow apart), queue, hostname and workerId.
func (s *Server) analyticsParams(r *http.Request) (analyticsQuery, error) {
	q := r.URL.Query()
	var a analyticsQuery
	var err error
	if a.from, a.to, err = admin.TimeRange(q, time.Hour); err != nil {
		return a, err
	}
	if a.to.Sub(a.from) > AnalyticsMaxWindow {
		return a, httpapi.BadRequestf("from and to must be at most %s apart", AnalyticsMaxWindow)
	}
	a.bucket = admin.BucketMinutes(a.to.Sub(a.from))
	name, err := admin.NameParam(q, "queue", "queue")
	if err != nil {
		return a, err
	}
	rights := rightsOf(r.Context())
	if err := admin.CheckQueueRead(rights, name); err != nil {
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

// hostname names this instance as a replica: Config.Instance, else the
// machine's host name.
func (s *Server) hostname() string {
	if s.cfg.Instance != "" {
		return s.cfg.Instance
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

func minuteTime(m int64) string { return time.Unix(m*60, 0).UTC().Format(admin.BucketTime) }

func round2(v float64) float64 { return math.Round(v*100) / 100 }

func perSecond(n int64, bucket int) float64 { return round2(float64(n) / float64(bucket*60)) }

// buckets groups slots (oldest first) by bucket, keeping the order.
func buckets(slots []minuteSlot, bucket int) (starts []int64, by map[int64][]minuteSlot) {
	by = map[int64][]minuteSlot{}
	for _, sl := range slots {
		b := bucketOfMinute(sl.minute, bucket)
		if _, ok := by[b]; !ok {
			starts = append(starts, b)
		}
		by[b] = append(by[b], sl)
	}
	return starts, by
}

// queueSums adds the kept queues' counts of slots, by queue; parked is
// the average over the minutes of the waiting long-polls.
func queueSums(slots []minuteSlot, keep func(string) bool) map[string]*queueOps {
	out := map[string]*queueOps{}
	for _, sl := range slots {
		for q, o := range sl.queues {
			if !keep(q) {
				continue
			}
			t := out[q]
			if t == nil {
				t = &queueOps{}
				out[q] = t
			}
			c := *o
			if sl.samples > 0 {
				c.parkedSum = o.parkedSum / float64(sl.samples)
			} else {
				c.parkedSum = 0
			}
			t.add(&c)
		}
	}
	for _, t := range out {
		t.parkedSum /= float64(len(slots))
	}
	return out
}

func total(by map[string]*queueOps) queueOps {
	var t queueOps
	for _, o := range by {
		t.add(o)
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

func lagAvg(o *queueOps) float64 {
	if o.lagCount == 0 {
		return 0
	}
	return round2(o.lagSumMs / float64(o.lagCount))
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
func (s *Server) slots(a analyticsQuery) []minuteSlot {
	if !a.ours {
		return nil
	}
	return s.metrics.history.window(a.from, a.to)
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

type workerJSON struct {
	Hostname          string  `json:"hostname"`
	WorkerID          int     `json:"workerId"`
	AvgEventLoopLagMs float64 `json:"avgEventLoopLagMs"`
	MaxEventLoopLagMs float64 `json:"maxEventLoopLagMs"`
	FreeSlots         float64 `json:"freeSlots"`
	DBConnections     float64 `json:"dbConnections"`
	JobQueueSize      float64 `json:"jobQueueSize"`
	BackoffSize       int     `json:"backoffSize"`
	MessagesProcessed int64   `json:"messagesProcessed"`
	LastSeen          string  `json:"lastSeen"`
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

// slotsSum is the instance figures of slots: scheduler latency, pool and
// goroutine gauges, requests, errors, statements.
type slotsSum struct {
	schedCount                        int64
	schedSumMs, schedMaxMs            float64
	freeSlots, poolTotal, runnable    gaugeStat
	popRequests, dbErrors, statements int64
}

func sumSlots(slots []minuteSlot) slotsSum {
	var t slotsSum
	for _, sl := range slots {
		t.schedCount += sl.schedCount
		t.schedSumMs += sl.schedSumMs
		t.schedMaxMs = max(t.schedMaxMs, sl.schedMaxMs)
		t.freeSlots.merge(sl.freeSlots)
		t.poolTotal.merge(sl.poolTotal)
		t.runnable.merge(sl.runnable)
		t.popRequests += sl.popRequests
		t.dbErrors += sl.dbErrors
		t.statements += sl.statements
	}
	return t
}

func (t slotsSum) schedAvg() float64 {
	if t.schedCount == 0 {
		return 0
	}
	return round2(t.schedSumMs / float64(t.schedCount))
}

// handleWorkerMetrics answers worker-metrics: per bucket (newest first)
// this instance's message and request counts, Go scheduler latency for
// the event loop's, the pool's free connections, runnable goroutines for
// the job queue, lag from push to delivery, errors; the instance as the
// one worker of the last 5 minutes; lag by queue; totals since it
// started.
func (s *Server) handleWorkerMetrics(w http.ResponseWriter, r *http.Request) error {
	a, err := s.analyticsParams(r)
	if err != nil {
		return err
	}
	slots := s.slots(a)
	starts, by := buckets(slots, a.bucket)
	series := make([]workerPointJSON, 0, len(starts))
	for i := len(starts) - 1; i >= 0; i-- {
		in := by[starts[i]]
		q := total(queueSums(in, a.keep))
		t := sumSlots(in)
		series = append(series, workerPointJSON{Timestamp: minuteTime(starts[i]),
			PushMessages: q.pushMessages, PopMessages: q.popMessages, AckMessages: q.ackSuccess + q.ackFailed,
			PushRequests: q.pushRequests, PopRequests: t.popRequests, AckRequests: q.ackRequests, JobsDone: t.statements,
			PushPerSecond: perSecond(q.pushMessages, a.bucket), PopPerSecond: perSecond(q.popMessages, a.bucket),
			AckPerSecond:      perSecond(q.ackSuccess+q.ackFailed, a.bucket),
			AvgEventLoopLagMs: t.schedAvg(), MaxEventLoopLagMs: round2(t.schedMaxMs),
			AvgFreeSlots: round2(t.freeSlots.avg()), MinFreeSlots: t.freeSlots.min, DBConnections: t.poolTotal.max,
			AvgJobQueueSize: round2(t.runnable.avg()), MaxJobQueueSize: t.runnable.max,
			AvgLagMs: lagAvg(&q), MaxLagMs: round2(q.lagMaxMs), LagCount: q.lagCount,
			DBErrors: t.dbErrors, AckSuccess: q.ackSuccess, AckFailed: q.ackFailed, DLQCount: q.dlq})
	}
	workers := []workerJSON{}
	if a.ours {
		now := time.Now()
		if recent := s.metrics.history.window(now.Add(-5*time.Minute), now); len(recent) > 0 {
			t := sumSlots(recent)
			q := total(queueSums(recent, a.keep))
			workers = append(workers, workerJSON{Hostname: s.hostname(), WorkerID: analyticsWorkerID,
				AvgEventLoopLagMs: t.schedAvg(), MaxEventLoopLagMs: round2(t.schedMaxMs), FreeSlots: t.freeSlots.min,
				DBConnections: t.poolTotal.max, JobQueueSize: t.runnable.max,
				MessagesProcessed: q.pushMessages + q.ackSuccess + q.ackFailed,
				LastSeen:          minuteTime(recent[len(recent)-1].minute)})
		}
	}
	byQueue := queueSums(slots, a.keep)
	queues := make([]queueLagJSON, 0, len(byQueue))
	for _, name := range sortedKeys(byQueue) {
		o := byQueue[name]
		queues = append(queues, queueLagJSON{QueueName: name, PopCount: o.popMessages, AvgLagMs: lagAvg(o), MaxLagMs: round2(o.lagMaxMs)})
	}
	sort.SliceStable(queues, func(i, j int) bool { return queues[i].PopCount > queues[j].PopCount })
	var sum summaryJSON
	if a.ours {
		var t queueOps
		for q, o := range s.metrics.history.since() {
			if a.keep(q) {
				t.add(&o)
			}
		}
		sum = summaryJSON{TotalPushMessages: t.pushMessages, TotalPopMessages: t.popMessages,
			TotalAckMessages: t.ackSuccess + t.ackFailed, TotalPushRequests: t.pushRequests, TotalAckRequests: t.ackRequests,
			TotalAckFailed: t.ackFailed, TotalDLQ: t.dlq, PendingMessages: t.pushMessages - t.popMessages}
		all := sumSlots(s.metrics.history.window(time.Now().Add(-HistoryMinutes*time.Minute), time.Now()))
		sum.TotalPopRequests, sum.TotalDBErrors = all.popRequests, all.dbErrors
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
func (s *Server) handleQueueLag(w http.ResponseWriter, r *http.Request) error {
	a, err := s.analyticsParams(r)
	if err != nil {
		return err
	}
	slots := s.slots(a)
	out := []queueLagRowJSON{}
	for i := len(slots) - 1; i >= 0; i-- {
		by := queueSums(slots[i:i+1], a.keep)
		for _, name := range sortedKeys(by) {
			o := by[name]
			out = append(out, queueLagRowJSON{queueLagJSON{QueueName: name, PopCount: o.popMessages, AvgLagMs: lagAvg(o),
				MaxLagMs: round2(o.lagMaxMs)}, minuteTime(slots[i].minute)})
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
func (s *Server) handleQueueOps(w http.ResponseWriter, r *http.Request) error {
	a, err := s.analyticsParams(r)
	if err != nil {
		return err
	}
	starts, by := buckets(s.slots(a), a.bucket)
	series := []queueOpsJSON{}
	seen := map[string]bool{}
	for _, b := range starts {
		qs := queueSums(by[b], a.keep)
		for _, name := range sortedKeys(qs) {
			o := qs[name]
			seen[name] = true
			series = append(series, queueOpsJSON{Bucket: minuteTime(b), QueueName: name,
				PushRequests: o.pushRequests, PushMessages: o.pushMessages, PopMessages: o.popMessages, PopEmpty: o.popEmpty,
				AckRequests: o.ackRequests, AckSuccess: o.ackSuccess, AckFailed: o.ackFailed, Transactions: o.transactions,
				PartitionsDeleted: o.partitionsDeleted, AvgLagMs: lagAvg(o), MaxLagMs: round2(o.lagMaxMs),
				PushPerSecond: perSecond(o.pushMessages, a.bucket), PopPerSecond: perSecond(o.popMessages, a.bucket),
				AckPerSecond:   perSecond(o.ackSuccess+o.ackFailed, a.bucket),
				EmptyPerSecond: perSecond(o.popEmpty, a.bucket), ParkedCount: round2(o.parkedSum)})
		}
	}
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
func (s *Server) handleParkedReplicas(w http.ResponseWriter, r *http.Request) error {
	a, err := s.analyticsParams(r)
	if err != nil {
		return err
	}
	starts, by := buckets(s.slots(a), a.bucket)
	series := []parkedJSON{}
	for _, b := range starts {
		qs := queueSums(by[b], a.keep)
		for _, name := range sortedKeys(qs) {
			if o := qs[name]; o.parkedSum > 0 {
				series = append(series, parkedJSON{Bucket: minuteTime(b), QueueName: name, Hostname: s.hostname(),
					WorkerID: analyticsWorkerID, ParkedCount: round2(o.parkedSum)})
			}
		}
	}
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

func retentionOf(o queueOps) retentionJSON {
	return retentionJSON{RetentionMsgs: o.retentionMsgs, CompletedRetentionMsgs: o.completedMsgs, EvictionMsgs: o.evictionMsgs,
		TotalMsgs: o.retentionMsgs + o.completedMsgs + o.evictionMsgs, EventCount: o.retentionEvents}
}

// handleRetentionSeries answers retention: messages retention deleted on
// this instance (by age, once completed, and evicted after maxWait) by
// bucket, oldest first, and their totals. Retention runs on one instance
// at a time, so another's series can be empty.
func (s *Server) handleRetentionSeries(w http.ResponseWriter, r *http.Request) error {
	a, err := s.analyticsParams(r)
	if err != nil {
		return err
	}
	starts, by := buckets(s.slots(a), a.bucket)
	series := []retentionJSON{}
	var all queueOps
	for _, b := range starts {
		t := total(queueSums(by[b], a.keep))
		if t.retentionEvents == 0 {
			continue
		}
		all.add(&t)
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

func statOf(g gaugeStat) statJSON {
	return statJSON{Avg: round2(g.avg()), Min: g.min, Max: g.max, Last: g.last}
}

// handleSystemMetrics answers system-metrics: this instance as the one
// replica, its CPU (percent × 100 of one core, as the reference's), memory,
// database pool and Go scheduler (GOMAXPROCS and runnable goroutines as
// the system thread pool) by bucket, oldest first.
func (s *Server) handleSystemMetrics(w http.ResponseWriter, r *http.Request) error {
	a, err := s.analyticsParams(r)
	if err != nil {
		return err
	}
	starts, by := buckets(s.slots(a), a.bucket)
	type pointJSON struct {
		Timestamp   string         `json:"timestamp"`
		SampleCount int            `json:"sampleCount"`
		Metrics     map[string]any `json:"metrics"`
	}
	points := []pointJSON{}
	for _, b := range starts {
		var m minuteSlot
		for _, sl := range by[b] {
			m.samples += sl.samples
			m.cpuUser.merge(sl.cpuUser)
			m.cpuSys.merge(sl.cpuSys)
			m.rss.merge(sl.rss)
			m.vsize.merge(sl.vsize)
			m.poolSize.merge(sl.poolSize)
			m.poolIdle.merge(sl.poolIdle)
			m.poolActive.merge(sl.poolActive)
			m.gomaxprocs.merge(sl.gomaxprocs)
			m.runnable.merge(sl.runnable)
		}
		if m.samples == 0 {
			continue // counts only: no sample this bucket
		}
		zero := statJSON{}
		points = append(points, pointJSON{Timestamp: httpapi.FormatMilli(time.Unix(b*60, 0)), SampleCount: m.samples,
			Metrics: map[string]any{
				"cpu":      map[string]statJSON{"user_us": statOf(m.cpuUser), "system_us": statOf(m.cpuSys)},
				"memory":   map[string]statJSON{"rss_bytes": statOf(m.rss), "virtual_bytes": statOf(m.vsize)},
				"database": map[string]statJSON{"pool_size": statOf(m.poolSize), "pool_idle": statOf(m.poolIdle), "pool_active": statOf(m.poolActive)},
				"threadpool": map[string]map[string]statJSON{
					"db":     {"pool_size": statOf(m.poolSize), "queue_size": zero},
					"system": {"pool_size": statOf(m.gomaxprocs), "queue_size": statOf(m.runnable)}},
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
func (s *Server) handlePostgresStats(w http.ResponseWriter, r *http.Request) error {
	doc, err := s.store.PostgresStats(r.Context())
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
	Hostname          string  `json:"hostname"`
	WorkerID          int     `json:"workerId"`
	AvgEventLoopLagMs float64 `json:"avgEventLoopLagMs"`
	MaxEventLoopLagMs float64 `json:"maxEventLoopLagMs"`
	FreeSlots         float64 `json:"freeSlots"`
	DBConnections     float64 `json:"dbConnections"`
	JobQueueSize      float64 `json:"jobQueueSize"`
	MessagesProcessed int64   `json:"messagesProcessed"`
}

// statusSeries is GET /api/v1/status's throughput (newest bucket first:
// pushes ingested, acks processed, pops, lag, scheduler latency, the
// process's CPU and memory, the pool) and workers (this instance, over
// the last 2 minutes), from this instance's history (admin.Deps.Series).
func (s *Server) statusSeries(r *http.Request, from, to time.Time, bucket int, queueName string) (throughput, workers []any) {
	rights := rightsOf(r.Context())
	keep := func(qn string) bool { return (queueName == "" || qn == queueName) && rights.MaySeeQueue(qn) }
	starts, by := buckets(s.metrics.history.window(from, to), bucket)
	throughput = []any{}
	for i := len(starts) - 1; i >= 0; i-- {
		in := by[starts[i]]
		q := total(queueSums(in, keep))
		t := sumSlots(in)
		var cpuUser, cpuSys, rss, active, idle, size gaugeStat
		for _, sl := range in {
			cpuUser.merge(sl.cpuUser)
			cpuSys.merge(sl.cpuSys)
			rss.merge(sl.rss)
			active.merge(sl.poolActive)
			idle.merge(sl.poolIdle)
			size.merge(sl.poolSize)
		}
		processed := q.ackSuccess + q.ackFailed
		throughput = append(throughput, statusPointJSON{Timestamp: minuteTime(starts[i]),
			Ingested: q.pushMessages, Processed: processed, PopMessages: q.popMessages,
			IngestedPerSecond: perSecond(q.pushMessages, bucket), ProcessedPerSecond: perSecond(processed, bucket),
			PopPerSecond: perSecond(q.popMessages, bucket), AvgLagMs: lagAvg(&q), MaxLagMs: round2(q.lagMaxMs),
			AvgEventLoopLagMs: t.schedAvg(), MaxEventLoopLagMs: round2(t.schedMaxMs), MinFreeSlots: t.freeSlots.min,
			DBErrors: t.dbErrors, AckFailed: q.ackFailed, DLQCount: q.dlq,
			CPUUserPct: round2(cpuUser.avg() / 100), CPUSysPct: round2(cpuSys.avg() / 100), RSSMb: round2(rss.avg() / (1 << 20)),
			DBPoolActive: round2(active.avg()), DBPoolIdle: round2(idle.avg()), DBPoolSize: round2(size.max)})
	}
	workers = []any{}
	now := time.Now()
	if recent := s.metrics.history.window(now.Add(-2*time.Minute), now); len(recent) > 0 {
		t := sumSlots(recent)
		q := total(queueSums(recent, keep))
		workers = append(workers, statusWorkerJSON{Hostname: s.hostname(), WorkerID: analyticsWorkerID,
			AvgEventLoopLagMs: t.schedAvg(), MaxEventLoopLagMs: round2(t.schedMaxMs), FreeSlots: t.freeSlots.min,
			DBConnections: t.poolTotal.max, JobQueueSize: t.runnable.max, MessagesProcessed: q.pushMessages + q.ackSuccess + q.ackFailed})
	}
	return throughput, workers
}
