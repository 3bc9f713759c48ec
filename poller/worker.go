package poller

import (
	"context"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/heraldmq/herald/queue"
)

// worker runs the poll cycle for the queues hashed to it. Its mutex guards
// its keys and the mutable fields of their intentions; it is never held
// during a query or a Deliver call.
type worker struct {
	p    *Poller
	idx  int
	wake chan struct{} // capacity 1: a pending signal is enough

	mu   sync.Mutex
	keys map[string]*keyState
}

// keyState is one queue (or namespace pattern) with waiting intentions.
type keyState struct {
	intentions []*Intention // registration order
	dirty      bool         // check at the next cycle
	dueAt      time.Time    // a blocked partition becomes eligible then
}

func newWorker(p *Poller, idx int) *worker {
	return &worker{p: p, idx: idx, wake: make(chan struct{}, 1), keys: map[string]*keyState{}}
}

func (w *worker) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// markGone ends an intention. Called with mu held; idempotent.
func (w *worker) markGone(in *Intention) {
	if in.gone {
		return
	}
	in.gone = true
	w.p.metrics.intentions.Dec()
	if in.Target.Queue == "" {
		w.p.nsKeys.Add(-1)
	}
}

func (w *worker) markNamespaceKeysDirty() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	found := false
	for k, ks := range w.keys {
		if strings.HasPrefix(k, "n:") {
			ks.dirty = true
			found = true
		}
	}
	return found
}

// run loops until ctx ends: a cycle on every signal, on the earliest
// eligibility time of a blocked partition, and on the adaptive sweep.
func (w *worker) run(ctx context.Context) {
	sw := newSweep(w.p.cfg.SweepMin, w.p.cfg.SweepMax)
	nextSweep := time.Now().Add(sw.next(false))
	worked := false
	timer := time.NewTimer(time.Until(nextSweep))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		case <-timer.C:
		}
		now := time.Now()
		sweeping := !now.Before(nextSweep)
		did, due := w.cycle(ctx, sweeping)
		worked = worked || did
		if sweeping {
			nextSweep = time.Now().Add(sw.next(worked))
			worked = false
		}
		next := nextSweep
		if !due.IsZero() && due.Before(next) {
			next = due
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(max(time.Until(next), 0))
	}
}

// cycle serves the dirty keys (all keys when sweeping). It reports whether
// it found work and the earliest time a blocked partition becomes eligible.
// With nothing dirty it sends no SQL at all.
func (w *worker) cycle(ctx context.Context, sweeping bool) (worked bool, due time.Time) {
	now := time.Now()
	var work []*Intention
	w.mu.Lock()
	for k, ks := range w.keys {
		live := ks.intentions[:0]
		for _, in := range ks.intentions {
			if !in.gone && !in.Deadline.IsZero() && now.After(in.Deadline) {
				w.markGone(in)
			}
			if !in.gone {
				live = append(live, in)
			}
		}
		clear(ks.intentions[len(live):])
		ks.intentions = live
		if len(live) == 0 {
			delete(w.keys, k)
			continue
		}
		if !ks.dueAt.IsZero() && !now.Before(ks.dueAt) {
			ks.dirty, ks.dueAt = true, time.Time{}
		}
		if sweeping {
			ks.dirty = true
		}
		if !ks.dirty {
			if !ks.dueAt.IsZero() && (due.IsZero() || ks.dueAt.Before(due)) {
				due = ks.dueAt
			}
			continue
		}
		ks.dirty = false
		for _, in := range live {
			if in.credit > 0 {
				work = append(work, in)
			}
		}
	}
	w.mu.Unlock()
	if len(work) == 0 {
		return false, due
	}
	sort.Slice(work, func(i, j int) bool { return work[i].seq < work[j].seq })
	for _, chunk := range chunkByTarget(work, w.p.cfg.MaxIntentions) {
		did, d := w.serve(ctx, chunk)
		worked = worked || did
		if !d.IsZero() && (due.IsZero() || d.Before(due)) {
			due = d
		}
	}
	return worked, due
}

// chunkByTarget splits intentions (in registration order) so that no chunk
// asks the pre-flight about more than maxTargets distinct targets. Many
// intentions waiting on one queue, partition and group are one target: they
// cost the pre-flight nothing extra, so they are never split apart.
func chunkByTarget(work []*Intention, maxTargets int) [][]*Intention {
	type tkey struct{ key, partition, group string }
	chunkOf := map[tkey]int{}
	var chunks [][]*Intention
	var counts []int
	for _, in := range work {
		k := tkey{in.key, in.Target.Partition, in.Target.Group}
		c, ok := chunkOf[k]
		if !ok {
			if len(chunks) == 0 || counts[len(chunks)-1] == maxTargets {
				chunks = append(chunks, nil)
				counts = append(counts, 0)
			}
			c = len(chunks) - 1
			chunkOf[k] = c
			counts[c]++
		}
		chunks[c] = append(chunks[c], in)
	}
	return chunks
}

