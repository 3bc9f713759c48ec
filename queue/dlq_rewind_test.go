package queue

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The rewind math of a replay, on a consumer row in memory.
func TestDLQReplay_RewindMath(t *testing.T) {
	for _, c := range []struct {
		name             string
		cursor           int64
		done             []int64
		attempts         int
		attemptSeq       int64
		seq              int64
		wantCursor       int64
		wantDone         []int64
		wantAttempts     int
		wantAttemptSeq   int64
		wantPendingFirst bool // seq is the first unfinished offset afterwards
	}{
		{name: "AtTheCursor", cursor: 5, seq: 5, wantCursor: 4, wantDone: []int64{}, wantAttemptSeq: 5, wantPendingFirst: true},
		{name: "BehindTheCursor", cursor: 9, seq: 6, wantCursor: 5, wantDone: []int64{7, 8, 9}, wantAttemptSeq: 6, wantPendingFirst: true},
		{name: "BehindTheCursorWithDone", cursor: 9, done: []int64{11, 14}, seq: 7, wantCursor: 6,
			wantDone: []int64{8, 9, 11, 14}, wantAttemptSeq: 7, wantPendingFirst: true},
		{name: "FirstOffset", cursor: 3, seq: 1, wantCursor: 0, wantDone: []int64{2, 3}, wantAttemptSeq: 1, wantPendingFirst: true},
		{name: "InDone", cursor: 4, done: []int64{6, 7, 9}, seq: 7, wantCursor: 4, wantDone: []int64{6, 9}, wantAttemptSeq: 7},
		{name: "AlreadyPending", cursor: 4, done: []int64{6}, seq: 8, wantCursor: 4, wantDone: []int64{6}, wantAttemptSeq: 8},
		{name: "KeepsAnotherPendingOffsetsAttempts", cursor: 4, done: []int64{7}, attempts: 2, attemptSeq: 5, seq: 7,
			wantCursor: 4, wantDone: []int64{}, wantAttempts: 2, wantAttemptSeq: 5},
		{name: "ResetsItsOwnAttempts", cursor: 4, done: []int64{7}, attempts: 3, attemptSeq: 7, seq: 7,
			wantCursor: 4, wantDone: []int64{}, wantAttemptSeq: 7},
		{name: "BehindTheCursorKeepsPendingAttempts", cursor: 9, attempts: 1, attemptSeq: 10, seq: 8,
			wantCursor: 7, wantDone: []int64{9}, wantAttempts: 1, wantAttemptSeq: 10, wantPendingFirst: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := cursorState{cursor: c.cursor, done: append([]int64(nil), c.done...), attempts: c.attempts, attemptSeq: c.attemptSeq}
			st.rewind(c.seq)
			assert.Equal(t, c.wantCursor, st.cursor)
			if len(c.wantDone) == 0 {
				assert.Empty(t, st.done)
			} else {
				assert.Equal(t, c.wantDone, st.done)
			}
			assert.Equal(t, c.wantAttempts, st.attempts)
			assert.Equal(t, c.wantAttemptSeq, st.attemptSeq)
			assert.True(t, st.changed)
			assert.False(t, st.isDone(c.seq), "the replayed offset is unfinished")
			assert.Equal(t, c.wantPendingFirst, st.firstPending() == c.seq)
			// Every other offset keeps its state.
			before := cursorState{cursor: c.cursor, done: c.done}
			for o := int64(1); o <= 20; o++ {
				if o != c.seq {
					assert.Equal(t, before.isDone(o), st.isDone(o), "offset %d", o)
				}
			}
			// Acking it again moves the cursor back where it was (or past).
			st.markDone(c.seq)
			assert.True(t, st.isDone(c.seq))
			if c.seq <= c.cursor {
				assert.Equal(t, c.cursor, st.cursor, "the ack jumps over the done run")
			}
		})
	}
}

