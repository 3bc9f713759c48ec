package gateway

import (
	"context"
	"math"
	"os"
	rtmetrics "runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/heraldmq/herald/queue"
)

// The history behind the /api/v1/analytics/* routes (handler_analytics.go):
// what this instance did and how it fared, one slot per minute for the
// last HistoryMinutes, in memory.
//
// The reference server writes such figures to tables every minute; Herald
// keeps them in the process that measured them, so each instance answers
// with its own figures (restarting forgets them). Counts (pushes, pops,
// acks, dead letters, retention's deletions) are added where the gateway
// already counts them for /metrics; gauges (the pool, CPU, memory, the Go
// scheduler, waiting long-polls) are sampled every HistorySample by
// RunAnalytics. The first HistoryMaxQueues queues seen keep their name,
// the others share "__other__" (a LabelLimiter of its own, whatever
// --metrics-max-queues), so a slot holds at most HistoryMaxQueues + 1
// queues' counts (about 200 bytes each): at most HistoryMinutes slots,
// some 15 MB if every one of 50 queues is busy every minute of a day;
// a minute in which nothing happened takes a sample's 400 bytes.

// HistoryMinutes is how many one-minute slots the history keeps: 24 h.
// HistorySample is how often RunAnalytics samples the gauges.
// HistoryMaxQueues is how many queues have counts of their own.
const (
	HistoryMinutes   = 24 * 60
	HistorySample    = time.Second
	HistoryMaxQueues = 50
)

// queueOps are one queue's counts in one minute.
type queueOps struct {
	pushRequests, pushMessages                 int64
	popMessages, popEmpty                      int64
	ackRequests, ackSuccess, ackFailed         int64
	dlq, transactions, partitionsDeleted       int64
	retentionMsgs, completedMsgs, evictionMsgs int64
	retentionEvents                            int64
	// lag: time from push to delivery of each popped message.
	lagCount           int64
	lagSumMs, lagMaxMs float64
	// parkedSum adds the long-polls waiting on the queue at each sample
	// of the minute (its average is parkedSum / samples).
	parkedSum float64
}

func (o *queueOps) add(p *queueOps) {
	o.pushRequests += p.pushRequests
	o.pushMessages += p.pushMessages
	o.popMessages += p.popMessages
	o.popEmpty += p.popEmpty
	o.ackRequests += p.ackRequests
	o.ackSuccess += p.ackSuccess
	o.ackFailed += p.ackFailed
	o.dlq += p.dlq
	o.transactions += p.transactions
	o.partitionsDeleted += p.partitionsDeleted
	o.retentionMsgs += p.retentionMsgs
	o.completedMsgs += p.completedMsgs
	o.evictionMsgs += p.evictionMsgs
	o.retentionEvents += p.retentionEvents
	o.lagCount += p.lagCount
	o.lagSumMs += p.lagSumMs
	o.lagMaxMs = max(o.lagMaxMs, p.lagMaxMs)
	o.parkedSum += p.parkedSum
}

// gaugeStat is a gauge's samples in one minute.
type gaugeStat struct {
	n                   int
	sum, min, max, last float64
}

func (g *gaugeStat) add(v float64) {
	if g.n == 0 || v < g.min {
		g.min = v
	}
	if g.n == 0 || v > g.max {
		g.max = v
	}
	g.n++
	g.sum += v
	g.last = v
}

func (g *gaugeStat) merge(o gaugeStat) {
	if o.n == 0 {
		return
	}
	if g.n == 0 {
		*g = o
		return
	}
	g.min, g.max = min(g.min, o.min), max(g.max, o.max)
	g.n += o.n
	g.sum += o.sum
	g.last = o.last
}

func (g gaugeStat) avg() float64 {
	if g.n == 0 {
		return 0
	}
	return g.sum / float64(g.n)
}

// minuteSlot is one minute of the history.
type minuteSlot struct {
	minute int64 // minutes since the epoch
	queues map[string]*queueOps
	// popRequests counts pops (HTTP and WebSocket), whatever they named.
	popRequests int64
	dbErrors    int64 // requests answered 500 or 503 for a database error
	statements  int64 // statements sent to the database (queue.QueryStats)
	samples     int
	// Sampled gauges. cpuUser and cpuSys are percent × 100 of one core,
	// as the reference server reports them.
	cpuUser, cpuSys, rss, vsize               gaugeStat
	poolSize, poolIdle, poolActive, poolTotal gaugeStat
	freeSlots                                 gaugeStat
	gomaxprocs, runnable                      gaugeStat
	schedCount                                int64
	schedSumMs, schedMaxMs                    float64
}

