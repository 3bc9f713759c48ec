package queue_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// A consumer that keeps up acks each message in order under the lease it
// was sent under: that ack is one statement, committed in its own round
// trip, not a transaction of five statements over two. A lease it ends
// with its partition caught up is marked after the commit, as before.
func TestAck_CompletionsInOrderUnderTheLiveLeaseAreOneStatement(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	stats := s.QueryStats()
	push(t, s, "q", "p", nums(1, 3)...)
	msgs := pop(t, s, queue.PopRequest{Queue: "q", Partition: "p", Batch: 3}).Messages
	require.Len(t, msgs, 3)

	before := stats.Snapshot()
	res, err := s.Ack(ctx, []queue.Ack{ackOf(msgs[0], queue.StatusCompleted)})
	require.NoError(t, err)
	assert.Equal(t, map[string]uint64{"ack_complete": 1}, opsSince(stats, before))
	require.Len(t, res, 1)
	assert.True(t, res[0].Success, "%+v", res[0])
	assert.False(t, res[0].LeaseReleased)
	assert.Equal(t, msgs[0].LeaseID, res[0].LeaseID)
	assert.Equal(t, "q", res[0].Queue)
	assert.Equal(t, "p", res[0].Partition)

	before = stats.Snapshot()
	res, err = s.Ack(ctx, []queue.Ack{ackOf(msgs[1], queue.StatusCompleted), ackOf(msgs[2], queue.StatusSuccess)})
	require.NoError(t, err)
	assert.Equal(t, map[string]uint64{"ack_complete": 1, "begin": 1, "set": 1, "ready_lock": 1, "ready_rows": 1, "commit": 1},
		opsSince(stats, before), "the lease ended with the partition caught up: the row is marked after the commit")
	require.Len(t, res, 2)
	assert.True(t, res[0].Success && res[1].Success, "%+v", res)
	assert.False(t, res[0].LeaseReleased)
	assert.True(t, res[1].LeaseReleased, "the last item ends the lease")
	assert.False(t, res[1].Pending, "nothing waits")

	// Everything is done: the next push is the next pop.
	push(t, s, "q", "p", nums(4, 4)...)
	next := pop(t, s, queue.PopRequest{Queue: "q", Partition: "p", Batch: 3}).Messages
	require.Len(t, next, 1)
	assert.EqualValues(t, 4, next[0].Offset)
}

// consumerRow is what an ack writes to a consumer row, lease ids and
// times left out but whether they are set, and the lease's time left
// rounded to the second.
type consumerRow struct {
	Cursor, DeliveredTo, LastOffset int64
	Done                            []int64
	Leased, Owned                   bool
	LeaseFrom, LeaseTo              *int64
	LeaseLeft                       *int64
	Attempts                        int
	AttemptSeq                      int64
}

