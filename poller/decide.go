package poller

import (
	"sort"
	"time"

	"github.com/heraldmq/herald/queue"
)

// Reasons an intention is skipped in a cycle (herald_intentions_skipped_total).
const (
	skipNoPartition          = "no_partition"          // nothing eligible for its target
	skipPartitionUnavailable = "partition_unavailable" // its named partition is busy, blocked or empty
	skipTaken                = "taken"                 // eligible partitions exist, but others got them first
)

// candidate is an intention as the decision engine sees it.
type candidate struct {
	id         int    // caller's index
	target     int    // index into the pre-flight targets
	specific   bool   // names a partition
	seq        uint64 // registration order: smaller is older
	partitions int    // how many partitions it may claim (≥ 1)
	// budget is how many messages it may take in this cycle (0: no
	// bound) and batch how many it takes from one partition: a wildcard
	// candidate stops claiming partitions once their waiting messages
	// cover its budget, so it claims many partitions only when each holds
	// little.
	budget, batch int
}

// assignment is one partition given to one candidate.
type assignment struct {
	candidate int // candidate id
	avail     queue.Availability
}

// decide assigns eligible partitions to candidates, lease-safely:
//
//   - a (partition, group) goes to at most one candidate;
//   - in the one order of every decision (preferred): candidates that
//     name a partition first, then the rest, each oldest first;
//   - a wildcard candidate gets the eligible partitions of the queues of
//     highest priority first (a namespace or task target selects several),
//     the fullest (most waiting) first within a priority, up to its
//     partition count, and no more once what they hold
//     (a batch at most from each) covers its budget;
//   - a candidate with nothing viable is skipped, with a reason, and costs
//     no query.
//
// Only partitions that are eligible, have a consumer row and need no
// dead-lettering are considered; the caller handles the others. decide is
// pure: the same input gives the same output.
func decide(cands []candidate, avail []queue.Availability) (out []assignment, skipped map[int]string) {
	byTarget := map[int][]queue.Availability{}
	for _, a := range avail {
		if a.Eligible && a.HasConsumer && !a.DeadOnExpiry {
			byTarget[a.Target] = append(byTarget[a.Target], a)
		}
	}
	for t := range byTarget {
		ps := byTarget[t]
		sort.SliceStable(ps, func(i, j int) bool {
			if ps[i].Priority != ps[j].Priority {
				return ps[i].Priority > ps[j].Priority // a namespace's urgent queues first
			}
			if ps[i].Waiting != ps[j].Waiting {
				return ps[i].Waiting > ps[j].Waiting
			}
			return ps[i].PartitionID < ps[j].PartitionID
		})
	}
	type pairKey struct{ partitionID, group string }
	used := map[pairKey]bool{}
	skipped = map[int]string{}
	for _, ci := range preferred(len(cands), func(i int) bool { return cands[i].specific },
		func(i, j int) bool { return cands[i].seq < cands[j].seq }) {
		c := cands[ci]
		want := max(c.partitions, 1)
		if c.specific {
			want = 1
		}
		got, covered := 0, 0
		for _, a := range byTarget[c.target] {
			k := pairKey{a.PartitionID, a.Group}
			if used[k] {
				continue
			}
			used[k] = true
			out = append(out, assignment{candidate: c.id, avail: a})
			got++
			covered += int(min(a.Waiting, int64(max(c.batch, 1))))
			if got == want || (c.budget > 0 && covered >= c.budget) {
				break
			}
		}
		if got == 0 {
			switch {
			case c.specific:
				skipped[c.id] = skipPartitionUnavailable
			case len(byTarget[c.target]) > 0:
				skipped[c.id] = skipTaken
			default:
				skipped[c.id] = skipNoPartition
			}
		}
	}
	return out, skipped
}

// doubleAssigned counts (partition, group) pairs that appear more than once
// in assignments: the invariant decide keeps. It must always be 0.
func doubleAssigned(as []assignment) int {
	type pairKey struct{ partitionID, group string }
	seen := map[pairKey]bool{}
	n := 0
	for _, a := range as {
		k := pairKey{a.avail.PartitionID, a.avail.Group}
		if seen[k] {
			n++
		}
		seen[k] = true
	}
	return n
}

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
	named := func(i int) bool { _, p, _ := cand(i); return p != "" }
	for _, i := range preferred(n, named, func(i, j int) bool { return i < j }) {
		group, p, gone := cand(i)
		if gone || done[group] || (p != "" && p != partition) {
			continue
		}
		if take(i) {
			done[group] = true
		}
	}
}

// preferred is the one order in which every decision offers work to n
// candidates: those naming a partition first, then the others, each
// oldest first (older reports whether i registered before j). decide,
// decideFast and a push's hand-off all go by it.
func preferred(n int, names func(i int) bool, older func(i, j int) bool) []int {
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool {
		i, j := order[a], order[b]
		if names(i) != names(j) {
			return names(i)
		}
		return older(i, j)
	})
	return order
}
