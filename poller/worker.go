package poller

import (
	"context"
	"slices"
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
	intentions []*Intention    // registration order
	dirty      bool            // run a pre-flight for it at the next cycle
	hints      map[string]bool // partitions a push says got messages (fast path)
	handed     map[string]bool // partition id + "\x00" + group a push leased to an intention here
	dueAt      time.Time       // a blocked partition becomes eligible then
	remoteAt   time.Time       // the last wake-up from another instance
	// claim: the key's only intention took all it could at its last
	// delivery, so its queue has a backlog: the next cycle claims straight
	// from the queue's ready rows (claimServe), with no pre-flight, until a
	// claim comes back short or a sweep runs.
	claim bool
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
	if w.p.paused.Load() {
		return false, time.Time{} // SetPaused(false) marks every key
	}
	now := time.Now()
	var work, claims, expired []*Intention
	var fast []hinted
	w.mu.Lock()
	for k, ks := range w.keys {
		live := ks.intentions[:0]
		for _, in := range ks.intentions {
			if !in.gone && !in.Deadline.IsZero() && now.After(in.Deadline) && w.markGone(in) {
				expired = append(expired, in)
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
		if !ks.dirty && len(ks.hints) > 0 {
			fast = append(fast, hinted{key: k, hints: ks.hints, handed: ks.handed, intentions: slices.Clone(live)})
			ks.hints, ks.handed = nil, nil
			continue
		}
		if !ks.dirty {
			if !ks.dueAt.IsZero() && (due.IsZero() || ks.dueAt.Before(due)) {
				due = ks.dueAt
			}
			continue
		}
		ks.dirty, ks.hints, ks.handed = false, nil, nil
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
	w.mu.Unlock()
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
	c := queue.Claim{Queue: in.Target.Queue, Group: in.Target.Group, Partitions: max(in.Partitions, 1),
		Limit: min(in.Batch, in.free()), Total: in.take(), AutoAck: in.AutoAck, Subject: in.Subject}
	if !in.AutoAck {
		c.LeaseID = queue.NewID()
	}
	// Claimed partitions all hold work: fewer than asked is no sign that
	// one came back empty (deliver's partitions check), so none is planned.
	pl := plan{total: c.Total}
	unhold := w.hold(map[int]plan{0: pl}, func(int) *Intention { return in })
	w.mu.Unlock()
	got, err := p.store.PopClaim(ctx, c)
	unhold()
	if err != nil {
		p.log.Error().Err(err).Msg("claiming pop failed")
	}
	res := got[0]
	if res != nil {
		w.deliver(ctx, in, res, false, pl)
	}
	if err == nil && res != nil && (len(res.Messages) >= c.Total || res.PartitionsClaimed >= c.Partitions) {
		return true
	}
	// Short: the pre-flight looks at the queue next.
	w.mu.Lock()
	if ks := w.keys[in.key]; ks != nil {
		ks.claim, ks.dirty = false, true
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

	// One target per distinct (key, partition, group).
	type tkey struct{ key, partition, group string }
	targetIdx := map[tkey]int{}
	var targets []queue.Target
	var targetKeys []string
	cands := make([]candidate, len(chunk))
	w.mu.Lock() // credit, which take reads, changes under it
	for i, in := range chunk {
		tk := tkey{in.key, in.Target.Partition, in.Target.Group}
		ti, ok := targetIdx[tk]
		if !ok {
			ti = len(targets)
			targetIdx[tk] = ti
			targets = append(targets, in.Target)
			targetKeys = append(targetKeys, in.key)
		}
		cands[i] = candidate{id: i, target: ti, specific: in.Target.Partition != "", seq: in.seq, partitions: in.Partitions,
			budget: in.take(), batch: in.Batch}
		// The pre-flight reports as many partitions per target as its
		// intentions could take together.
		if cands[i].specific {
			targets[ti].Want++
		} else {
			targets[ti].Want += max(in.Partitions, 1)
		}
	}
	w.mu.Unlock()

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
		if a.PartitionID != "" {
			p.store.NotePartitionID(a.Queue, a.Partition, a.PartitionID) // for the fast path
		}
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
	w.mu.Lock() // credit changes under it (AddCredit)
	for _, a := range assigns {
		in := chunk[a.candidate]
		if leases[a.candidate] == "" && !in.AutoAck {
			leases[a.candidate] = queue.NewID()
		}
		// The budget decide planned with (credit that came back since
		// is for the next cycle: deliver judges "took all it could" by it).
		as = append(as, queue.Assignment{Intention: a.candidate, PartitionID: a.avail.PartitionID, Group: a.avail.Group,
			Limit: min(in.Batch, in.free()), Total: min(cands[a.candidate].budget, in.take()), AutoAck: in.AutoAck,
			LeaseID: leases[a.candidate], Subject: in.Subject})
	}
	planned := plansOf(as)
	unhold := w.hold(planned, func(i int) *Intention { return chunk[i] })
	w.mu.Unlock()
	if len(as) > 0 {
		worked = true
		got, err := p.store.PopAssigned(ctx, as)
		unhold()
		if err != nil {
			p.log.Error().Err(err).Msg("coalesced pop failed")
			return worked, time.Now().Add(p.cfg.SweepMin)
		}
		for id, res := range got {
			w.deliver(ctx, chunk[id], res, false, planned[id])
		}
		w.caughtUp(chunk, got)
	} else {
		w.caughtUp(chunk, nil)
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
			w.mu.Lock()
			batch := min(in.Batch, in.credit)
			w.mu.Unlock()
			res, err := p.store.Pop(ctx, queue.PopRequest{Queue: a.Queue, Partition: a.Partition, Group: a.Group,
				Batch: batch, AutoAck: in.AutoAck, Subject: in.Subject})
			if err != nil {
				p.log.Error().Err(err).Msg("pop after lease expiry failed")
			} else if len(res.Messages) > 0 {
				res.More = true // Pop does not tell
				w.deliver(ctx, in, res, false, plan{total: batch, partitions: 1})
			}
			break
		}
	}
	return worked, due
}

// hold reserves, while a pop runs, the credit each intention of planned
// may take (its total; all of a one-shot's), so that a push's hand-off
// (Reserve) does not lease to it meanwhile beyond what it may take: a
// long-poll answered by both would give one of the two leases back. Called
// with mu held; the func it returns takes mu itself.
func (w *worker) hold(planned map[int]plan, of func(int) *Intention) (unhold func()) {
	held := make(map[*Intention]int, len(planned))
	for i, pl := range planned {
		in := of(i)
		n := pl.total
		if !in.Standing {
			n = in.free()
		}
		held[in] = n
		in.reserved += n
	}
	return func() {
		look := false
		w.mu.Lock()
		for in, n := range held {
			in.reserved -= n
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
	ks.dirty, in.missed = true, false
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
				ks.dirty = true
			}
		}
	}
	w.mu.Unlock()
	w.signal()
}

// plan is what a pop was asked to take for one intention.
type plan struct {
	total      int // the most messages (Assignment.Total): taking that many means there may be more
	partitions int // the partitions assigned: one that came back empty may hold more
}

// plansOf sums up as per intention.
func plansOf(as []queue.Assignment) map[int]plan {
	out := map[int]plan{}
	for _, a := range as {
		pl := out[a.Intention]
		pl.total = a.Total
		pl.partitions++
		out[a.Intention] = pl
	}
	return out
}

// deliver hands res to its intention, or releases the lease at once if the
// consumer is gone. pl is what the pop was asked to take for it.
// allClaimed says that every partition known to have work for the
// intention was assigned to it this cycle (a fast-path cycle that skipped
// none of its hints); otherwise claiming as many partitions as it may
// means others may wait.
func (w *worker) deliver(ctx context.Context, in *Intention, res *queue.PopResult, allClaimed bool, pl plan) {
	if res.PartitionsClaimed < pl.partitions {
		res.More = true // an assignment came back empty: taken or changed since the pre-flight
	}
	// Paused since the cycle began (pop maintenance): give the lease back,
	// as for a consumer that left, and deliver nothing. An autoAck pop
	// keeps no lease (its cursor moved already): delivered all the same.
	paused := w.p.paused.Load() && res.LeaseID != ""
	w.mu.Lock()
	gone := in.gone || paused
	ended := false
	if !gone && !in.Standing {
		// A one-shot intention ends with this delivery, whatever Deliver
		// answers: withdraw it first, so it is never counted (or served) as
		// still waiting once its consumer holds the messages.
		ended = w.markGone(in)
	}
	w.mu.Unlock()
	if ended {
		w.p.withdrawn(in)
	}
	// A standing intention may have leased several batches: its consumer
	// gets them a batch at a time.
	parts := []*queue.PopResult{res}
	if in.Standing {
		parts = splitBatches(res, in.Batch)
	}
	for i, part := range parts {
		if gone || !in.Deliver(part) {
			for _, rest := range parts[i:] {
				w.p.Release(ctx, rest.LeaseID, rest.Messages)
			}
			return
		}
	}
	w.p.metrics.delivered.Inc()
	w.p.LeasesTaken(res)
	if !in.Standing {
		return
	}
	w.mu.Lock()
	in.credit -= len(res.Messages)
	// All it could take, a partition it left messages in, or as many
	// partitions as it may take (when others may have work) means there may
	// be more: look again now. Otherwise it drained what it took, and every
	// other change marks its queue by itself (a push, an ack, a timer), so a
	// cycle with a pre-flight would find nothing.
	full := len(res.Messages) >= pl.total || res.More || (!allClaimed && res.PartitionsClaimed >= max(in.Partitions, 1))
	// Credit coming back to an intention whose last take was cut short
	// by its credit (or batch) may find more: AddCredit looks then.
	in.limited = full
	more := false
	ks := w.keys[in.key]
	if ks != nil {
		ks.claim = full && claimable(in)
	}
	if ks != nil && full && in.ready() && !in.gone {
		ks.dirty, more = true, true
	}
	w.mu.Unlock()
	if more {
		w.signal()
	}
}

// splitBatches cuts res into results of at most batch messages, in order,
// each counting the partitions it holds.
func splitBatches(res *queue.PopResult, batch int) []*queue.PopResult {
	if len(res.Messages) <= batch {
		return []*queue.PopResult{res}
	}
	var out []*queue.PopResult
	for msgs := res.Messages; len(msgs) > 0; {
		n := min(batch, len(msgs))
		part := *res
		part.Messages, msgs = msgs[:n:n], msgs[n:]
		part.Queue, part.Partition, part.PartitionID = part.Messages[0].Queue, part.Messages[0].Partition, part.Messages[0].PartitionID
		part.PartitionsClaimed = 1
		for i := 1; i < n; i++ {
			if part.Messages[i].PartitionID != part.Messages[i-1].PartitionID {
				part.PartitionsClaimed++
			}
		}
		if len(out) > 0 {
			part.DeadLettered = nil // counted once, with the first
		}
		out = append(out, &part)
	}
	return out
}

// groupName is a target's group as the database names it.
func groupName(g string) string {
	if g == "" {
		return queue.DefaultGroup
	}
	return g
}

// tookFrom reports whether res holds messages of a partition.
func tookFrom(res *queue.PopResult, partitionID string) bool {
	if res == nil {
		return false
	}
	for _, m := range res.Messages {
		if m.PartitionID == partitionID {
			return true
		}
	}
	return false
}

// eachByPreference offers a partition to intentions in the order a
// fast-path cycle and a push's hand-off give it: those naming it first, then
// the others, oldest first; gone ones and those naming another partition are
// skipped. take returns true once the intention's group is settled for the
// partition (served, or known not to need it); the group's later
// intentions are then skipped. Called with the worker's mutex.
func eachByPreference(ins []*Intention, partition string, take func(*Intention) bool) {
	done := map[string]bool{}
	for _, specific := range []bool{true, false} {
		for _, in := range ins {
			if in.gone || done[in.Target.Group] || specific != (in.Target.Partition != "") ||
				(specific && in.Target.Partition != partition) {
				continue
			}
			if take(in) {
				done[in.Target.Group] = true
			}
		}
	}
}

// hinted is a queue whose only news is a push to known partitions.
type hinted struct {
	key        string
	hints      map[string]bool
	handed     map[string]bool // as keyState.handed
	intentions []*Intention
}

// fastServe serves push hints without a pre-flight: the pushed partition is
// assigned straight away, per consumer group, to the oldest intention that
// wants it (one naming it first; decideFast), and ONE coalesced pop leases
// them all; it re-checks everything under its row locks. Whatever this
// cannot settle (an unknown partition id, an assignment that came back
// empty: no consumer row yet, a delay, a lease) falls back to a full cycle
// with a pre-flight.
//
// A partition that a lease hint says another live instance holds is not
// popped at all: its key is looked at again when the hint lapses (due), or
// sooner when the holder's release wakes it.
//
// In four steps, the mutex held only for the third: read the partition ids
// (the store's cache) and the lease hints; snapshot the intentions, decide
// and hold their credit; pop; deliver.
func (w *worker) fastServe(ctx context.Context, items []hinted, due time.Time) (worked bool, _ time.Time) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	fitems := make([]fastItem, len(items))
	hints := map[hintKey]leaseHint{}
	for i, h := range items {
		fitems[i] = w.hintedItem(h, hints)
	}

	type audit struct {
		owner       int
		partitionID string
	}
	var as []queue.Assignment
	var owners []*Intention
	var audits []audit
	partial := map[int]bool{} // owners that could not claim every hinted partition
	w.mu.Lock()
	for i, h := range items {
		fitems[i].cands = fastCands(h.intentions)
	}
	pl := decideFast(fitems, hints)
	for _, m := range pl.missed {
		items[m[0]].intentions[m[1]].missed = true
	}
	for k, until := range pl.hintedUntil {
		if ks := w.keys[k]; ks != nil && (ks.dueAt.IsZero() || until.Before(ks.dueAt)) {
			ks.dueAt = until
		}
		if due.IsZero() || until.Before(due) {
			due = until
		}
	}
	owner := map[[2]int]int{}
	var leases []string
	for _, a := range pl.assigns {
		k := [2]int{a.item, a.cand}
		in := items[a.item].intentions[a.cand]
		idx, ok := owner[k]
		if !ok {
			idx = len(owners)
			owner[k] = idx
			owners = append(owners, in)
			lease := ""
			if !in.AutoAck {
				lease = queue.NewID() // the hinted partitions it claims, under one lease
			}
			leases = append(leases, lease)
			partial[idx] = pl.partial[k]
		}
		if a.audit {
			audits = append(audits, audit{idx, a.partitionID})
		}
		as = append(as, queue.Assignment{Intention: idx, PartitionID: a.partitionID, Group: in.Target.Group,
			Limit: a.limit, Total: a.total, AutoAck: in.AutoAck, LeaseID: leases[idx], Subject: in.Subject})
	}
	planned := plansOf(as)
	unhold := w.hold(planned, func(i int) *Intention { return owners[i] })
	w.mu.Unlock()

	w.p.metrics.skipped.WithLabelValues("lease_hint").Add(float64(pl.hintSkips))
	fallback := pl.fallback
	if len(as) > 0 {
		worked = true
		got, err := w.p.store.PopAssigned(ctx, as)
		unhold()
		if err != nil {
			w.p.log.Error().Err(err).Msg("coalesced pop failed")
		}
		for _, a := range audits {
			if err == nil {
				// The hint was right if the database had nothing to lease.
				w.p.cfg.Hints.HintAudited(!tookFrom(got[a.owner], a.partitionID))
			}
		}
		for i, in := range owners {
			if res := got[i]; res != nil {
				w.deliver(ctx, in, res, !partial[i], planned[i])
			} else {
				fallback = append(fallback, in.key)
			}
		}
	}
	if len(fallback) > 0 {
		w.mu.Lock()
		for _, k := range fallback {
			if ks := w.keys[k]; ks != nil {
				ks.dirty = true
			}
		}
		w.mu.Unlock()
		w.signal()
	}
	return worked, due
}

// hintedItem is h for decideFast, but for its intentions (fastCands, under
// the mutex): the ids of its hinted partitions from the store's cache, and
// into hints what Config.Hints says of each (partition, group) its
// intentions may be given. Called with no lock held: both are calls out of
// the poller. h's maps are the worker's alone once cycle took them.
func (w *worker) hintedItem(h hinted, hints map[hintKey]leaseHint) fastItem {
	queueName := strings.TrimPrefix(h.key, "q:")
	it := fastItem{key: h.key, handed: h.handed}
	var groups []string
	for _, in := range h.intentions {
		if !slices.Contains(groups, in.Target.Group) { // Target is read-only once registered
			groups = append(groups, in.Target.Group)
		}
	}
	for part := range h.hints {
		pid, _ := w.p.store.CachedPartitionID(queueName, part)
		it.parts = append(it.parts, fastPart{name: part, id: pid})
		if pid == "" || w.p.cfg.Hints == nil {
			continue
		}
		for _, g := range groups {
			k := hintKey{pid, groupName(g)}
			if _, asked := hints[k]; asked || h.handed[pid+"\x00"+g] {
				continue
			}
			until, audit := w.p.cfg.Hints.LeasedElsewhere(k.partitionID, k.group)
			hints[k] = leaseHint{until: until, audit: audit}
		}
	}
	return it
}

// fastCands snapshots intentions for decideFast. Called with mu held.
func fastCands(ins []*Intention) []fastCand {
	out := make([]fastCand, len(ins))
	for i, in := range ins {
		out[i] = fastCand{group: in.Target.Group, partition: in.Target.Partition, gone: in.gone, partitions: in.Partitions}
		if !in.gone {
			out[i].ready = in.ready()
			out[i].limit, out[i].total = min(in.Batch, in.free()), in.take()
		}
	}
	return out
}
