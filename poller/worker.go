package poller

import (
	"context"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/heraldmq/herald/queue"
)

// worker runs the poll cycle for the queues hashed to it. Its mutex guards
// its keys and the mutable fields of their intentions; it is never held
// during a query or a callback (doc.go, Concurrency).
type worker struct {
	p    *Poller
	idx  int
	wake chan struct{} // capacity 1: a pending signal is enough
	woke atomic.Uint64 // cycles begun (a signal or the timer): tests of idle cost
	done atomic.Uint64 // cycles ended: woke > done while one runs (tests wait for quiet)

	mu   sync.Mutex
	keys map[string]*keyState
	// armed is the earliest key eligibility time (keyState.dueAt) set by
	// a delivery since the timer was last set (noteAnswer): run arms the
	// timer for it after the cycle.
	armed time.Time
	// served is signalled (on mu) when a one-shot intention's pops under
	// way are delivered (Intention.serving).
	served *sync.Cond
}

// keyState is one queue (or namespace pattern) with waiting intentions.
type keyState struct {
	intentions []*Intention               // registration order
	dirty      bool                       // run a pre-flight for it at the next cycle
	hints      map[string]bool            // partitions a wake-up says got messages (fast path): true while only this instance's pushes said so
	handed     map[string]bool            // partition id + "\x00" + group a push leased to an intention here
	streams    map[streamKey]*streamLease // the leases its streams hold, which a push here extends (extend.go)
	// rehinted: partitions woken again while the key lingered (no live
	// intention: lingers), after a push's hand-off may have marked them
	// handed; that mark is stale for them (hintedItem drops it): what came
	// since is the next intention's.
	rehinted map[string]bool
	dueAt    time.Time // a blocked partition becomes eligible then
	remoteAt time.Time // the last wake-up from another instance that may have come merged (AddCredit)
	// claim: the key's only intention took all it could at its last
	// delivery, so its queue has a backlog: the next cycle claims straight
	// from the queue's ready rows (claimServe), with no pre-flight, until a
	// claim comes back short or a sweep runs.
	claim bool
	// known: (partition, group) targets with nothing eligible waiting but
	// in the partitions hinted since (hints): the last pre-flight found
	// none, or every partition it found was leased in its cycle and
	// drained, and since then only partition wake-ups came (touch forgets
	// them all). A new intention on one of them runs no pre-flight: with
	// no hint it waits for a wake-up or a push's hand-off (a long-poll
	// asking again when its wait ends costs no query); with hints the
	// fast path serves it from them (a long-poll asking again after its
	// ack). noteKnown learns them; a fast-path cycle that leaves a hinted
	// partition to none of a group's intentions, and a one-shot delivery
	// that took all it could, forget them.
	known map[[2]string]bool
	// leased: (partition id, group) of the leases one-shot answers here
	// took that this instance has not heard released (LeaseReleased).
	// While one is, a new intention does not trust known: its client may
	// have acked elsewhere (another instance), giving messages back that
	// no wake-up here tells of. A touch forgets them: the pre-flight after
	// it sees what they hold.
	leased map[hintKey]bool
}

// touch marks the key for a pre-flight at the next cycle; what its last
// one knew may have changed.
func (ks *keyState) touch() {
	ks.dirty = true
	ks.known = nil
	ks.leased = nil
}

// trusts reports whether a new intention on target t may go by what the
// key knows (known), with no lease of an answer here unheard of. Called
// with the worker's mutex.
func (ks *keyState) trusts(t [2]string) bool { return ks.known[t] && len(ks.leased) == 0 }

// hinted reports whether a wake-up hinted a partition an intention naming
// partition ("" for any) may take. Called with the worker's mutex.
func (ks *keyState) hinted(partition string) bool {
	if partition == "" {
		return len(ks.hints) > 0
	}
	_, ok := ks.hints[partition]
	return ok
}