func (m *minuteSlot) queue(q string) *queueOps {
	o := m.queues[q]
	if o == nil {
		o = &queueOps{}
		m.queues[q] = o
	}
	return o
}

// history is the ring of minutes, the totals since the instance started,
// and the long-polls waiting now.
type history struct {
	queues *LabelLimiter
	now    func() time.Time

	mu     sync.Mutex
	ring   [HistoryMinutes]*minuteSlot
	totals map[string]*queueOps // since the instance started, by queue label
	parked map[string]int       // long-polls waiting now, by queue label
}

func newHistory(queues *LabelLimiter) *history {
	return &history{queues: queues, now: time.Now, totals: map[string]*queueOps{}, parked: map[string]int{}}
}

func minuteOf(t time.Time) int64 { return t.Unix() / 60 }

// slot is the current minute's slot; h.mu is held.
func (h *history) slot() *minuteSlot {
	m := minuteOf(h.now())
	i := m % HistoryMinutes
	s := h.ring[i]
	if s == nil || s.minute != m {
		s = &minuteSlot{minute: m, queues: map[string]*queueOps{}}
		h.ring[i] = s
	}
	return s
}

// record adds to queue q's counts of this minute and to the totals.
func (h *history) record(q string, f func(*queueOps)) {
	q = h.queues.Value(q)
	h.mu.Lock()
	defer h.mu.Unlock()
	f(h.slot().queue(q))
	t := h.totals[q]
	if t == nil {
		t = &queueOps{}
		h.totals[q] = t
	}
	f(t)
}

// pushed counts one push request's stored messages by queue.
func (h *history) pushed(results []queue.PushResult) {
	by := map[string]int64{}
	for _, r := range results {
		if r.Status == queue.StatusDuplicate || r.Status == queue.StatusRejected {
			continue
		}
		by[r.Queue]++
	}
	for q, n := range by {
		h.record(q, func(o *queueOps) { o.pushRequests++; o.pushMessages += n })
	}
}

// popped counts delivered messages and their lag (now − created at).
func (h *history) popped(msgs []queue.Message) {
	now := h.now()
	for i := 0; i < len(msgs); {
		j := i + 1
		for j < len(msgs) && msgs[j].Queue == msgs[i].Queue {
			j++
		}
		var sum, most float64
		for _, m := range msgs[i:j] {
			lag := max(0, float64(now.Sub(m.CreatedAt))/float64(time.Millisecond))
			sum += lag
			most = max(most, lag)
		}
		n := int64(j - i)
		h.record(msgs[i].Queue, func(o *queueOps) {
			o.popMessages += n
			o.lagCount += n
			o.lagSumMs += sum
			o.lagMaxMs = max(o.lagMaxMs, most)
		})
		i = j
	}
}

// popRequest counts a pop; empty names the queue of one that found
// nothing ("" when it named none).
func (h *history) popRequest(emptyQueue string, empty bool) {
	if empty && emptyQueue != "" {
		h.record(emptyQueue, func(o *queueOps) { o.popEmpty++ })
	}
	h.mu.Lock()
	h.slot().popRequests++
	h.mu.Unlock()
}

// acked counts one ack request's applied acks by queue: completed (or
// success) ones as successes; failed, retry and dlq ones as failures.
func (h *history) acked(acks []queue.Ack, results []queue.AckResult) {
	type counts struct{ ok, failed int64 }
	by := map[string]*counts{}
	for i, r := range results {
		if i >= len(acks) || !r.Success {
			continue
		}
		c := by[r.Queue]
		if c == nil {
			c = &counts{}
			by[r.Queue] = c
		}
		switch acks[i].Status {
		case queue.StatusCompleted, queue.StatusSuccess:
			c.ok++
		default: // failed, retry, dlq: the consumer could not process it
			c.failed++
		}
	}
	for q, c := range by {
		h.record(q, func(o *queueOps) { o.ackRequests++; o.ackSuccess += c.ok; o.ackFailed += c.failed })
	}
}

