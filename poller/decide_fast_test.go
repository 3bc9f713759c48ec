package poller

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/heraldmq/herald/queue"
)

// any1 is a ready wildcard intention of the default group that may take a
// batch of 10 from one partition.
func any1() fastCand {
	return fastCand{group: queue.DefaultGroup, ready: true, partitions: 1, limit: 10, total: 10}
}

func named(p string) fastCand { c := any1(); c.partition = p; return c }

func inGroup(c fastCand, g string) fastCand { c.group = g; return c }

func hintedParts(names ...string) []fastPart {
	var out []fastPart
	for _, n := range names {
		out = append(out, fastPart{name: n, id: "id-" + n})
	}
	return out
}

// fastAssigned renders assignments as "item.cand:partition id".
func fastAssigned(as []fastAssign) []string {
	var out []string
	for _, a := range as {
		out = append(out, fmt.Sprintf("%d.%d:%s", a.item, a.cand, a.partitionID))
	}
	return out
}

// fastDoubleAssigned counts (partition, group) pairs given twice: the
// invariant decideFast keeps, as decide does.
func fastDoubleAssigned(items []fastItem, as []fastAssign) int {
	seen := map[hintKey]bool{}
	n := 0
	for _, a := range as {
		k := hintKey{a.partitionID, items[a.item].cands[a.cand].group}
		if seen[k] {
			n++
		}
		seen[k] = true
	}
	return n
}

