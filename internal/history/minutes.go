package history

import (
	"sync"
	"time"

	"github.com/heraldmq/herald/queue"
)

// Minutes is what this instance did and how it fared, one slot per minute
// for the last HistoryMinutes, in memory: the history the analytics routes
// and GET /api/v1/status chart (admin/analytics.go).
//
// The reference server writes such figures to tables every minute; Herald
// keeps them in the process that measured them, so each instance answers
// with its own figures (restarting forgets them). Counts (pushes, pops,
// acks, dead letters, retention's deletions) are added where the gateway
// already counts them for /metrics; gauges (the pool, CPU, memory, the Go
// scheduler, waiting long-polls) are sampled every HistorySample by Run.
// The first HistoryMaxQueues queues seen keep their name, the others share
// one label (the label func New is given), so a slot holds at most
// HistoryMaxQueues + 1 queues' counts (about 200 bytes each): at most
// HistoryMinutes slots, some 15 MB if every one of 50 queues is busy every
// minute of a day; a minute in which nothing happened takes a sample's
// 400 bytes. Safe for concurrent use.
type Minutes struct {
	label func(string) string
	now   func() time.Time

	mu     sync.Mutex
	ring   [HistoryMinutes]*Slot
	totals map[string]*QueueOps // since the instance started, by queue label
	parked map[string]int       // long-polls waiting now, by queue label
}

// HistoryMinutes is how many one-minute slots the history keeps: 24 h.
// HistorySample is how often Run samples the gauges: 30 samples a minute
// (each wake-up of an idle instance costs the Go runtime more than the
// sample; CPU figures are over the time since the last sample, so the
// minute's average is exact either way).
// HistoryMaxQueues is how many queues have counts of their own.
const (
	HistoryMinutes   = 24 * 60
	HistorySample    = 2 * time.Second
	HistoryMaxQueues = 50
)

// NewMinutes returns an empty history; label gives a queue's name as the
// history keeps it (a bounded set of names: the gateway passes a label
// limiter's HistoryMaxQueues).
func NewMinutes(label func(string) string) *Minutes {
	return &Minutes{label: label, now: time.Now, totals: map[string]*QueueOps{}, parked: map[string]int{}}
}

// QueueOps are one queue's counts in one minute (or since the instance
// started: Minutes.Since).
type QueueOps struct {
	PushRequests, PushMessages                 int64
	PopMessages, PopEmpty                      int64
	AckRequests, AckSuccess, AckFailed         int64
	DLQ, Transactions, PartitionsDeleted       int64
	RetentionMsgs, CompletedMsgs, EvictionMsgs int64
	RetentionEvents                            int64
	// Lag: time from push to delivery of each popped message.
	LagCount           int64
	LagSumMs, LagMaxMs float64
	// ParkedSum adds the long-polls waiting on the queue at each sample
	// of the minute (its average is ParkedSum / Slot.Samples).
	ParkedSum float64
}

// Add adds p's counts to o's (the larger LagMaxMs).
func (o *QueueOps) Add(p *QueueOps) {
	o.PushRequests += p.PushRequests
	o.PushMessages += p.PushMessages
	o.PopMessages += p.PopMessages
	o.PopEmpty += p.PopEmpty
	o.AckRequests += p.AckRequests
	o.AckSuccess += p.AckSuccess
	o.AckFailed += p.AckFailed
	o.DLQ += p.DLQ
	o.Transactions += p.Transactions
	o.PartitionsDeleted += p.PartitionsDeleted
	o.RetentionMsgs += p.RetentionMsgs
	o.CompletedMsgs += p.CompletedMsgs
	o.EvictionMsgs += p.EvictionMsgs
	o.RetentionEvents += p.RetentionEvents
	o.LagCount += p.LagCount
	o.LagSumMs += p.LagSumMs
	o.LagMaxMs = max(o.LagMaxMs, p.LagMaxMs)
	o.ParkedSum += p.ParkedSum
}

// Gauge is a gauge's samples in one minute.
type Gauge struct {
	N                   int // samples
	Sum, Min, Max, Last float64
}

func (g *Gauge) add(v float64) {
	if g.N == 0 || v < g.Min {
		g.Min = v
	}
	if g.N == 0 || v > g.Max {
		g.Max = v
	}
	g.N++
	g.Sum += v
	g.Last = v
}