// deadLettered counts messages moved to the dead-letter queue.
func (h *history) deadLettered(q string, n int64) {
	h.record(q, func(o *queueOps) { o.dlq += n })
}

// transaction counts a transaction touching queue q.
func (h *history) transaction(q string) {
	h.record(q, func(o *queueOps) { o.transactions++ })
}

// dbError counts a request that failed for a database error.
func (h *history) dbError() {
	h.mu.Lock()
	h.slot().dbErrors++
	h.mu.Unlock()
}

// retained counts what a retention run deleted.
func (h *history) retained(ds []queue.RetentionDeleted) {
	for _, d := range ds {
		n := d.N
		var f func(*queueOps)
		switch d.Reason {
		case queue.RetentionAge, queue.RetentionTTL:
			f = func(o *queueOps) { o.retentionMsgs += n; o.retentionEvents++ }
		case "completed_retention":
			f = func(o *queueOps) { o.completedMsgs += n; o.retentionEvents++ }
		case queue.RetentionMaxWait, queue.RetentionMaxWaitDropped:
			f = func(o *queueOps) { o.evictionMsgs += n; o.retentionEvents++ }
		case "partition_cleanup":
			f = func(o *queueOps) { o.partitionsDeleted += n }
		default:
			continue
		}
		h.record(d.Queue, f)
	}
}

// park notes a long-poll starting to wait on queue q; the function it
// returns notes its end.
func (h *history) park(q string) func() {
	if q == "" {
		return func() {}
	}
	q = h.queues.Value(q)
	h.mu.Lock()
	h.parked[q]++
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		if h.parked[q]--; h.parked[q] <= 0 {
			delete(h.parked, q)
		}
		h.mu.Unlock()
	}
}

// sample is one reading of the gauges.
type sample struct {
	cpuUser, cpuSys, rss, vsize               float64
	poolSize, poolIdle, poolActive, poolTotal float64
	freeSlots                                 float64
	gomaxprocs, runnable                      float64
	schedCount                                int64
	schedSumMs, schedMaxMs                    float64
	statements                                int64
}

// addSample puts a sample into this minute's slot, with the long-polls
// waiting now.
func (h *history) addSample(s sample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.slot()
	m.samples++
	m.cpuUser.add(s.cpuUser)
	m.cpuSys.add(s.cpuSys)
	m.rss.add(s.rss)
	m.vsize.add(s.vsize)
	m.poolSize.add(s.poolSize)
	m.poolIdle.add(s.poolIdle)
	m.poolActive.add(s.poolActive)
	m.poolTotal.add(s.poolTotal)
	m.freeSlots.add(s.freeSlots)
	m.gomaxprocs.add(s.gomaxprocs)
	m.runnable.add(s.runnable)
	m.schedCount += s.schedCount
	m.schedSumMs += s.schedSumMs
	m.schedMaxMs = max(m.schedMaxMs, s.schedMaxMs)
	m.statements += s.statements
	for q, n := range h.parked {
		m.queue(q).parkedSum += float64(n)
	}
}

// since copies the totals since the instance started.
func (h *history) since() map[string]queueOps {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]queueOps, len(h.totals))
	for q, o := range h.totals {
		out[q] = *o
	}
	return out
}

// window copies the slots of the minutes in [from, to], oldest first.
func (h *history) window(from, to time.Time) []minuteSlot {
	lo, hi := minuteOf(from), minuteOf(to)
	now := minuteOf(h.now())
	lo = max(lo, now-HistoryMinutes+1)
	hi = min(hi, now)
	var out []minuteSlot
	h.mu.Lock()
	defer h.mu.Unlock()
	for m := lo; m <= hi; m++ {
		s := h.ring[m%HistoryMinutes]
		if s == nil || s.minute != m {
			continue
		}
		c := *s
		c.queues = make(map[string]*queueOps, len(s.queues))
		for q, o := range s.queues {
			cp := *o
			c.queues[q] = &cp
		}
		out = append(out, c)
	}
	return out
}

// sampler reads the gauges: the process's CPU time and memory, the
// database pool, the Go scheduler.
type sampler struct {
	store     *queue.Store
	prevAt    time.Time
	prevUser  time.Duration
	prevSys   time.Duration
	prevSched *rtmetrics.Float64Histogram
	prevStmts int64
	reads     []rtmetrics.Sample
}