// decideReplay skips what it must, settles an expired lease
// before rewinding, and rewinds a row once per dead letter.
func TestDLQReplay_DecideSkipsSettlesAndRewindsOnce(t *testing.T) {
	ref := func(id int64, pid, group string, seq int64) dlqRef {
		return dlqRef{DLQOutcome: DLQOutcome{ID: id, Queue: "q", Partition: pid, PartitionID: pid, Group: group}, seq: seq}
	}
	rows := map[consumerKey]*replayRow{
		{"p1", "g"}:       {st: cursorState{cursor: 10}},
		{"p2", "g"}:       {st: cursorState{cursor: 3, leaseID: "L", leaseFrom: 4, leaseTo: 4}, live: true},
		{"p3", "g"}:       {st: cursorState{cursor: 60010}},
		{"p4", "g"}:       {st: cursorState{cursor: 5, leaseID: "X", leaseFrom: 6, leaseTo: 7}, retryLimit: 0},
		{"p1", "another"}: {st: cursorState{cursor: 10}},
	}
	// p7: two replays far apart on one row; each alone within the bound,
	// the second would take the done array past it (30,000 + 24,999).
	rows[consumerKey{"p7", "g"}] = &replayRow{st: cursorState{cursor: 60000}}
	msgs := map[messageKey]storedMessage{{"p1", 4}: {stored: true}, {"p1", 8}: {stored: true}, {"p2", 2}: {stored: true},
		{"p3", 5}: {stored: true}, {"p4", 3}: {stored: true}, {"p1", 2}: {stored: true, expired: true},
		{"p7", 30000}: {stored: true}, {"p7", 5000}: {stored: true}}
	refs := []dlqRef{ref(1, "p1", "g", 4), ref(2, "p1", "g", 8), ref(3, "p2", "g", 2), ref(4, "p1", "g", 9),
		ref(5, "p3", "g", 5), ref(6, "p9", "g", 1), ref(7, "p4", "g", 3), ref(8, "p1", "g", 4), ref(9, "p1", "g", 2),
		ref(10, "p7", "g", 30000), ref(11, "p7", "g", 5000)}
	there := map[int64]bool{1: true, 2: true, 3: true, 4: true, 5: true, 6: true, 7: true, 9: true, 10: true, 11: true}
	plan := decideReplay(refs, there, rows, msgs)
	got := map[int64]string{}
	for _, o := range plan.items {
		got[o.ID] = o.Status + " " + o.Reason
	}
	assert.Equal(t, map[int64]string{1: "replayed ", 2: "replayed ", 3: "skipped leased", 4: "skipped message_gone",
		5: "skipped too_far", 6: "skipped group_gone", 7: "replayed ", 8: "skipped not_found", 9: "skipped expired",
		10: "replayed ", 11: "skipped too_far"}, got)
	assert.Equal(t, []int64{1, 2, 7, 10}, plan.replayed)
	assert.Equal(t, []consumerKey{{"p1", "g"}, {"p4", "g"}, {"p7", "g"}}, plan.rows)
	assert.Len(t, rows[consumerKey{"p7", "g"}].st.done, 30000, "the bound holds over replays one after the other")
	p1 := rows[consumerKey{"p1", "g"}].st
	assert.Equal(t, int64(3), p1.cursor)
	assert.Equal(t, []int64{5, 6, 7, 9, 10}, p1.done, "4 and 8 pending again, the rest finished")
	assert.Equal(t, int64(10), rows[consumerKey{"p1", "another"}].st.cursor, "another group is untouched")
	assert.Equal(t, int64(3), rows[consumerKey{"p2", "g"}].st.cursor, "a live lease is left alone")
	// p4's expired lease was charged to offset 6 (retry limit 0: dead-
	// lettered) before 3 was made pending.
	require.Len(t, plan.dead, 1)
	assert.Equal(t, int64(6), plan.dead[0].seq)
	assert.Equal(t, map[string]int{"q": 1}, plan.deadBy)
	p4 := rows[consumerKey{"p4", "g"}].st
	assert.Equal(t, "", p4.leaseID)
	assert.Equal(t, int64(2), p4.cursor)
	assert.Equal(t, []int64{4, 5, 6}, p4.done)
	assert.Len(t, plan.released, 1)
}
