package poller

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

func part(target int, id string, waiting int64) queue.Availability {
	return queue.Availability{Target: target, PartitionID: id, Partition: id, Group: queue.DefaultGroup,
		Waiting: waiting, HasConsumer: true, Eligible: true}
}

func prio(a queue.Availability, priority int) queue.Availability {
	a.Priority = priority
	return a
}

// assigned renders assignments as "candidate:partition" in output order.
func assigned(as []assignment) []string {
	var out []string
	for _, a := range as {
		out = append(out, fmt.Sprintf("%d:%s", a.candidate, a.avail.PartitionID))
	}
	return out
}

func TestDecide(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cands   []candidate
		avail   []queue.Availability
		want    []string
		skipped map[int]string
	}{
		{
			// Seed 000, unit test 2: 5 intentions, 2 available partitions.
			name:    "LeaseSafety",
			cands:   []candidate{{id: 0, seq: 1}, {id: 1, seq: 2}, {id: 2, seq: 3}, {id: 3, seq: 4}, {id: 4, seq: 5}},
			avail:   []queue.Availability{part(0, "p1", 5), part(0, "p2", 3)},
			want:    []string{"0:p1", "1:p2"},
			skipped: map[int]string{2: skipTaken, 3: skipTaken, 4: skipTaken},
		},
		{
			// Seed 000, unit test 3: fullest partition first.
			name:  "FullestFirst",
			cands: []candidate{{id: 0, seq: 1}, {id: 1, seq: 2}, {id: 2, seq: 3}},
			avail: []queue.Availability{part(0, "p10", 10), part(0, "p100", 100), part(0, "p50", 50)},
			want:  []string{"0:p100", "1:p50", "2:p10"},
		},
		{
			// A namespace target's queues of higher priority
			// first, however full the others are; fullest within one.
			name:  "PriorityFirst",
			cands: []candidate{{id: 0, seq: 1}, {id: 1, seq: 2}, {id: 2, seq: 3}, {id: 3, seq: 4}},
			avail: []queue.Availability{prio(part(0, "low", 100), 0), prio(part(0, "high-a", 1), 5),
				prio(part(0, "mid", 50), 2), prio(part(0, "high-b", 3), 5)},
			want: []string{"0:high-b", "1:high-a", "2:mid", "3:low"},
		},
		{
			// Seed 000, unit test 4: specific-partition requests first, even
			// when younger than the wildcard ones.
			name: "SpecificFirst",
			cands: []candidate{
				{id: 0, target: 0, seq: 1},
				{id: 1, target: 1, seq: 2, specific: true},
			},
			avail: []queue.Availability{part(0, "p1", 100), part(0, "p2", 1), part(1, "p1", 100)},
			want:  []string{"1:p1", "0:p2"},
		},
		{
			// Seed 000, unit test 5: a partition in its window buffer (not
			// eligible) is not assigned; nor one without a consumer row, nor
			// one whose expiry must dead-letter.
			name:  "BlockedPartitionsSkipped",
			cands: []candidate{{id: 0, seq: 1}, {id: 1, seq: 2}, {id: 2, seq: 3}},
			avail: []queue.Availability{
				{Target: 0, PartitionID: "window", Group: queue.DefaultGroup, Waiting: 9, HasConsumer: true},
				{Target: 0, PartitionID: "new", Group: queue.DefaultGroup, Waiting: 8, Eligible: true},
				{Target: 0, PartitionID: "poison", Group: queue.DefaultGroup, Waiting: 7, Eligible: true, HasConsumer: true, DeadOnExpiry: true},
				part(0, "ok", 1),
			},
			want:    []string{"0:ok"},
			skipped: map[int]string{1: skipTaken, 2: skipTaken},
		},
		{
			name:    "OldestFirst",
			cands:   []candidate{{id: 0, seq: 9}, {id: 1, seq: 3}},
			avail:   []queue.Availability{part(0, "p1", 1)},
			want:    []string{"1:p1"},
			skipped: map[int]string{0: skipTaken},
		},
		{
			name:    "NothingAvailable",
			cands:   []candidate{{id: 0, seq: 1}, {id: 1, seq: 2, target: 1, specific: true}},
			avail:   nil,
			skipped: map[int]string{0: skipNoPartition, 1: skipPartitionUnavailable},
		},
		{
			// Groups have their own leases: the same partition may go to two
			// candidates of different groups.
			name:  "GroupsIndependent",
			cands: []candidate{{id: 0, target: 0, seq: 1}, {id: 1, target: 1, seq: 2}},
			avail: []queue.Availability{part(0, "p1", 1),
				{Target: 1, PartitionID: "p1", Group: "analytics", Waiting: 1, HasConsumer: true, Eligible: true}},
			want: []string{"0:p1", "1:p1"},
		},
		{
			// Two targets reaching the same queue and group (by name and by
			// namespace) still never share a partition.
			name:    "SameGroupAcrossTargets",
			cands:   []candidate{{id: 0, target: 0, seq: 1}, {id: 1, target: 1, seq: 2}},
			avail:   []queue.Availability{part(0, "p1", 1), part(1, "p1", 1)},
			want:    []string{"0:p1"},
			skipped: map[int]string{1: skipTaken},
		},
		{
			name:  "MultiPartitionClaim",
			cands: []candidate{{id: 0, seq: 1, partitions: 2}, {id: 1, seq: 2, partitions: 5}},
			avail: []queue.Availability{part(0, "a", 4), part(0, "b", 3), part(0, "c", 2)},
			want:  []string{"0:a", "0:b", "1:c"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, skipped := decide(tc.cands, tc.avail)
			assert.Equal(t, tc.want, assigned(got))
			if tc.skipped == nil {
				tc.skipped = map[int]string{}
			}
			assert.Equal(t, tc.skipped, skipped)
			assert.Zero(t, doubleAssigned(got))
			// Pure: the same input gives the same output.
			again, _ := decide(tc.cands, tc.avail)
			assert.Equal(t, assigned(got), assigned(again))
		})
	}
}