func newSampler(store *queue.Store) *sampler {
	return &sampler{store: store, reads: []rtmetrics.Sample{{Name: "/sched/latencies:seconds"},
		{Name: "/sched/gomaxprocs:threads"}, {Name: "/sched/goroutines/runnable:goroutines"}}}
}

// read takes a sample; CPU and scheduler figures are over the time since
// the previous one (zero on the first).
func (sm *sampler) read() sample {
	var s sample
	now := time.Now()
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		user, sys := time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
		if wall := now.Sub(sm.prevAt); !sm.prevAt.IsZero() && wall > 0 {
			s.cpuUser = max(0, float64(user-sm.prevUser)/float64(wall)*100*100)
			s.cpuSys = max(0, float64(sys-sm.prevSys)/float64(wall)*100*100)
		}
		sm.prevUser, sm.prevSys = user, sys
	}
	sm.prevAt = now
	s.rss, s.vsize = procMemory()
	if pool := sm.store.Pool(); pool != nil {
		st := pool.Stat()
		s.poolSize, s.poolIdle = float64(st.MaxConns()), float64(st.IdleConns())
		s.poolActive, s.poolTotal = float64(st.AcquiredConns()), float64(st.TotalConns())
		s.freeSlots = s.poolSize - s.poolActive
	}
	rtmetrics.Read(sm.reads)
	if v := sm.reads[0].Value; v.Kind() == rtmetrics.KindFloat64Histogram {
		h := v.Float64Histogram()
		s.schedCount, s.schedSumMs, s.schedMaxMs = histDelta(sm.prevSched, h)
		sm.prevSched = h
	}
	if v := sm.reads[1].Value; v.Kind() == rtmetrics.KindUint64 {
		s.gomaxprocs = float64(v.Uint64())
	}
	if v := sm.reads[2].Value; v.Kind() == rtmetrics.KindUint64 {
		s.runnable = float64(v.Uint64())
	}
	if qs := sm.store.QueryStats(); qs != nil {
		var n int64
		for _, c := range qs.Snapshot() {
			n += int64(c)
		}
		s.statements = max(0, n-sm.prevStmts)
		if sm.prevStmts == 0 {
			s.statements = 0 // the first sample has no interval
		}
		sm.prevStmts = n
	}
	return s
}

// histDelta is the count, the sum (by bucket midpoints) and the largest
// bucket reached of the observations in cur and not in prev, in
// milliseconds. A nil prev has none.
func histDelta(prev, cur *rtmetrics.Float64Histogram) (n int64, sumMs, maxMs float64) {
	if prev == nil || len(prev.Counts) != len(cur.Counts) {
		return 0, 0, 0
	}
	for i, c := range cur.Counts {
		d := int64(c - prev.Counts[i])
		if d <= 0 {
			continue
		}
		lo, hi := cur.Buckets[i], cur.Buckets[i+1]
		if math.IsInf(lo, -1) {
			lo = 0
		}
		if math.IsInf(hi, 1) {
			hi = lo
		}
		n += d
		sumMs += float64(d) * (lo + hi) / 2 * 1000
		maxMs = max(maxMs, hi*1000)
	}
	return n, sumMs, maxMs
}

// procMemory reads the resident and virtual size from /proc/self/statm
// (Linux); zero elsewhere.
func procMemory() (rss, vsize float64) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, 0
	}
	page := float64(os.Getpagesize())
	v, _ := strconv.ParseFloat(f[0], 64)
	r, _ := strconv.ParseFloat(f[1], 64)
	return r * page, v * page
}

// RunAnalytics samples the gauges of the analytics history every
// HistorySample until ctx ends (internal/server runs it with the other
// loops). Without it the history has counts but no gauges.
func (s *Server) RunAnalytics(ctx context.Context) error {
	sm := newSampler(s.store)
	t := time.NewTicker(HistorySample)
	defer t.Stop()
	s.metrics.history.addSample(sm.read())
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.metrics.history.addSample(sm.read())
		}
	}
}

// RecordRetention adds what a retention run deleted to the analytics
// history (the retention route); internal/server reports each run here
// as it does to RetentionMetrics.
func (s *Server) RecordRetention(ds []queue.RetentionDeleted) { s.metrics.history.retained(ds) }