// serve runs one pre-flight, the decision and one coalesced pop for a chunk
// of intentions.
func (w *worker) serve(ctx context.Context, chunk []*Intention) (worked bool, due time.Time) {
	p := w.p
	p.metrics.cycles.Inc()
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()

	// One target per distinct (key, partition, group).
	type tkey struct{ key, partition, group string }
	targetIdx := map[tkey]int{}
	var targets []queue.Target
	var targetKeys []string
	cands := make([]candidate, len(chunk))
	for i, in := range chunk {
		tk := tkey{in.key, in.Target.Partition, in.Target.Group}
		ti, ok := targetIdx[tk]
		if !ok {
			ti = len(targets)
			targetIdx[tk] = ti
			targets = append(targets, in.Target)
			targetKeys = append(targetKeys, in.key)
		}
		cands[i] = candidate{id: i, target: ti, specific: in.Target.Partition != "", seq: in.seq, partitions: in.Partitions}
	}

	start := time.Now()
	avail, err := p.store.Preflight(ctx, targets)
	took := time.Since(start)
	p.metrics.preflight.Observe(took.Seconds())
	if took > p.cfg.PreflightTimeout {
		p.log.Warn().Dur("took", took).Int("intentions", len(chunk)).Int("targets", len(targets)).
			Msg("pre-flight slower than its timeout")
	}
	if err != nil {
		if ctx.Err() == nil {
			p.log.Error().Err(err).Msg("pre-flight failed")
		}
		return false, time.Now().Add(p.cfg.SweepMin) // retry soon
	}

	// Partitions a group has never read need consumer rows first; blocked
	// ones set the timer; an expiry that dead-letters takes the slow path.
	needRows := map[int]bool{}
	var dead []queue.Availability
	dueAt := map[string]time.Time{}
	for _, a := range avail {
		switch {
		case !a.HasConsumer:
			needRows[a.Target] = true
		case a.DeadOnExpiry:
			dead = append(dead, a)
		case !a.Eligible && !a.EligibleAt.IsZero():
			k := targetKeys[a.Target]
			if d, ok := dueAt[k]; !ok || a.EligibleAt.Before(d) {
				dueAt[k] = a.EligibleAt
			}
			if due.IsZero() || a.EligibleAt.Before(due) {
				due = a.EligibleAt
			}
		}
	}
	if len(dueAt) > 0 {
		w.mu.Lock()
		for k, at := range dueAt {
			if ks := w.keys[k]; ks != nil && (ks.dueAt.IsZero() || at.Before(ks.dueAt)) {
				ks.dueAt = at
			}
		}
		w.mu.Unlock()
	}

	assigns, skipped := decide(cands, avail)
	if n := doubleAssigned(assigns); n > 0 {
		p.metrics.double.Add(float64(n))
		p.log.Error().Int("pairs", n).Msg("decision engine assigned a partition twice")
		return false, due
	}
	for _, reason := range skipped {
		p.metrics.skipped.WithLabelValues(reason).Inc()
	}

	if len(needRows) > 0 {
		var ts []queue.Target
		for ti := range needRows {
			ts = append(ts, targets[ti])
		}
		if err := p.store.EnsureConsumers(ctx, ts); err != nil {
			p.log.Error().Err(err).Msg("creating consumer rows failed")
		} else {
			// Their partitions can be leased from the next cycle, now.
			w.markDirty(chunk, needRows, cands)
			worked = true
		}
	}

	leases := make([]string, len(chunk))
	var as []queue.Assignment
	for _, a := range assigns {
		in := chunk[a.candidate]
		n := min(in.Batch, in.credit)
		if leases[a.candidate] == "" && !in.AutoAck {
			leases[a.candidate] = queue.NewID()
		}
		as = append(as, queue.Assignment{Intention: a.candidate, PartitionID: a.avail.PartitionID, Group: a.avail.Group,
			Limit: n, Total: n, AutoAck: in.AutoAck, LeaseID: leases[a.candidate]})
	}
	if len(as) > 0 {
		worked = true
		got, err := p.store.PopAssigned(ctx, as)
		if err != nil {
			p.log.Error().Err(err).Msg("coalesced pop failed")
			return worked, time.Now().Add(p.cfg.SweepMin)
		}
		for id, res := range got {
			w.deliver(ctx, chunk[id], res)
		}
	}

	// Rare: an expired lease whose attempt dead-letters goes through Pop,
	// for the oldest intention of its target that got nothing.
	served := map[int]bool{}
	for _, a := range assigns {
		served[a.candidate] = true
	}
	for _, a := range dead {
		for i, in := range chunk {
			if served[i] || cands[i].target != a.Target {
				continue
			}
			served[i] = true
			worked = true
			res, err := p.store.Pop(ctx, queue.PopRequest{Queue: a.Queue, Partition: a.Partition, Group: a.Group,
				Batch: min(in.Batch, in.credit), AutoAck: in.AutoAck})
			if err != nil {
				p.log.Error().Err(err).Msg("pop after lease expiry failed")
			} else if len(res.Messages) > 0 {
				w.deliver(ctx, in, res)
			}
			break
		}
	}
	return worked, due
}

// markDirty flags the keys of the intentions whose targets needed consumer
// rows, and signals the worker to run again.
func (w *worker) markDirty(chunk []*Intention, targets map[int]bool, cands []candidate) {
	w.mu.Lock()
	for i, in := range chunk {
		if targets[cands[i].target] {
			if ks := w.keys[in.key]; ks != nil {
				ks.dirty = true
			}
		}
	}
	w.mu.Unlock()
	w.signal()
}

// deliver hands res to its intention, or releases the lease at once if the
// consumer is gone.
func (w *worker) deliver(ctx context.Context, in *Intention, res *queue.PopResult) {
	w.mu.Lock()
	gone := in.gone
	w.mu.Unlock()
	if !gone && in.Deliver(res) {
		w.p.metrics.delivered.Inc()
		w.mu.Lock()
		if in.Standing {
			in.credit -= len(res.Messages)
		} else {
			w.markGone(in)
		}
		w.mu.Unlock()
		return
	}
	if res.LeaseID != "" {
		if err := w.p.store.ReleaseLease(context.WithoutCancel(ctx), res.LeaseID); err != nil {
			w.p.log.Error().Err(err).Msg("releasing the lease of a consumer that left")
		}
	}
}
