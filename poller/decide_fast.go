package poller

import (
	"sort"
	"time"
)

// The fast path's decision (worker.fastServe): a push names the partition
// that got messages, so no pre-flight is needed to know where the work is;
// decideFast gives each hinted partition, per consumer group, to the
// intention a pre-flight cycle would have picked. Like decide it is pure:
// the worker snapshots what it needs under its mutex, and the partition
// ids and lease hints are read before, with no lock held.

// fastItem is one hinted queue as decideFast sees it.
type fastItem struct {
	key string
	// parts are the hinted partitions; id "" means the partition id is not
	// known (the store's cache missed): the queue falls back to a
	// pre-flight.
	parts []fastPart
	// handed holds partition id + "\x00" + group for the pairs a push
	// leased already (keyState.handed).
	handed map[string]bool
	cands  []fastCand // the queue's intentions, in registration order
}

// fastPart is one hinted partition.
type fastPart struct{ name, id string }

// fastCand is an intention as decideFast sees it.
type fastCand struct {
	group     string
	partition string // the partition it names; "" for any
	gone      bool
	ready     bool // it may take messages now (Intention.ready)
	// partitions is how many hinted partitions it may claim (≥ 1): they
	// are merged into one delivery under one lease.
	partitions int
	// limit is what it may take from one partition (a batch, within its
	// free credit) and total what it may take in all (Intention.take).
	limit, total int
}

// leaseHint is what Config.Hints said of a (partition id, group).
type leaseHint struct {
	until time.Time // non-zero: another live instance holds it until then
	audit bool      // pop all the same, and report the database's answer
}

// hintKey names a (partition id, group) for the lease hints.
type hintKey struct{ partitionID, group string }

// fastAssign is one hinted partition given to one intention.
type fastAssign struct {
	item, cand   int // indexes into the items and their cands
	partitionID  string
	limit, total int  // queue.Assignment's Limit and Total
	audit        bool // the lease hint is being audited: report HintAudited
}

// fastPlan is decideFast's answer.
type fastPlan struct {
	assigns []fastAssign // items in order, each in partition name order
	// missed are intentions passed over because they could take nothing
	// (Intention.missed), as [item, cand], each once.
	missed [][2]int
	// partial: intentions ([item, cand]) that could not claim every hinted
	// partition their group was offered: claiming as many as they may
	// does not mean that nothing else waits.
	partial map[[2]int]bool
	// hintedUntil is, per key, when a partition skipped for a lease hint
	// is looked at again; hintSkips counts those skips.
	hintedUntil map[string]time.Time
	hintSkips   int
	fallback    []string // keys that need a pre-flight (an unknown partition id)
}

// decideFast assigns the hinted partitions, lease-safely:
//
//   - per hinted partition, at most one intention per consumer group gets
//     it: those naming the partition first, then the others, oldest first
//     (cands are in registration order);
//   - a group a push leased the partition to already is settled for it;
//   - an intention that may take nothing now is skipped and marked missed,
//     and the group's next intention is offered the partition;
//   - an intention claims at most its partitions of the hinted ones;
//   - a (partition, group) another live instance holds by a lease hint is
//     not popped: the key is looked at again when the hint lapses;
//   - a partition whose id is unknown sends its queue to a pre-flight.
//
// Partitions are taken in name order, so the same input gives the same
// output.
func decideFast(items []fastItem, hints map[hintKey]leaseHint) fastPlan {
	pl := fastPlan{partial: map[[2]int]bool{}, hintedUntil: map[string]time.Time{}}
	missed := map[[2]int]bool{}
	for ii, it := range items {
		parts := make([]fastPart, len(it.parts))
		copy(parts, it.parts)
		sort.Slice(parts, func(i, j int) bool { return parts[i].name < parts[j].name })
		claimed := map[int]int{}
		fellBack := false
		for _, part := range parts {
			if part.id == "" {
				if !fellBack {
					pl.fallback = append(pl.fallback, it.key)
					fellBack = true
				}
				continue
			}
			byPreference(len(it.cands), func(i int) (string, string, bool) {
				return it.cands[i].group, it.cands[i].partition, it.cands[i].gone
			}, part.name, func(ci int) bool {
				c := it.cands[ci]
				if it.handed[part.id+"\x00"+c.group] {
					return true // the push leased it to this group already
				}
				if !c.ready {
					if k := [2]int{ii, ci}; !missed[k] {
						missed[k] = true
						pl.missed = append(pl.missed, k)
					}
					return false
				}
				if claimed[ci] >= max(c.partitions, 1) {
					pl.partial[[2]int{ii, ci}] = true // a hinted partition it could not claim
					return false
				}
				h := hints[hintKey{part.id, groupName(c.group)}]
				if !h.until.IsZero() {
					pl.hintSkips++
					if u, ok := pl.hintedUntil[it.key]; !ok || h.until.Before(u) {
						pl.hintedUntil[it.key] = h.until
					}
					return true
				}
				claimed[ci]++
				pl.assigns = append(pl.assigns, fastAssign{item: ii, cand: ci, partitionID: part.id,
					limit: c.limit, total: c.total, audit: h.audit})
				return true
			})
		}
	}
	return pl
}

// byPreference offers a partition to n candidates (cand gives each one's
// group, the partition it names or "", and whether it is gone) in the one
// order both the hand-off and the fast path use: those naming the
// partition first, then the others, each oldest first (the order of the
// candidates); gone ones and those naming another partition are skipped.
// take returns true once the candidate's group is settled for the
// partition (served, or known not to need it); the group's later
// candidates are then skipped. Pure: it only calls cand and take.
func byPreference(n int, cand func(i int) (group, partition string, gone bool), partition string, take func(i int) bool) {
	done := map[string]bool{}
	for _, specific := range []bool{true, false} {
		for i := range n {
			group, named, gone := cand(i)
			if gone || done[group] || specific != (named != "") || (specific && named != partition) {
				continue
			}
			if take(i) {
				done[group] = true
			}
		}
	}
}
