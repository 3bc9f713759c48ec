package poller

import (
	"sort"

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
//   - candidates that name a partition go first, then the rest; within
//     each kind the oldest first;
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
	order := make([]candidate, len(cands))
	copy(order, cands)
	sort.SliceStable(order, func(i, j int) bool {
		if order[i].specific != order[j].specific {
			return order[i].specific
		}
		return order[i].seq < order[j].seq
	})
	type pairKey struct{ partitionID, group string }
	used := map[pairKey]bool{}
	skipped = map[int]string{}
	for _, c := range order {
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