// lingers reports whether a key whose intentions are all gone is kept for
// the next one: it knows targets (known), so a long-poll asking again
// after its answer is served from the hints since, not a pre-flight. A
// touch or the sweep ends it (its knowledge is gone), and so does its
// eligibility time (dueAt: the lease of the answer it knows of may
// expire). Called with the worker's mutex.
func (ks *keyState) lingers() bool { return !ks.dirty && len(ks.known) > 0 }

// anyReady reports whether one of ins may take messages now. Called with
// the worker's mutex.
func anyReady(ins []*Intention) bool {
	for _, in := range ins {
		if !in.gone && in.ready() {
			return true
		}
	}
	return false
}

// allOneShot reports whether ins are all one-shot intentions.
func allOneShot(ins []*Intention) bool {
	for _, in := range ins {
		if in.Standing {
			return false
		}
	}
	return true
}

func newWorker(p *Poller, idx int) *worker {
	w := &worker{p: p, idx: idx, wake: make(chan struct{}, 1), keys: map[string]*keyState{}}
	w.served = sync.NewCond(&w.mu)
	return w
}

func (w *worker) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// markGone ends an intention and reports whether it ended now (it is
// idempotent). Called with mu held: the caller tells OnPresence
// (Poller.withdrawn) once it has let go of mu.
func (w *worker) markGone(in *Intention) bool {
	if in.gone {
		return false
	}
	in.gone = true
	w.p.metrics.intentions.Dec()
	if in.Target.Queue == "" {
		w.p.nsKeys.Add(-1)
	}
	return true
}

