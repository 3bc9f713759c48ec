package queue

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ackCase is one ack request on one consumer row (partition "p", group
// "g"). An item's seq 0 means its message was not found.
type ackCase struct {
	name   string
	row    lockedConsumer
	items  []ackItem
	proven []string
	// want is each item's result in short: its error text, or "ok" with
	// " dlq", " released", " pending" as set.
	want []string
	// The row afterwards.
	cursor     int64
	done       []int64
	lease      string
	attempts   int
	attemptSeq int64
	dead       []int64 // offsets dead-lettered
	written    bool    // the row is written back
}

type ackItem struct {
	seq    int64
	status AckStatus
	lease  string
	holder string
}

// leased is a row with lease L1 over 11..13 after cursor 10, live, for
// subject "alice", 20 offsets in the partition, 3 retries.
func leased() lockedConsumer {
	return lockedConsumer{st: cursorState{cursor: 10, leaseID: "L1", leaseFrom: 11, leaseTo: 13}, liveLease: "L1",
		deliveredTo: 13, lastOffset: 20, retryLimit: 3, subject: "alice"}
}

// expired is leased() after the lease ran out (not yet charged: the next
// pop does that).
func expired() lockedConsumer {
	r := leased()
	r.liveLease = ""
	return r
}

func with(r lockedConsumer, f func(*lockedConsumer)) lockedConsumer { f(&r); return r }

func runAckCases(t *testing.T, cases []ackCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			row := c.row
			st := ackState{locked: map[consumerKey]*lockedConsumer{{"p", "g"}: &row}}
			acks := make([]Ack, len(c.items))
			for i, it := range c.items {
				acks[i] = Ack{TransactionID: "t", PartitionID: "p", Group: "g", Status: it.status, LeaseID: it.lease,
					Holder: it.holder}
				if acks[i].Status == "" {
					acks[i].Status = StatusCompleted
				}
				m := ackedMessage{queue: "q", partition: "part"}
				if it.seq != 0 {
					seq := it.seq
					m.seq = &seq
				}
				st.msgs = append(st.msgs, m)
			}
			plan, err := decideAck(st, acks, c.proven)
			require.NoError(t, err)
			got := make([]string, len(plan.results))
			for i, r := range plan.results {
				assert.Equal(t, i, r.Index)
				assert.Equal(t, "q", r.Queue)
				got[i] = summary(r)
			}
			assert.Equal(t, c.want, got, "results")
			assert.Equal(t, c.cursor, row.st.cursor, "cursor")
			assert.Equal(t, c.done, nilIfEmpty(row.st.done), "done")
			assert.Equal(t, c.lease, row.st.leaseID, "lease")
			assert.Equal(t, [2]int64{int64(c.attempts), c.attemptSeq}, [2]int64{int64(row.st.attempts), row.st.attemptSeq},
				"attempts, attempt offset")
			var dead []int64
			for _, d := range plan.dead {
				dead = append(dead, d.seq)
			}
			assert.Equal(t, c.dead, dead, "dead letters")
			assert.Equal(t, c.written, len(plan.rows) == 1, "written back")
		})
	}
}

func summary(r AckResult) string {
	if r.Error != "" {
		return r.Error
	}
	s := []string{"ok"}
	for _, f := range []struct {
		set  bool
		name string
	}{{r.DLQ, "dlq"}, {r.LeaseReleased, "released"}, {r.Pending, "pending"}} {
		if f.set {
			s = append(s, f.name)
		}
	}
	return strings.Join(s, " ")
}

func nilIfEmpty(s []int64) []int64 {
	if len(s) == 0 {
		return nil
	}
	return s
}