func readConsumerRow(t *testing.T, s *queue.Store, pid string) consumerRow {
	t.Helper()
	var r consumerRow
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT cursor, delivered_to, last_offset, done, lease_id IS NOT NULL,
		lease_owner IS NOT NULL, lease_from, lease_to, round(extract(epoch FROM lease_expires_at - now()))::bigint,
		attempts, attempt_seq FROM consumers WHERE partition_id = $1::uuid`, pid).
		Scan(&r.Cursor, &r.DeliveredTo, &r.LastOffset, &r.Done, &r.Leased, &r.Owned, &r.LeaseFrom, &r.LeaseTo,
			&r.LeaseLeft, &r.Attempts, &r.AttemptSeq))
	return r
}

// The one-statement completion writes the consumer row and answers as the
// transaction every other ack takes: the same scenario on two partitions,
// one acked by completions alone, the other with an item added that no
// completion path takes (a message that does not exist, naming no lease),
// which sends its call through the transaction.
func TestAck_CompletionWritesAndAnswersAsTheAckTransaction(t *testing.T) {
	type step struct {
		ack      []int // which leased messages to complete, by index
		pushMore int   // messages pushed after the step's ack
	}
	cases := map[string]struct {
		pushed int
		fail   bool // fail and redeliver the first message before the acks (attempts)
		steps  []step
	}{
		"PartOfTheLease":               {pushed: 3, steps: []step{{ack: []int{0}}, {ack: []int{1}}}},
		"TheWholeLease":                {pushed: 2, steps: []step{{ack: []int{0, 1}}}},
		"TheWholeLeaseWithMoreWaiting": {pushed: 2, steps: []step{{ack: []int{0}, pushMore: 2}, {ack: []int{1}}}},
		"AfterAFailedAttempt":          {pushed: 2, fail: true, steps: []step{{ack: []int{0}}, {ack: []int{1}}}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			s := newStore(t)
			stats := s.QueryStats()
			lease := func(part string) []queue.Message {
				push(t, s, "q", part, nums(1, c.pushed)...)
				msgs := pop(t, s, queue.PopRequest{Queue: "q", Partition: part, Batch: c.pushed}).Messages
				if c.fail {
					ackAll(t, s, &queue.PopResult{Messages: msgs[:1]}, queue.StatusFailed)
					msgs = pop(t, s, queue.PopRequest{Queue: "q", Partition: part, Batch: c.pushed}).Messages
				}
				require.Len(t, msgs, c.pushed)
				return msgs
			}
			fast, slow := lease("fast"), lease("slow")
			for i, st := range c.steps {
				var fa, sa []queue.Ack
				for _, j := range st.ack {
					fa = append(fa, ackOf(fast[j], queue.StatusCompleted))
					sa = append(sa, ackOf(slow[j], queue.StatusCompleted))
				}
				sa = append(sa, queue.Ack{TransactionID: "none", PartitionID: slow[0].PartitionID})
				before := stats.Snapshot()
				fr, err := s.Ack(ctx, fa)
				require.NoError(t, err)
				assert.EqualValues(t, 1, opsSince(stats, before)["ack_complete"], "step %d", i)
				assert.Zero(t, opsSince(stats, before)["ack_lock"], "step %d", i)
				sr, err := s.Ack(ctx, sa)
				require.NoError(t, err)
				require.Len(t, sr, len(sa))
				assert.Equal(t, queue.ErrTextNotFound, sr[len(sr)-1].Error)
				sr = sr[:len(sr)-1]
				for j := range fr {
					assert.Equal(t, "fast", fr[j].Partition)
					fr[j].Partition, fr[j].TransactionID, fr[j].LeaseID = "", "", ""
					sr[j].Partition, sr[j].TransactionID, sr[j].LeaseID = "", "", ""
				}
				assert.Equal(t, sr, fr, "step %d: the answers", i)
				assert.Equal(t, readConsumerRow(t, s, slow[0].PartitionID), readConsumerRow(t, s, fast[0].PartitionID),
					"step %d: the rows", i)
				if st.pushMore > 0 {
					push(t, s, "q", "fast", nums(1, st.pushMore)...)
					push(t, s, "q", "slow", nums(1, st.pushMore)...)
				}
			}
		})
	}
}

// A completion the one statement cannot take (out of order, a repeat, a
// lease that expired, another lease) is left to the transaction, with
// nothing written by the statement: the answers are the transaction's.
func TestAck_CompletionOutOfTheOrdinaryIsLeftToTheTransaction(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	stats := s.QueryStats()
	push(t, s, "q", "p", nums(1, 3)...)
	msgs := pop(t, s, queue.PopRequest{Queue: "q", Partition: "p", Batch: 3}).Messages
	require.Len(t, msgs, 3)
	ack := func(acks ...queue.Ack) []queue.AckResult {
		t.Helper()
		before := stats.Snapshot()
		res, err := s.Ack(ctx, acks)
		require.NoError(t, err)
		assert.EqualValues(t, 1, opsSince(stats, before)["ack_lock"], "the transaction ran")
		return res
	}

	res := ack(ackOf(msgs[1], queue.StatusCompleted)) // out of order
	assert.True(t, res[0].Success)
	res = ack(ackOf(msgs[1], queue.StatusCompleted)) // a repeat
	assert.True(t, res[0].Success)
	other := ackOf(msgs[0], queue.StatusCompleted)
	other.LeaseID = queue.NewID()
	res = ack(other) // another lease
	assert.Equal(t, queue.ErrTextInvalidLease, res[0].Error)
	res = ack(ackOf(msgs[0], queue.StatusCompleted)) // done above the cursor
	assert.True(t, res[0].Success)
	assert.Equal(t, int64(2), readConsumerRow(t, s, msgs[0].PartitionID).Cursor)

	exec(t, s, `UPDATE consumers SET lease_expires_at = now() - interval '1 second'`)
	res = ack(ackOf(msgs[2], queue.StatusCompleted)) // its lease expired
	assert.Equal(t, queue.ErrTextInvalidLease, res[0].Error)
	assert.Equal(t, int64(2), readConsumerRow(t, s, msgs[0].PartitionID).Cursor)
}