// Merge adds o's samples to g's.
func (g *Gauge) Merge(o Gauge) {
	if o.N == 0 {
		return
	}
	if g.N == 0 {
		*g = o
		return
	}
	g.Min, g.Max = min(g.Min, o.Min), max(g.Max, o.Max)
	g.N += o.N
	g.Sum += o.Sum
	g.Last = o.Last
}

// Avg is the samples' mean (0 without any).
func (g Gauge) Avg() float64 {
	if g.N == 0 {
		return 0
	}
	return g.Sum / float64(g.N)
}

// Slot is one minute of the history.
type Slot struct {
	Minute int64 // minutes since the epoch
	Queues map[string]*QueueOps
	// PopRequests counts pops (HTTP and WebSocket), whatever they named.
	PopRequests int64
	DBErrors    int64 // requests answered 500 or 503 for a database error
	Statements  int64 // statements sent to the database (queue.QueryStats)
	Samples     int
	// Sampled gauges. CPUUser and CPUSys are percent × 100 of one core,
	// as the reference server reports them.
	CPUUser, CPUSys, RSS, VSize               Gauge
	PoolSize, PoolIdle, PoolActive, PoolTotal Gauge
	FreeSlots                                 Gauge
	GoMaxProcs, Runnable                      Gauge
	SchedCount                                int64
	SchedSumMs, SchedMaxMs                    float64
}

// AddInstance adds o's instance figures to m's: the samples and gauges,
// the scheduler latency, the requests, errors and statements; not the
// queues' counts (QueueOps.Add sums those, queue by queue).
func (m *Slot) AddInstance(o *Slot) {
	m.PopRequests += o.PopRequests
	m.DBErrors += o.DBErrors
	m.Statements += o.Statements
	m.Samples += o.Samples
	for i, g := range m.gauges() {
		g.Merge(*o.gauges()[i])
	}
	m.SchedCount += o.SchedCount
	m.SchedSumMs += o.SchedSumMs
	m.SchedMaxMs = max(m.SchedMaxMs, o.SchedMaxMs)
}

// gauges are m's sampled gauges, in one order.
func (m *Slot) gauges() [11]*Gauge {
	return [...]*Gauge{&m.CPUUser, &m.CPUSys, &m.RSS, &m.VSize, &m.PoolSize, &m.PoolIdle, &m.PoolActive, &m.PoolTotal,
		&m.FreeSlots, &m.GoMaxProcs, &m.Runnable}
}

func (m *Slot) queue(q string) *QueueOps {
	o := m.Queues[q]
	if o == nil {
		o = &QueueOps{}
		m.Queues[q] = o
	}
	return o
}

func minuteOf(t time.Time) int64 { return t.Unix() / 60 }

// slot is the current minute's slot; h.mu is held.
func (h *Minutes) slot() *Slot {
	m := minuteOf(h.now())
	i := m % HistoryMinutes
	s := h.ring[i]
	if s == nil || s.Minute != m {
		s = &Slot{Minute: m, Queues: map[string]*QueueOps{}}
		h.ring[i] = s
	}
	return s
}

// record adds to queue q's counts of this minute and to the totals.
func (h *Minutes) record(q string, f func(*QueueOps)) {
	q = h.label(q)
	h.mu.Lock()
	defer h.mu.Unlock()
	f(h.slot().queue(q))
	t := h.totals[q]
	if t == nil {
		t = &QueueOps{}
		h.totals[q] = t
	}
	f(t)
}

// Pushed counts one push request's stored messages by queue.
func (h *Minutes) Pushed(results []queue.PushResult) {
	by := map[string]int64{}
	for _, r := range results {
		if r.Status == queue.StatusDuplicate || r.Status == queue.StatusRejected {
			continue
		}
		by[r.Queue]++
	}
	for q, n := range by {
		h.record(q, func(o *QueueOps) { o.PushRequests++; o.PushMessages += n })
	}
}

// Popped counts delivered messages and their lag (now − created at).
func (h *Minutes) Popped(msgs []queue.Message) {
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
		h.record(msgs[i].Queue, func(o *QueueOps) {
			o.PopMessages += n
			o.LagCount += n
			o.LagSumMs += sum
			o.LagMaxMs = max(o.LagMaxMs, most)
		})
		i = j
	}
}

// PopRequest counts a pop; empty names the queue of one that found
// nothing ("" when it named none).
func (h *Minutes) PopRequest(emptyQueue string, empty bool) {
	if empty && emptyQueue != "" {
		h.record(emptyQueue, func(o *QueueOps) { o.PopEmpty++ })
	}
	h.mu.Lock()
	h.slot().PopRequests++
	h.mu.Unlock()
}