func TestDoubleAssigned(t *testing.T) {
	as := []assignment{{avail: part(0, "p", 1)}, {avail: part(1, "p", 1)}, {avail: part(0, "q", 1)}}
	assert.Equal(t, 1, doubleAssigned(as))
}

func TestChunkByTarget(t *testing.T) {
	mk := func(key, part string) *Intention {
		return &Intention{key: key, Target: queue.Target{Partition: part}}
	}
	work := []*Intention{mk("q:a", ""), mk("q:b", ""), mk("q:a", ""), mk("q:c", ""), mk("q:a", "p"), mk("q:b", "")}
	chunks := chunkByTarget(work, 2)
	// Targets: a, b | c, a/p. Same-target intentions stay together.
	assert.Len(t, chunks, 2)
	assert.Equal(t, []*Intention{work[0], work[1], work[2], work[5]}, chunks[0])
	assert.Equal(t, []*Intention{work[3], work[4]}, chunks[1])
	assert.Len(t, chunkByTarget(work, 200), 1)
}

// A standing intention leases up to a batch from each partition it claims
// in one cycle (Intention.take); its consumer gets them a batch at a time,
// in order, each counting its own partitions.
func TestSplitBatches(t *testing.T) {
	var msgs []queue.Message
	for _, p := range []string{"a", "a", "a", "b", "c", "c"} {
		msgs = append(msgs, queue.Message{Queue: "q", Partition: p, PartitionID: "id-" + p, Offset: int64(len(msgs) + 1)})
	}
	res := &queue.PopResult{Queue: "q", Partition: "a", PartitionID: "id-a", LeaseID: "l", Messages: msgs,
		PartitionsClaimed: 3, DeadLettered: map[string]int{"q": 1}}
	parts := splitBatches(res, 4)
	require.Len(t, parts, 2)
	assert.Equal(t, msgs[:4], parts[0].Messages)
	assert.Equal(t, 2, parts[0].PartitionsClaimed)
	assert.Equal(t, map[string]int{"q": 1}, parts[0].DeadLettered)
	assert.Equal(t, msgs[4:], parts[1].Messages)
	assert.Equal(t, "c", parts[1].Partition)
	assert.Equal(t, "id-c", parts[1].PartitionID)
	assert.Equal(t, 1, parts[1].PartitionsClaimed)
	assert.Nil(t, parts[1].DeadLettered, "counted once")
	assert.Equal(t, "l", parts[1].LeaseID)
	assert.Same(t, res, splitBatches(res, 6)[0], "a result within the batch goes as it is")

	one := &Intention{Batch: 10, Partitions: 5, credit: 30, Standing: true}
	assert.Equal(t, 30, one.take(), "credit bounds a standing intention")
	one.credit = 100
	assert.Equal(t, 50, one.take(), "a batch from each partition it may claim")
	poll := &Intention{Batch: 10, Partitions: 5, credit: 10}
	assert.Equal(t, 10, poll.take(), "a long-poll answers with one batch")
}

// A wildcard candidate with a message budget claims partitions until what
// they hold (a batch at most from each) covers it: many partitions of one
// message each, few full ones.
func TestDecide_BudgetBoundsPartitions(t *testing.T) {
	var thin, deep []queue.Availability
	for i := range 8 {
		thin = append(thin, part(0, fmt.Sprint("t", i), 1))
		deep = append(deep, part(0, fmt.Sprint("d", i), 50))
	}
	as, _ := decide([]candidate{{id: 0, seq: 1, partitions: 100, budget: 5, batch: 10}}, thin)
	assert.Len(t, as, 5, "one message each: five partitions cover a budget of five")
	as, _ = decide([]candidate{{id: 0, seq: 1, partitions: 100, budget: 25, batch: 10}}, deep)
	assert.Len(t, as, 3, "a batch from each: three partitions cover 25")
	as, _ = decide([]candidate{{id: 0, seq: 1, partitions: 2, budget: 25, batch: 10}}, thin)
	assert.Len(t, as, 2, "the partition count still bounds")
}
