package history

import (
	"context"
	"math"
	"os"
	rtmetrics "runtime/metrics"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/heraldmq/herald/internal/tick"
	"github.com/heraldmq/herald/queue"
)

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
	statm     *os.File // /proc/self/statm, kept open: a read at offset 0 is one syscall; nil elsewhere
}

func newSampler(store *queue.Store) *sampler {
	statm, err := os.Open("/proc/self/statm")
	if err != nil {
		statm = nil
	}
	return &sampler{store: store, statm: statm, reads: []rtmetrics.Sample{{Name: "/sched/latencies:seconds"},
		{Name: "/sched/gomaxprocs:threads"}, {Name: "/sched/goroutines/runnable:goroutines"}}}
}

// close lets /proc/self/statm go.
func (sm *sampler) close() {
	if sm.statm != nil {
		_ = sm.statm.Close()
	}
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
			s.CPUUser = max(0, float64(user-sm.prevUser)/float64(wall)*100*100)
			s.CPUSys = max(0, float64(sys-sm.prevSys)/float64(wall)*100*100)
		}
		sm.prevUser, sm.prevSys = user, sys
	}
	sm.prevAt = now
	s.RSS, s.VSize = procMemory(sm.statm)
	if pool := sm.store.Pool(); pool != nil {
		st := pool.Stat()
		s.PoolSize, s.PoolIdle = float64(st.MaxConns()), float64(st.IdleConns())
		s.PoolActive, s.PoolTotal = float64(st.AcquiredConns()), float64(st.TotalConns())
		s.FreeSlots = s.PoolSize - s.PoolActive
	}
	rtmetrics.Read(sm.reads)
	if v := sm.reads[0].Value; v.Kind() == rtmetrics.KindFloat64Histogram {
		h := v.Float64Histogram()
		s.SchedCount, s.SchedSumMs, s.SchedMaxMs = histDelta(sm.prevSched, h)
		sm.prevSched = h
	}
	if v := sm.reads[1].Value; v.Kind() == rtmetrics.KindUint64 {
		s.GoMaxProcs = float64(v.Uint64())
	}
	if v := sm.reads[2].Value; v.Kind() == rtmetrics.KindUint64 {
		s.Runnable = float64(v.Uint64())
	}
	if qs := sm.store.QueryStats(); qs != nil {
		var n int64
		for _, c := range qs.Snapshot() {
			n += int64(c)
		}
		s.Statements = max(0, n-sm.prevStmts)
		if sm.prevStmts == 0 {
			s.Statements = 0 // the first sample has no interval
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

// procMemory reads the resident and virtual size from statm, the open
// /proc/self/statm (Linux; procfs makes its text anew for each read at
// offset 0); zero when nil or unreadable. An idle instance samples every
// second: opening the file each time cost five more syscalls a sample.
func procMemory(statm *os.File) (rss, vsize float64) {
	if statm == nil {
		return 0, 0
	}
	var buf [128]byte
	n, err := statm.ReadAt(buf[:], 0)
	if n == 0 && err != nil {
		return 0, 0
	}
	f := strings.Fields(string(buf[:n]))
	if len(f) < 2 {
		return 0, 0
	}
	page := float64(os.Getpagesize())
	v, _ := strconv.ParseFloat(f[0], 64)
	r, _ := strconv.ParseFloat(f[1], 64)
	return r * page, v * page
}

// Run samples the gauges of the history every HistorySample, reading
// the pool and the statement counts of store, until ctx ends (the
// gateway's RunAnalytics, which internal/server runs with the other
// loops). Without it the history has counts but no gauges.
func (h *Minutes) Run(ctx context.Context, store *queue.Store) error {
	sm := newSampler(store)
	defer sm.close()
	t := tick.NewTimer(HistorySample) // with the members beat: one wake-up for both
	defer t.Stop()
	h.addSample(sm.read())
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			h.addSample(sm.read())
			t.Reset()
		}
	}
}