// Acked counts one ack request's applied acks by queue: completed (or
// success) ones as successes; failed, retry and dlq ones as failures.
func (h *Minutes) Acked(acks []queue.Ack, results []queue.AckResult) {
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
		h.record(q, func(o *QueueOps) { o.AckRequests++; o.AckSuccess += c.ok; o.AckFailed += c.failed })
	}
}

// DeadLettered counts messages moved to the dead-letter queue.
func (h *Minutes) DeadLettered(q string, n int64) {
	h.record(q, func(o *QueueOps) { o.DLQ += n })
}

// Transaction counts a transaction touching queue q.
func (h *Minutes) Transaction(q string) {
	h.record(q, func(o *QueueOps) { o.Transactions++ })
}

// DBError counts a request that failed for a database error.
func (h *Minutes) DBError() {
	h.mu.Lock()
	h.slot().DBErrors++
	h.mu.Unlock()
}

// Retained counts what a retention run deleted.
func (h *Minutes) Retained(ds []queue.RetentionDeleted) {
	for _, d := range ds {
		n := d.N
		var f func(*QueueOps)
		switch d.Reason {
		case queue.RetentionAge, queue.RetentionTTL:
			f = func(o *QueueOps) { o.RetentionMsgs += n; o.RetentionEvents++ }
		case "completed_retention":
			f = func(o *QueueOps) { o.CompletedMsgs += n; o.RetentionEvents++ }
		case queue.RetentionMaxWait, queue.RetentionMaxWaitDropped:
			f = func(o *QueueOps) { o.EvictionMsgs += n; o.RetentionEvents++ }
		case "partition_cleanup":
			f = func(o *QueueOps) { o.PartitionsDeleted += n }
		default:
			continue
		}
		h.record(d.Queue, f)
	}
}

// Park notes a long-poll starting to wait on queue q; the function it
// returns notes its end.
func (h *Minutes) Park(q string) func() {
	if q == "" {
		return func() {}
	}
	q = h.label(q)
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
	CPUUser, CPUSys, RSS, VSize               float64
	PoolSize, PoolIdle, PoolActive, PoolTotal float64
	FreeSlots                                 float64
	GoMaxProcs, Runnable                      float64
	SchedCount                                int64
	SchedSumMs, SchedMaxMs                    float64
	Statements                                int64
}

// addSample puts a sample into this minute's slot, with the long-polls
// waiting now.
func (h *Minutes) addSample(s sample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.slot()
	m.Samples++
	m.CPUUser.add(s.CPUUser)
	m.CPUSys.add(s.CPUSys)
	m.RSS.add(s.RSS)
	m.VSize.add(s.VSize)
	m.PoolSize.add(s.PoolSize)
	m.PoolIdle.add(s.PoolIdle)
	m.PoolActive.add(s.PoolActive)
	m.PoolTotal.add(s.PoolTotal)
	m.FreeSlots.add(s.FreeSlots)
	m.GoMaxProcs.add(s.GoMaxProcs)
	m.Runnable.add(s.Runnable)
	m.SchedCount += s.SchedCount
	m.SchedSumMs += s.SchedSumMs
	m.SchedMaxMs = max(m.SchedMaxMs, s.SchedMaxMs)
	m.Statements += s.Statements
	for q, n := range h.parked {
		m.queue(q).ParkedSum += float64(n)
	}
}

// Since copies the totals since the instance started.
func (h *Minutes) Since() map[string]QueueOps {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]QueueOps, len(h.totals))
	for q, o := range h.totals {
		out[q] = *o
	}
	return out
}

// Window copies the slots of the minutes in [from, to], oldest first.
func (h *Minutes) Window(from, to time.Time) []Slot {
	lo, hi := minuteOf(from), minuteOf(to)
	now := minuteOf(h.now())
	lo = max(lo, now-HistoryMinutes+1)
	hi = min(hi, now)
	var out []Slot
	h.mu.Lock()
	defer h.mu.Unlock()
	for m := lo; m <= hi; m++ {
		s := h.ring[m%HistoryMinutes]
		if s == nil || s.Minute != m {
			continue
		}
		c := *s
		c.Queues = make(map[string]*QueueOps, len(s.Queues))
		for q, o := range s.Queues {
			cp := *o
			c.Queues[q] = &cp
		}
		out = append(out, c)
	}
	return out
}