func TestDecideAck_Completed(t *testing.T) {
	runAckCases(t, []ackCase{{
		name:  "InOrder",
		row:   leased(),
		items: []ackItem{{seq: 11, lease: "L1"}, {seq: 12, lease: "L1"}, {seq: 13, lease: "L1"}},
		// The last item finishes the lease: it is released, and the
		// partition has more (20 > 13).
		want:   []string{"ok", "ok", "ok released pending"},
		cursor: 13, written: true,
	}, {
		name:  "OutOfOrderCursorWaitsForTheGap",
		row:   leased(),
		items: []ackItem{{seq: 13, lease: "L1"}, {seq: 11, lease: "L1"}},
		want:  []string{"ok", "ok"},
		// 12 is still out: the cursor stops before it, 13 waits in done.
		cursor: 11, done: []int64{13}, lease: "L1", written: true,
	}, {
		name:   "OutOfOrderGapClosed",
		row:    with(leased(), func(r *lockedConsumer) { r.st.done = []int64{12, 13} }),
		items:  []ackItem{{seq: 11, lease: "L1"}},
		want:   []string{"ok released pending"},
		cursor: 13, written: true,
	}, {
		name:   "PartialBatchKeepsTheLease",
		row:    leased(),
		items:  []ackItem{{seq: 11, lease: "L1"}, {seq: 12, lease: "L1"}},
		want:   []string{"ok", "ok"},
		cursor: 12, lease: "L1", written: true,
	}, {
		name:   "LastOfThePartitionNothingPending",
		row:    with(leased(), func(r *lockedConsumer) { r.lastOffset = 13; r.st.cursor = 12; r.st.leaseFrom = 13 }),
		items:  []ackItem{{seq: 13, lease: "L1"}},
		want:   []string{"ok released"},
		cursor: 13, written: true,
	}, {
		name:   "RepeatIsHarmless",
		row:    with(leased(), func(r *lockedConsumer) { r.st.done = []int64{12} }),
		items:  []ackItem{{seq: 12, lease: "L1"}, {seq: 9}},
		want:   []string{"ok", "ok"},
		cursor: 10, done: []int64{12}, lease: "L1",
	}, {
		// A client retrying an ack whose answer it lost: the first
		// committed and ended L0; the repeat names it and changes nothing,
		// neither the lease live now (L1) nor the row.
		name:   "RepeatUnderAnEndedLeaseIsHarmless",
		row:    leased(),
		items:  []ackItem{{seq: 10, lease: "L0"}, {seq: 9, lease: "L0", status: StatusFailed}},
		want:   []string{"ok", "ok"},
		cursor: 10, lease: "L1",
	}, {
		name:   "RepeatAfterTheLeaseWasReleased",
		row:    with(expired(), func(r *lockedConsumer) { r.st.cursor, r.st.leaseID = 13, "" }),
		items:  []ackItem{{seq: 13, lease: "L1"}},
		want:   []string{"ok"},
		cursor: 13,
	}, {
		// A seek to the end (13) passed over 11-13 and ended L1: its
		// holder's ack is refused, not taken for a repeat, with or without
		// the lease; 10, acked before the seek, still repeats harmlessly.
		name: "AfterASeekPassedOverIt",
		row: with(expired(), func(r *lockedConsumer) {
			r.st.cursor, r.st.leaseID, r.seekFrom, r.seekTo = 13, "", 10, 13
		}),
		items:  []ackItem{{seq: 11, lease: "L1"}, {seq: 12}, {seq: 10, lease: "L1"}},
		want:   []string{ErrTextInvalidLease, ErrTextNotLeased, "ok"},
		cursor: 13,
	}, {
		// A lease taken after the seek acked 14 and ended; its repeat
		// names an offset no seek passed over, and succeeds.
		name: "RepeatAfterASeekOfAnOffsetAckedSince",
		row: with(expired(), func(r *lockedConsumer) {
			r.st.cursor, r.st.leaseID, r.seekFrom, r.seekTo = 14, "", 10, 13
		}),
		items:  []ackItem{{seq: 14, lease: "L2"}},
		want:   []string{"ok"},
		cursor: 14,
	}, {
		// An autoAck pop moved the cursor at delivery and kept no lease:
		// an ack of its message is a repeat.
		name:   "AutoAcked",
		row:    lockedConsumer{st: cursorState{cursor: 13}, deliveredTo: 0, lastOffset: 13, retryLimit: 3},
		items:  []ackItem{{seq: 12}, {seq: 13, status: StatusFailed}},
		want:   []string{"ok", "ok"},
		cursor: 13,
	}, {
		name:   "ProvenLeaseStandsForANamedOne",
		row:    leased(),
		proven: []string{"L1"},
		items:  []ackItem{{seq: 11}},
		want:   []string{"ok"},
		cursor: 11, lease: "L1", written: true,
	}})
}

func TestDecideAck_FailedAndRetried(t *testing.T) {
	runAckCases(t, []ackCase{{
		name:  "FailedWithRetriesLeft",
		row:   leased(),
		items: []ackItem{{seq: 11, status: StatusFailed, lease: "L1"}, {seq: 12, lease: "L1"}, {seq: 11, lease: "L1"}},
		// 11 goes back with one attempt counted; 12 is still acked under
		// the lease, which ends with the request (released by the item
		// that gave 11 back); 11 may not be acked again in it.
		want:   []string{"ok released pending", "ok", ErrTextReleased},
		cursor: 10, done: []int64{12}, attempts: 1, attemptSeq: 11, written: true,
	}, {
		name: "RetriesExhaustedDeadLetters",
		row: with(leased(), func(r *lockedConsumer) {
			r.st.attempts, r.st.attemptSeq = 3, 11
		}),
		items: []ackItem{{seq: 11, status: StatusFailed, lease: "L1"}},
		// Past the limit: dead-lettered and finished; the attempts start
		// again for 12.
		want:   []string{"ok dlq"},
		cursor: 11, lease: "L1", dead: []int64{11}, written: true,
	}, {
		name:   "RetryCountsNothing",
		row:    with(leased(), func(r *lockedConsumer) { r.st.attempts, r.st.attemptSeq = 2, 11 }),
		items:  []ackItem{{seq: 11, status: StatusRetry, lease: "L1"}},
		want:   []string{"ok released pending"},
		cursor: 10, attempts: 2, attemptSeq: 11, written: true,
	}, {
		name:   "DLQAtOnce",
		row:    leased(),
		items:  []ackItem{{seq: 11, status: StatusDLQ, lease: "L1"}, {seq: 12, lease: "L1"}, {seq: 13, lease: "L1"}},
		want:   []string{"ok dlq", "ok", "ok released pending"},
		cursor: 13, dead: []int64{11}, written: true,
	}})
}