func TestDecideFast(t *testing.T) {
	soon := time.Date(2030, 1, 1, 0, 0, 1, 0, time.UTC)
	later := soon.Add(time.Second)
	for _, tc := range []struct {
		name    string
		items   []fastItem
		hints   map[hintKey]leaseHint
		want    []string
		missed  [][2]int
		partial map[[2]int]bool
		until   map[string]time.Time
		skips   int
		back    []string
	}{
		{
			// Seed 000: one partition + one group = one lease; the oldest
			// intention first (cands are in registration order).
			name:  "OldestFirstOnePerGroup",
			items: []fastItem{{key: "q:a", parts: hintedParts("p1"), cands: []fastCand{any1(), any1(), any1()}}},
			want:  []string{"0.0:id-p1"},
		},
		{
			// Seed 000: specific-partition requests first, even when younger.
			name: "SpecificFirst",
			items: []fastItem{{key: "q:a", parts: hintedParts("p1", "p2"),
				cands: []fastCand{any1(), named("p1"), named("p9")}}},
			want: []string{"0.1:id-p1", "0.0:id-p2"},
		},
		{
			// Several hinted partitions spread over the group's intentions;
			// one that claimed its one partition is partial for the next.
			name:    "SpreadOverIntentions",
			items:   []fastItem{{key: "q:a", parts: hintedParts("p3", "p1", "p2"), cands: []fastCand{any1(), any1()}}},
			want:    []string{"0.0:id-p1", "0.1:id-p2"},
			partial: map[[2]int]bool{{0, 0}: true, {0, 1}: true},
		},
		{
			// Groups have their own leases: the same partition goes to one
			// intention of each.
			name: "GroupsIndependent",
			items: []fastItem{{key: "q:a", parts: hintedParts("p1"),
				cands: []fastCand{any1(), inGroup(any1(), "g2"), inGroup(any1(), "g2")}}},
			want: []string{"0.0:id-p1", "0.1:id-p1"},
		},
		{
			// Credit and batch limits: a partition claim carries the
			// intention's limit and total; one without credit (or held) is
			// skipped and marked missed, and the next of its group served.
			name: "NotReadySkipped",
			items: []fastItem{{key: "q:a", parts: hintedParts("p1"),
				cands: []fastCand{{group: queue.DefaultGroup, partitions: 1}, {group: queue.DefaultGroup, ready: true, partitions: 1, limit: 3, total: 3}}}},
			want:   []string{"0.1:id-p1"},
			missed: [][2]int{{0, 0}},
		},
		{
			name: "GoneSkipped",
			items: []fastItem{{key: "q:a", parts: hintedParts("p1"),
				cands: []fastCand{{group: queue.DefaultGroup, gone: true, ready: true, partitions: 1}, any1()}}},
			want: []string{"0.1:id-p1"},
		},
		{
			// A group the push leased the partition to is settled for it.
			name: "HandedSettlesTheGroup",
			items: []fastItem{{key: "q:a", parts: hintedParts("p1"), handed: map[string]bool{"id-p1\x00g2": true},
				cands: []fastCand{inGroup(any1(), "g2"), inGroup(any1(), "g2"), any1()}}},
			want: []string{"0.2:id-p1"},
		},
		{
			// A wildcard intention claims up to its partitions of the
			// hinted ones, all in one delivery.
			name: "MultiPartitionClaim",
			items: []fastItem{{key: "q:a", parts: hintedParts("p1", "p2", "p3"),
				cands: []fastCand{{group: queue.DefaultGroup, ready: true, partitions: 2, limit: 5, total: 10}}}},
			want:    []string{"0.0:id-p1", "0.0:id-p2"},
			partial: map[[2]int]bool{{0, 0}: true},
		},
		{
			// An unknown partition id (the store's cache missed) sends the
			// queue to a pre-flight; the known partitions are served.
			name: "UnknownIDFallsBack",
			items: []fastItem{{key: "q:a", parts: []fastPart{{name: "p0"}, {name: "p1", id: "id-p1"}, {name: "p2"}},
				cands: []fastCand{any1()}}},
			want: []string{"0.0:id-p1"},
			back: []string{"q:a"},
		},
		{
			// A lease another live instance holds is not popped; the key is
			// looked at again when the earliest hint lapses. An audited
			// hint is popped all the same.
			name: "LeaseHints",
			items: []fastItem{{key: "q:a", parts: hintedParts("p1", "p2", "p3"),
				cands: []fastCand{any1(), any1(), any1()}}},
			hints: map[hintKey]leaseHint{
				{"id-p1", queue.DefaultGroup}: {until: later},
				{"id-p2", queue.DefaultGroup}: {until: soon},
				{"id-p3", queue.DefaultGroup}: {audit: true},
			},
			want:  []string{"0.0:id-p3"},
			until: map[string]time.Time{"q:a": soon},
			skips: 2,
		},
		{
			// Queues are independent: each its own intentions.
			name: "SeveralQueues",
			items: []fastItem{
				{key: "q:a", parts: hintedParts("p1"), cands: []fastCand{any1()}},
				{key: "q:b", parts: []fastPart{{name: "p1", id: "id-b-p1"}}, cands: []fastCand{any1()}},
			},
			want: []string{"0.0:id-p1", "1.0:id-b-p1"},
		},
		{
			name:  "NothingHinted",
			items: []fastItem{{key: "q:a", cands: []fastCand{any1()}}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pl := decideFast(tc.items, tc.hints)
			assert.Equal(t, tc.want, fastAssigned(pl.assigns))
			assert.Equal(t, tc.missed, pl.missed)
			if tc.partial == nil {
				tc.partial = map[[2]int]bool{}
			}
			assert.Equal(t, tc.partial, pl.partial)
			if tc.until == nil {
				tc.until = map[string]time.Time{}
			}
			assert.Equal(t, tc.until, pl.hintedUntil)
			assert.Equal(t, tc.skips, pl.hintSkips)
			assert.Equal(t, tc.back, pl.fallback)
			assert.Zero(t, fastDoubleAssigned(tc.items, pl.assigns))
			for _, a := range pl.assigns {
				c := tc.items[a.item].cands[a.cand]
				assert.Equal(t, c.limit, a.limit, "limit of %d.%d", a.item, a.cand)
				assert.Equal(t, c.total, a.total, "total of %d.%d", a.item, a.cand)
				assert.Equal(t, tc.hints[hintKey{a.partitionID, c.group}].audit, a.audit)
			}
			// Pure: the same input gives the same output.
			again := decideFast(tc.items, tc.hints)
			assert.Equal(t, fastAssigned(pl.assigns), fastAssigned(again.assigns))
		})
	}
}

// The one preference order of the hand-off and the fast path: candidates
// naming the partition first, then the others, oldest first; one per
// group once its group is settled; gone ones and those naming another
// partition never.
func TestByPreference(t *testing.T) {
	type c struct {
		group, partition string
		gone             bool
	}
	cands := []c{{"g1", "", false}, {"g1", "p", false}, {"g2", "", false}, {"g3", "q", false},
		{"g4", "", true}, {"g2", "p", false}, {"g5", "", false}, {"g5", "", false}}
	for _, tc := range []struct {
		name    string
		settles func(i int) bool
		want    []int
	}{
		{"every take settles", func(int) bool { return true }, []int{1, 5, 6}},
		{"nothing settles", func(int) bool { return false }, []int{1, 5, 0, 2, 6, 7}},
		{"g5's first does not settle", func(i int) bool { return i != 6 }, []int{1, 5, 6, 7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []int
			byPreference(len(cands), func(i int) (string, string, bool) {
				return cands[i].group, cands[i].partition, cands[i].gone
			}, "p", func(i int) bool { got = append(got, i); return tc.settles(i) })
			if !slices.Equal(got, tc.want) {
				t.Errorf("offered %v, want %v", got, tc.want)
			}
		})
	}
}
