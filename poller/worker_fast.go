package poller

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/heraldmq/herald/queue"
)

// The fast path: a queue whose only news is a push to known partitions is
// served without a pre-flight (worker.cycle hands such queues here).

// hinted is a queue whose only news is a push to known partitions.
type hinted struct {
	key        string
	hints      map[string]bool
	handed     map[string]bool // as keyState.handed
	rehinted   map[string]bool // as keyState.rehinted
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

	defer w.p.leasing.begin()() // before the lease ids, until delivered
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
	w.keepKnown(items, fitems, pl)
	fl := leasesOf(items, pl)
	planned := plansOf(fl.as)
	unhold := w.hold(planned, func(i int) *Intention { return fl.owners[i] })
	pre := w.beforePop(fl.as, func(i int) *Intention { return fl.owners[i] })
	w.mu.Unlock()

	w.p.metrics.skipped.WithLabelValues("lease_hint").Add(float64(pl.hintSkips))
	fallback := pl.fallback
	if len(fl.as) > 0 {
		worked = true
		got, err := w.popDeliver(ctx, func() (map[int]*queue.PopResult, error) { return w.p.store.PopAssigned(ctx, fl.as) },
			func(got map[int]*queue.PopResult) { unhold(got); w.afterPop(pre, got) },
			func(i int) *Intention { return fl.owners[i] }, fl.leases, planned,
			func(i int) bool { return !fl.partial[i] }, "coalesced pop failed")
		for _, a := range fl.audits {
			if err == nil {
				// The hint was right if the database had nothing to lease.
				w.p.cfg.Hints.HintAudited(!tookFrom(got[a.owner], a.partitionID))
			}
		}
		for i, in := range fl.owners {
			if got[i] == nil {
				fallback = append(fallback, in.key)
			}
		}
	}
	w.touchKeys(fallback)
	return worked, due
}

// keepKnown keeps what the keys of a fast-path cycle know true
// (keyState.known) once their hints are taken: a target one of whose
// hinted partitions goes to none of its group's intentions (not ready,
// held, an unknown id, past what they may claim) is forgotten, since that
// hint is not kept. A one-shot intention assigned nothing on a target
// still known is caught up: a push may hand off to it (Intention.limited).
// Called with the worker's mutex.
func (w *worker) keepKnown(items []hinted, fitems []fastItem, pl fastPlan) {
	type pair struct {
		item               int
		partitionID, group string
	}
	taken := map[pair]bool{}
	served := map[[2]int]bool{}
	for _, a := range pl.assigns {
		taken[pair{a.item, a.partitionID, items[a.item].intentions[a.cand].Target.Group}] = true
		served[[2]int{a.item, a.cand}] = true
	}
	for ii, h := range items {
		ks := w.keys[h.key]
		if ks == nil || len(ks.known) == 0 {
			continue
		}
		for t := range ks.known {
			for _, part := range fitems[ii].parts {
				if t[0] != "" && t[0] != part.name {
					continue
				}
				if part.id == "" || (!taken[pair{ii, part.id, t[1]}] && !h.handed[part.id+"\x00"+t[1]]) {
					delete(ks.known, t)
					break
				}
			}
		}
		for ci, in := range h.intentions {
			if !in.Standing && !in.gone && !served[[2]int{ii, ci}] && in.ready() && ks.known[[2]string{in.Target.Partition, in.Target.Group}] {
				in.limited = false
			}
		}
	}
}

// fastLeases is decideFast's plan as pop assignments: the hinted
// partitions an intention claims go under one lease, its owner index's.
type fastLeases struct {
	as      []queue.Assignment
	owners  []*Intention
	leases  []string     // per owner; "" for autoAck
	partial map[int]bool // owners that could not claim every hinted partition
	audits  []fastAudit
}

// fastAudit is a lease hint audited by a pop: the owner's result says
// whether the database had anything to lease.
type fastAudit struct {
	owner       int
	partitionID string
}

// leasesOf turns pl into assignments. Called with the worker's mutex.
func leasesOf(items []hinted, pl fastPlan) fastLeases {
	fl := fastLeases{partial: map[int]bool{}}
	owner := map[[2]int]int{}
	for _, a := range pl.assigns {
		k := [2]int{a.item, a.cand}
		in := items[a.item].intentions[a.cand]
		idx, ok := owner[k]
		if !ok {
			idx = len(fl.owners)
			owner[k] = idx
			fl.owners = append(fl.owners, in)
			lease := ""
			if !in.AutoAck {
				lease = queue.NewID()
			}
			fl.leases = append(fl.leases, lease)
			fl.partial[idx] = pl.partial[k]
		}
		if a.audit {
			fl.audits = append(fl.audits, fastAudit{idx, a.partitionID})
		}
		fl.as = append(fl.as, queue.Assignment{Intention: idx, PartitionID: a.partitionID, Group: in.Target.Group,
			Limit: a.limit, Total: a.total, AutoAck: in.AutoAck, LeaseID: fl.leases[idx], Subject: in.Subject,
			Stream: in.Standing})
	}
	return fl
}

// touchKeys hands keys to the next cycle's pre-flight.
func (w *worker) touchKeys(keys []string) {
	if len(keys) == 0 {
		return
	}
	w.mu.Lock()
	for _, k := range keys {
		if ks := w.keys[k]; ks != nil {
			ks.touch()
		}
	}
	w.mu.Unlock()
	w.signal()
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
	for part, onlyPushes := range h.hints {
		pid, _ := w.p.store.CachedPartitionID(queueName, part)
		it.parts = append(it.parts, fastPart{name: part, id: pid})
		if pid == "" {
			continue
		}
		if h.rehinted[part] {
			for _, g := range groups {
				delete(h.handed, pid+"\x00"+g) // stale: woken again since
			}
		}
		for _, g := range groups {
			k := hintKey{pid, groupName(g)}
			if _, asked := hints[k]; asked || h.handed[pid+"\x00"+g] {
				continue
			}
			// Held by a lease of this instance, and news of this
			// instance's pushes only (an ack or a release here forgets the
			// lease first; news from elsewhere may be a release unheard of).
			if onlyPushes {
				if until, held := w.p.heldHere(k); held {
					hints[k] = leaseHint{until: until}
					continue
				}
			}
			if w.p.cfg.Hints != nil {
				until, audit := w.p.cfg.Hints.LeasedElsewhere(k.partitionID, k.group)
				hints[k] = leaseHint{until: until, audit: audit}
			}
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