func (w *worker) markNamespaceKeysDirty() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	found := false
	for k, ks := range w.keys {
		if strings.HasPrefix(k, "n:") {
			ks.touch()
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
		w.woke.Add(1)
		now := time.Now()
		sweeping := !now.Before(nextSweep)
		did, due := w.cycle(ctx, sweeping)
		w.done.Add(1)
		worked = worked || did
		if sweeping {
			nextSweep = time.Now().Add(sw.next(worked))
			worked = false
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		w.mu.Lock()
		idle := len(w.keys) == 0
		if !w.armed.IsZero() && (due.IsZero() || w.armed.Before(due)) {
			due = w.armed
		}
		w.armed = time.Time{}
		w.mu.Unlock()
		if idle {
			// Nothing waits here: nothing to sweep for and nothing due.
			// The timer stays off (an idle instance's worker woke every
			// SweepMax for nothing); a registration signals.
			continue
		}
		next := nextSweep
		if !due.IsZero() && due.Before(next) {
			next = due
		}
		timer.Reset(max(time.Until(next), 0))
	}
}

// cycle serves the dirty keys (all keys when sweeping). It reports whether
// it found work and the earliest time a blocked partition becomes eligible.
// With nothing dirty it sends no SQL at all.
func (w *worker) cycle(ctx context.Context, sweeping bool) (worked bool, due time.Time) {
	if w.p.paused.Load() {
		return false, time.Time{} // SetPaused(false) marks every key
	}
	work, claims, expired, fast, due := w.collect(time.Now(), sweeping)
	w.p.withdrawn(expired...)
	if len(fast) > 0 {
		worked, due = w.fastServe(ctx, fast, due)
	}
	for _, in := range claims {
		worked = w.claimServe(ctx, in) || worked
	}
	if len(work) == 0 {
		return worked, due
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

// collect takes, under the worker's mutex, what a cycle serves: the
// intentions of dirty keys that are ready (work; claims: a lone one of a
// claiming key), the keys with lease hints to serve on the fast path, and
// the intentions whose deadline passed (expired, marked gone); due is
// the earliest time a clean key becomes eligible.
func (w *worker) collect(now time.Time, sweeping bool) (work, claims, expired []*Intention, fast []hinted, due time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, ks := range w.keys {
		live := ks.intentions[:0]
		for _, in := range ks.intentions {
			// Not while a push's hand-off serves it (serving): what the
			// push leased it (with autoAck, consumed) is its answer.
			if !in.gone && in.serving == 0 && !in.Deadline.IsZero() && now.After(in.Deadline) && w.markGone(in) {
				expired = append(expired, in)
			}
			if !in.gone {
				live = append(live, in)
			}
		}
		clear(ks.intentions[len(live):])
		ks.intentions = live
		if !ks.dueAt.IsZero() && !now.Before(ks.dueAt) {
			ks.touch()
			ks.dueAt = time.Time{}
		}
		if sweeping {
			ks.touch()
		}
		if len(live) == 0 {
			if !ks.lingers() {
				delete(w.keys, k)
			} else if !ks.dueAt.IsZero() && (due.IsZero() || ks.dueAt.Before(due)) {
				due = ks.dueAt
			}
			continue
		}
		if !ks.dirty && len(ks.hints) > 0 && !anyReady(live) && allOneShot(live) {
			// Long-polls answered or held by a push's hand-off: the hints
			// wait for the next one (a hand-off that leased nothing gives
			// its long-poll back, and it looks: missed).
			for _, in := range live {
				in.missed = true
			}
			if !ks.dueAt.IsZero() && (due.IsZero() || ks.dueAt.Before(due)) {
				due = ks.dueAt
			}
			continue
		}
		if !ks.dirty && len(ks.hints) > 0 {
			fast = append(fast, hinted{key: k, hints: ks.hints, handed: ks.handed, rehinted: ks.rehinted, intentions: slices.Clone(live)})
			ks.hints, ks.handed, ks.rehinted = nil, nil, nil
			continue
		}
		if !ks.dirty {
			if !ks.dueAt.IsZero() && (due.IsZero() || ks.dueAt.Before(due)) {
				due = ks.dueAt
			}
			continue
		}
		ks.dirty, ks.hints, ks.handed, ks.rehinted = false, nil, nil, nil
		if ks.claim && !sweeping && len(live) == 1 && claimable(live[0]) {
			if live[0].ready() {
				claims = append(claims, live[0])
			} else {
				live[0].missed = true
			}
			continue
		}
		for _, in := range live {
			if in.ready() {
				work = append(work, in)
			} else {
				in.missed = true
			}
		}
	}
	return work, claims, expired, fast, due
}

// claimable reports whether an intention may be served by claimServe: a
// subscription to any partition of one queue.
func claimable(in *Intention) bool {
	return in.Standing && in.Target.Queue != "" && in.Target.Partition == ""
}

// claimServe serves the only intention of a queue with a backlog: one
// statement claims its partitions from the queue's ready rows and leases
// them (Store.PopClaim), with no pre-flight: the pre-flight would have
// listed the same rows, and decide given them all to the one intention.
// A claim that comes back short of what the intention could take hands the
// key back to the pre-flight, which also finds what a claim skips: a
// partition inside its window or delay (its timer), an expired lease that
// dead-letters, rows another pop held.
func (w *worker) claimServe(ctx context.Context, in *Intention) (worked bool) {
	p := w.p
	p.metrics.claims.Inc()
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	w.mu.Lock()
	if in.gone || !in.ready() {
		in.missed = true // a push's hand-off holds its credit: looked at when it lets go
		w.mu.Unlock()
		return false
	}
	defer p.leasing.begin()() // before its lease id, until delivered
	c := queue.Claim{Queue: in.Target.Queue, Group: in.Target.Group, Partitions: max(in.Partitions, 1),
		Limit: min(in.Batch, in.free()), Total: in.take(), AutoAck: in.AutoAck, Subject: in.Subject,
		Stream: in.Standing}
	if !in.AutoAck {
		c.LeaseID = queue.NewID()
	}
	// Claimed partitions all hold work: fewer than asked is no sign that
	// one came back empty (deliver's partitions check), so none is planned.
	pl := plan{total: c.Total}
	unhold := w.hold(map[int]plan{0: pl}, func(int) *Intention { return in })
	w.mu.Unlock()
	got, err := w.popDeliver(ctx, func() (map[int]*queue.PopResult, error) { return p.store.PopClaim(ctx, c) }, unhold,
		func(int) *Intention { return in }, []string{c.LeaseID}, map[int]plan{0: pl}, func(int) bool { return false },
		"claiming pop failed")
	res := got[0]
	if err == nil && res != nil && (len(res.Messages) >= c.Total || res.PartitionsClaimed >= c.Partitions) {
		return true
	}
	// Short: the pre-flight looks at the queue next.
	w.mu.Lock()
	if ks := w.keys[in.key]; ks != nil {
		ks.claim = false
		ks.touch()
	}
	w.mu.Unlock()
	w.signal()
	return res != nil
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
	ts := w.targetsOf(chunk)
	avail, err := w.preflight(ctx, chunk, ts.targets)
	if err != nil {
		return false, w.retryChunk(chunk) // retry soon
	}
	needRows, dead, due := w.noteAvailability(avail, ts)
	assigns, skipped := decide(ts.cands, avail)
	if n := doubleAssigned(assigns); n > 0 {
		p.metrics.double.Add(float64(n))
		p.log.Error().Int("pairs", n).Msg("decision engine assigned a partition twice")
		return false, due
	}
	for _, reason := range skipped {
		p.metrics.skipped.WithLabelValues(reason).Inc()
	}
	if len(needRows) > 0 && w.ensureRows(ctx, chunk, needRows, ts) {
		worked = true // their partitions can be leased from the next cycle, now
	}
	var got map[int]*queue.PopResult
	if len(assigns) > 0 {
		worked = true
		var retry time.Time
		var failed bool
		retry, got, failed = w.popAssigned(ctx, chunk, assigns, ts.cands)
		if failed {
			return worked, w.retryChunk(chunk)
		}
		if !retry.IsZero() && (due.IsZero() || retry.Before(due)) {
			due = retry
		}
	} else {
		w.caughtUp(chunk, nil)
	}
	w.noteKnown(chunk, ts, avail, assigns, got)
	if w.popDeadOnExpiry(ctx, chunk, assigns, dead, ts.cands) {
		worked = true
	}
	return worked, due
}

// targets is a chunk as the pre-flight and decide see it: one target per
// distinct (key, partition, group), the key of each, and a candidate per
// intention.
type targets struct {
	targets []queue.Target
	keys    []string
	cands   []candidate
}

// targetsOf builds a chunk's targets and candidates.
func (w *worker) targetsOf(chunk []*Intention) targets {
	type tkey struct{ key, partition, group string }
	idx := map[tkey]int{}
	ts := targets{cands: make([]candidate, len(chunk))}
	w.mu.Lock() // credit, which take reads, changes under it
	defer w.mu.Unlock()
	for i, in := range chunk {
		tk := tkey{in.key, in.Target.Partition, in.Target.Group}
		ti, ok := idx[tk]
		if !ok {
			ti = len(ts.targets)
			idx[tk] = ti
			ts.targets = append(ts.targets, in.Target)
			ts.keys = append(ts.keys, in.key)
		}
		ts.cands[i] = candidate{id: i, target: ti, specific: in.Target.Partition != "", seq: in.seq, partitions: in.Partitions,
			budget: in.take(), batch: in.Batch}
		// The pre-flight reports as many partitions per target as its
		// intentions could take together.
		if ts.cands[i].specific {
			ts.targets[ti].Want++
		} else {
			ts.targets[ti].Want += max(in.Partitions, 1)
		}
	}
	return ts
}

// preflight runs the one pre-flight query of a chunk.
func (w *worker) preflight(ctx context.Context, chunk []*Intention, targets []queue.Target) ([]queue.Availability, error) {
	p := w.p
	start := time.Now()
	avail, err := p.store.Preflight(ctx, targets)
	took := time.Since(start)
	p.metrics.preflight.Observe(took.Seconds())
	if took > p.cfg.PreflightTimeout {
		p.log.Warn().Dur("took", took).Int("intentions", len(chunk)).Int("targets", len(targets)).
			Msg("pre-flight slower than its timeout")
	}
	if err != nil {
		p.logFailure(ctx, err, "pre-flight failed")
		return nil, err
	}
	p.outage.OK()
	return avail, nil
}

// noteAvailability reads what the pre-flight found besides work: targets
// whose partitions a group has never read (they need consumer rows
// first), expired leases that dead-letter (the slow path), and blocked
// partitions (the keys' timers, and due, the earliest).
func (w *worker) noteAvailability(avail []queue.Availability, ts targets) (needRows map[int]bool, dead []queue.Availability, due time.Time) {
	needRows = map[int]bool{}
	dueAt := map[string]time.Time{}
	for _, a := range avail {
		if a.PartitionID != "" {
			w.p.store.NotePartitionID(a.Queue, a.Partition, a.QueueID, a.PartitionID) // for the fast path
		}
		switch {
		case !a.HasConsumer:
			needRows[a.Target] = true
		case a.DeadOnExpiry:
			dead = append(dead, a)
		case !a.Eligible && !a.EligibleAt.IsZero():
			k := ts.keys[a.Target]
			if d, ok := dueAt[k]; !ok || a.EligibleAt.Before(d) {
				dueAt[k] = a.EligibleAt
			}
			if due.IsZero() || a.EligibleAt.Before(due) {
				due = a.EligibleAt
			}
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, at := range dueAt {
		if ks := w.keys[k]; ks != nil && (ks.dueAt.IsZero() || at.Before(ks.dueAt)) {
			ks.dueAt = at
		}
	}
	return needRows, dead, due
}

// noteKnown marks the targets of a cycle that nothing eligible waits for
// now but what was hinted since (keyState.known): the pre-flight found no
// partition for them, or every one it found was eligible, assigned in this
// cycle to one-shot intentions, and drained by its pop (each result
// claimed every partition it was assigned and holds no More). The
// pre-flight reads one row more than its intentions could take: when all
// were assigned, it read them all. A lease those answers took arms the
// key's timer at its expiry (a client that never acks gets its messages
// again then, through a pre-flight); an expiry unknown (the queue's
// config not cached) leaves the target unknown. Not a key touched since
// the cycle began (a hint since is kept: the next intention is served
// from it).
func (w *worker) noteKnown(chunk []*Intention, ts targets, avail []queue.Availability, assigns []assignment, got map[int]*queue.PopResult) {
	type pair struct {
		target             int
		partitionID, group string
	}
	assigned := map[pair]bool{}
	claims := map[int]int{} // per candidate, the partitions assigned
	for _, a := range assigns {
		assigned[pair{a.avail.Target, a.avail.PartitionID, a.avail.Group}] = true
		claims[a.candidate]++
	}
	open := make([]bool, len(ts.targets)) // something may wait beyond what was hinted
	for _, a := range avail {
		if !a.Eligible || !a.HasConsumer || a.DeadOnExpiry || !assigned[pair{a.Target, a.PartitionID, a.Group}] {
			open[a.Target] = true
		}
	}
	expiry := map[int]time.Time{} // per target, the earliest lease expiry of its answers
	for c, n := range claims {
		ti := ts.cands[c].target
		res := got[c]
		// A subscription's lease is its stream's, which nothing here times.
		if res == nil || res.More || res.PartitionsClaimed < n || chunk[c].Standing {
			open[ti] = true
			continue
		}
		if res.LeaseID == "" {
			continue
		}
		at, ok := w.p.leaseExpiry(res)
		if !ok {
			open[ti] = true
		} else if e, seen := expiry[ti]; !seen || at.Before(e) {
			expiry[ti] = at
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for ti, o := range open {
		ks := w.keys[ts.keys[ti]]
		if o || ks == nil || ks.dirty {
			continue
		}
		if ks.known == nil {
			ks.known = map[[2]string]bool{}
		}
		ks.known[[2]string{ts.targets[ti].Partition, ts.targets[ti].Group}] = true
		if at, ok := expiry[ti]; ok {
			w.armAt(ks, at)
		}
	}
}

// armAt sets ks's eligibility time to at if sooner, and has run arm the
// timer for it after the cycle (armed). Called with the worker's mutex.
func (w *worker) armAt(ks *keyState, at time.Time) {
	if ks.dueAt.IsZero() || at.Before(ks.dueAt) {
		ks.dueAt = at
	}
	if w.armed.IsZero() || at.Before(w.armed) {
		w.armed = at
	}
}

// ensureRows creates the consumer rows of the targets in needRows and
// marks their keys for the next cycle; false if that failed.
func (w *worker) ensureRows(ctx context.Context, chunk []*Intention, needRows map[int]bool, ts targets) bool {
	var need []queue.Target
	for ti := range needRows {
		need = append(need, ts.targets[ti])
	}
	if err := w.p.store.EnsureConsumers(ctx, need); err != nil {
		w.p.log.Error().Err(err).Msg("creating consumer rows failed")
		return false
	}
	w.markDirty(chunk, needRows, ts.cands)
	return true
}

// popAssigned leases what decide assigned, one lease per intention, in one
// statement, and delivers it. It reports when to look again at
// assignments that came back empty, and whether the pop failed.
func (w *worker) popAssigned(ctx context.Context, chunk []*Intention, assigns []assignment, cands []candidate) (retry time.Time, got map[int]*queue.PopResult, failed bool) {
	leases := make([]string, len(chunk))
	var as []queue.Assignment
	defer w.p.leasing.begin()() // before the lease ids, until delivered
	w.mu.Lock()                 // credit changes under it (AddCredit)
	for _, a := range assigns {
		in := chunk[a.candidate]
		if in.gone {
			continue // its consumer left since the pre-flight: pop nothing for it
		}
		if in.inOrder() {
			in.missed = true // a push's hand-off to it since: looked at once delivered
			continue
		}
		if leases[a.candidate] == "" && !in.AutoAck {
			leases[a.candidate] = queue.NewID()
		}
		// The budget decide planned with (credit that came back since
		// is for the next cycle: deliver judges "took all it could" by it).
		as = append(as, queue.Assignment{Intention: a.candidate, PartitionID: a.avail.PartitionID, Group: a.avail.Group,
			Limit: min(in.Batch, in.free()), Total: min(cands[a.candidate].budget, in.take()), AutoAck: in.AutoAck,
			LeaseID: leases[a.candidate], Subject: in.Subject, Stream: in.Standing})
	}
	planned := plansOf(as)
	unhold := w.hold(planned, func(i int) *Intention { return chunk[i] })
	pre := w.beforePop(as, func(i int) *Intention { return chunk[i] })
	w.mu.Unlock()
	got, err := w.popDeliver(ctx, func() (map[int]*queue.PopResult, error) { return w.p.store.PopAssigned(ctx, as) },
		func(got map[int]*queue.PopResult) { unhold(got); w.afterPop(pre, got) }, func(i int) *Intention { return chunk[i] }, leases, planned, func(int) bool { return false }, "coalesced pop failed")
	if err != nil {
		return time.Time{}, nil, true
	}
	w.caughtUp(chunk, got)
	// An assignment that came back empty found its row taken, or held by a
	// transaction (an ack under way: pops skip locked rows). What holds it
	// may change nothing and wake nobody (an ack refused), so look again
	// soon rather than at the sweep.
	return w.retryEmpty(chunk, planned, got), got, false
}

// beforePop is a test's hook (export_test.go); nil in a running server.
var beforePop atomic.Pointer[func()]

// popDeliver is the tail every serving route shares (serve, fastServe,
// claimServe): run pop (one statement for every intention it leases to),
// give back the credit held for it (unhold), forget the leases it made
// when its outcome is unknown, and deliver each intention's result. owner
// names intention i, leases[i] its lease id, all(i) whether it claimed
// every partition it was offered. The results are nil when pop failed.
func (w *worker) popDeliver(ctx context.Context, pop func() (map[int]*queue.PopResult, error), unhold func(map[int]*queue.PopResult),
	owner func(i int) *Intention, leases []string, planned map[int]plan, all func(i int) bool, what string,
) (map[int]*queue.PopResult, error) {
	if f := beforePop.Load(); f != nil {
		(*f)()
	}
	got, err := pop()
	unhold(got) // nil when it failed: nothing charged
	defer w.doneServing(planned, owner)
	if err != nil {
		for i, lease := range leases {
			w.p.forgetOnUnknown(err, owner(i).key, lease)
		}
		w.p.logFailure(ctx, err, what)
		return nil, err
	}
	for i, res := range got {
		if res != nil {
			w.deliver(ctx, owner(i), res, all(i), planned[i])
		}
	}
	return got, nil
}

// doneServing ends the pops hold marked on the one-shot intentions of
// planned, once their results are delivered, and wakes a cancel waiting
// for them.
func (w *worker) doneServing(planned map[int]plan, owner func(i int) *Intention) {
	look := false
	w.mu.Lock()
	for i := range planned {
		in := owner(i)
		if in.counted() {
			in.serving--
		}
		if in.Standing && in.AutoAck {
			look = w.lookIfMissed(in) || look
		}
	}
	w.mu.Unlock()
	w.served.Broadcast()
	if look {
		w.signal()
	}
}

// popDeadOnExpiry serves, rarely, an expired lease whose attempt
// dead-letters: through Pop, for the oldest intention of its target that
// got nothing. It reports whether it tried any.
func (w *worker) popDeadOnExpiry(ctx context.Context, chunk []*Intention, assigns []assignment, dead []queue.Availability, cands []candidate) (worked bool) {
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
			w.popOne(ctx, in, a)
			break
		}
	}
	return worked
}

// popOne pops a's partition for in (the dead-lettering path).
func (w *worker) popOne(ctx context.Context, in *Intention, a queue.Availability) {
	defer w.p.leasing.begin()() // before its lease id, until delivered
	w.mu.Lock()
	if in.inOrder() {
		in.missed = true // looked at once what is under way is delivered
	}
	if in.gone || in.inOrder() {
		w.mu.Unlock()
		return
	}
	batch := min(in.Batch, in.credit)
	planned := map[int]plan{0: {total: batch, partitions: 1}}
	if in.counted() {
		in.serving++
	}
	w.mu.Unlock()
	defer w.doneServing(planned, func(int) *Intention { return in })
	leaseID := queue.NewID()
	res, err := w.p.store.Pop(ctx, queue.PopRequest{Queue: a.Queue, Partition: a.Partition, Group: a.Group,
		Batch: batch, AutoAck: in.AutoAck, Subject: in.Subject, LeaseID: leaseID, Stream: in.Standing})
	if err != nil {
		if !in.AutoAck {
			w.p.forgetOnUnknown(err, in.key, leaseID)
		}
		w.p.log.Error().Err(err).Msg("pop after lease expiry failed")
		return
	}
	if len(res.Messages) == 0 {
		if res.Expired != nil || res.Dropped != nil || res.DeadLettered != nil {
			// It finished messages and delivered none: a pop skips only so
			// many (queue.maxFetchRounds), and more may wait behind them.
			// Look again now, not at the next sweep; each such pop moves
			// the cursor on, so this ends.
			w.mu.Lock()
			if ks := w.keys[in.key]; ks != nil {
				ks.touch()
			}
			w.mu.Unlock()
			w.signal()
		}
		return
	}
	res.More = true // Pop does not tell
	w.mu.Lock()
	in.charge(res)
	w.mu.Unlock()
	w.deliver(ctx, in, res, false, plan{total: batch, partitions: 1})
}

// retryChunk marks the keys of a chunk whose pre-flight or pop failed for
// the cycle SweepMin from now, which it returns: without the mark that
// cycle would find nothing dirty, and the chunk would wait for the sweep.
func (w *worker) retryChunk(chunk []*Intention) time.Time {
	at := time.Now().Add(w.p.cfg.SweepMin)
	w.mu.Lock()
	for _, in := range chunk {
		if ks := w.keys[in.key]; ks != nil && (ks.dueAt.IsZero() || at.Before(ks.dueAt)) {
			ks.dueAt = at
		}
	}
	w.mu.Unlock()
	return at
}

// emptyRetry is how soon a queue whose assignment came back empty is
// looked at again: a held row is usually let go within milliseconds (an
// ack's transaction), and a row taken by another consumer costs one more
// pre-flight.
const emptyRetry = 100 * time.Millisecond

// retryEmpty sets the keys of the planned intentions that got nothing to be
// looked at again emptyRetry from now, and returns that time (zero if all
// got something).
func (w *worker) retryEmpty(chunk []*Intention, planned map[int]plan, got map[int]*queue.PopResult) time.Time {
	var keys []string
	for id := range planned {
		if res := got[id]; res == nil || len(res.Messages) == 0 {
			keys = append(keys, chunk[id].key)
		}
	}
	if len(keys) == 0 {
		return time.Time{}
	}
	at := time.Now().Add(emptyRetry)
	w.mu.Lock()
	for _, k := range keys {
		if ks := w.keys[k]; ks != nil && (ks.dueAt.IsZero() || at.Before(ks.dueAt)) {
			ks.dueAt = at
		}
	}
	w.mu.Unlock()
	return at
}

// charge takes what res gives a standing intention out of its credit; a
// one-shot intention res gives messages is answered: it takes no more.
// Called with the worker's mutex.
func (in *Intention) charge(res *queue.PopResult) {
	switch {
	case res == nil:
	case in.Standing:
		in.credit -= len(res.Messages)
	case len(res.Messages) > 0:
		in.answered = true
	}
}

// hold reserves, while a pop runs, the credit each intention of planned
// may take (its total; all of a one-shot's), so that a push's hand-off
// (Reserve) does not lease to it meanwhile beyond what it may take: a
// long-poll answered by both would give one of the two leases back. Called
// with mu held; the func it returns takes mu itself.
func (w *worker) hold(planned map[int]plan, of func(int) *Intention) (unhold func(got map[int]*queue.PopResult)) {
	held := make(map[int]int, len(planned))
	for i, pl := range planned {
		in := of(i)
		n := pl.total
		if !in.Standing {
			n = in.free()
		}
		if in.counted() {
			in.serving++ // until delivered (doneServing)
		}
		held[i] = n
		in.reserved += n
	}
	return func(got map[int]*queue.PopResult) {
		look := false
		w.mu.Lock()
		for i, n := range held {
			in := of(i)
			in.reserved -= n
			// What it was given is charged in the same step as the hold
			// ends: a push's hand-off in between must not see that credit
			// free (it would lease past maxInFlight).
			in.charge(got[i])
			look = w.lookIfMissed(in) || look
		}
		w.mu.Unlock()
		if look {
			w.signal()
		}
	}
}

// lookIfMissed marks in's queue for a cycle if one passed in over while it
// could take nothing (credit held, or none) and it may take again now; the
// caller signals the worker when it returns true. Called with mu held.
func (w *worker) lookIfMissed(in *Intention) bool {
	if !in.missed || in.gone || !in.ready() {
		return false
	}
	ks := w.keys[in.key]
	if ks == nil {
		return false
	}
	ks.touch()
	in.missed = false
	return true
}

// caughtUp clears limited on the intentions of a cycle that got nothing:
// the pre-flight found nothing for them, so they are caught up (and a push
// may hand off to them again).
func (w *worker) caughtUp(chunk []*Intention, got map[int]*queue.PopResult) {
	w.mu.Lock()
	for i, in := range chunk {
		if got[i] == nil {
			in.limited = false
		}
	}
	w.mu.Unlock()
}

// markDirty flags the keys of the intentions whose targets needed consumer
// rows, and signals the worker to run again.
func (w *worker) markDirty(chunk []*Intention, targets map[int]bool, cands []candidate) {
	w.mu.Lock()
	for i, in := range chunk {
		if targets[cands[i].target] {
			if ks := w.keys[in.key]; ks != nil {
				ks.touch()
			}
		}
	}
	w.mu.Unlock()
	w.signal()
}

// groupName is a target's group as the database names it.
func groupName(g string) string {
	if g == "" {
		return queue.DefaultGroup
	}
	return g
}