func TestDecideAck_Refused(t *testing.T) {
	runAckCases(t, []ackCase{{
		name:   "ForeignHolder",
		row:    leased(),
		items:  []ackItem{{seq: 11, lease: "L1", holder: "mallory"}, {seq: 12, lease: "L1", holder: "alice"}},
		want:   []string{ErrTextForeign, "ok"},
		cursor: 10, done: []int64{12}, lease: "L1", written: true,
	}, {
		name:   "OtherLease",
		row:    leased(),
		items:  []ackItem{{seq: 11, lease: "L0"}},
		want:   []string{ErrTextInvalidLease},
		cursor: 10, lease: "L1",
	}, {
		name:   "NoLeaseNamedWhileOneIsLive",
		row:    leased(),
		items:  []ackItem{{seq: 11}},
		want:   []string{ErrTextLeaseRequired},
		cursor: 10, lease: "L1",
	}, {
		name:   "OutsideTheLease",
		row:    with(leased(), func(r *lockedConsumer) { r.deliveredTo = 15 }),
		items:  []ackItem{{seq: 15, lease: "L1"}},
		want:   []string{ErrTextOutsideLease},
		cursor: 10, lease: "L1",
	}, {
		// An expired lease is no lease: naming it is refused, but a
		// verdict on a delivered message naming none is taken (the
		// consumer finished it late), while failed and retry have no lease
		// to give back.
		name: "ExpiredLease",
		row:  expired(),
		items: []ackItem{{seq: 11, lease: "L1"}, {seq: 11}, {seq: 12, status: StatusFailed},
			{seq: 12, status: StatusRetry}},
		want:   []string{ErrTextInvalidLease, "ok", ErrTextNoLiveLease, ErrTextNoLiveLease},
		cursor: 11, lease: "L1", written: true,
	}, {
		name:   "NeverDelivered",
		row:    expired(),
		items:  []ackItem{{seq: 14}},
		want:   []string{ErrTextNotLeased},
		cursor: 10, lease: "L1",
	}, {
		name:   "MessageNotFound",
		row:    leased(),
		items:  []ackItem{{seq: 0, lease: "L1"}},
		want:   []string{ErrTextNotFound},
		cursor: 10, lease: "L1",
	}})
}

func TestDecideAck_NoConsumerRow(t *testing.T) {
	seq := int64(1)
	plan, err := decideAck(ackState{msgs: []ackedMessage{{queue: "q", seq: &seq}}, locked: map[consumerKey]*lockedConsumer{}},
		[]Ack{{PartitionID: "p", Group: "g", Status: StatusCompleted}}, nil)
	require.NoError(t, err)
	assert.Equal(t, ErrTextNotLeased, plan.results[0].Error)
	assert.Empty(t, plan.rows)
}

func TestDecideAck_UnknownStatus(t *testing.T) {
	seq := int64(11)
	row := leased()
	_, err := decideAck(ackState{msgs: []ackedMessage{{seq: &seq}}, locked: map[consumerKey]*lockedConsumer{{"p", "g"}: &row}},
		[]Ack{{PartitionID: "p", Group: "g", Status: "maybe", LeaseID: "L1"}}, nil)
	var ie *InputError
	assert.ErrorAs(t, err, &ie)
}

// A queue's deadPolicy: the zero value (the defaults, and any row read
// without the flags) keeps every dead letter; deadLetterQueue false drops
// them all; dlqAfterMaxRetries false drops only those past the retry limit.
func TestDeadPolicy_Keeps(t *testing.T) {
	for _, c := range []struct {
		p                deadPolicy
		exhausted, other bool
	}{
		{deadPolicy{}, true, true},
		{deadPolicy{drop: true}, false, false},
		{deadPolicy{dropExhausted: true}, false, true},
		{deadPolicy{drop: true, dropExhausted: true}, false, false},
	} {
		assert.Equal(t, c.exhausted, c.p.keeps(true), "%+v past the retry limit", c.p)
		assert.Equal(t, c.other, c.p.keeps(false), "%+v given up otherwise", c.p)
	}
}
