package queue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/queue/queuetest"
)

// An ack finds its message through the unique (partition, transaction id)
// index under the generic plan the pool forces, never by scanning the
// partition: an ack must cost the same on a partition of ten messages and
// of ten million.
func TestPlan_AckResolveUsesTheUniqueIndex(t *testing.T) {
	ctx := context.Background()
	s := queuetest.NewStore(t)
	items := make([]queue.PushItem, 500)
	for i := range items {
		items[i] = queue.PushItem{Queue: "plan", Payload: json.RawMessage(fmt.Sprint(i))}
	}
	res, err := s.Push(ctx, items)
	require.NoError(t, err)
	rows, err := s.Pool().Query(ctx, "EXPLAIN "+queue.AckResolveSQL,
		[]string{res[0].PartitionID, res[1].PartitionID}, []string{res[0].TransactionID, res[1].TransactionID})
	require.NoError(t, err)
	var plan []string
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan = append(plan, line)
	}
	require.NoError(t, rows.Err())
	text := strings.Join(plan, "\n")
	assert.Contains(t, text, "messages_partition_id_transaction_id_key", text)
	assert.NotContains(t, text, "Join Filter: (m.transaction_id", text)
}

// A warm push costs its own statements only: no queue, partition or config
// lookup (the partition id cache answers).
func TestWarmPushIssuesNoLookup(t *testing.T) {
	ctx := context.Background()
	s := queuetest.NewStore(t)
	stats := s.QueryStats()
	require.NotNil(t, stats)
	total := func(m map[string]uint64) (n uint64) {
		for _, v := range m {
			n += v
		}
		return n
	}
	start := stats.Snapshot()
	_, err := s.Push(ctx, []queue.PushItem{{Queue: "warm", Partition: "p", Payload: json.RawMessage(`1`)}})
	require.NoError(t, err)
	before := stats.Snapshot()
	cold := total(before) - total(start)
	t.Logf("cold push: %d statements; warm push: 2", cold)
	assert.GreaterOrEqual(t, cold, uint64(4), "a cold push looks up (and creates) its queue and partition")
	for i := range 20 {
		_, err := s.Push(ctx, []queue.PushItem{{Queue: "warm", Partition: "p", Payload: json.RawMessage(fmt.Sprint(i))}})
		require.NoError(t, err)
	}
	// One round trip each, the two statements in the pipeline's own
	// transaction (no BEGIN or COMMIT statement); no consumer row lags
	// with messages pending, so no ready marking after the commit.
	assert.Equal(t, map[string]uint64{"push_lock": 20, "push_insert_lean": 20},
		opsSince(stats, before))

	// A new partition of a queue whose config is cached: no statement to
	// create the queue.
	before = stats.Snapshot()
	_, err = s.Push(ctx, []queue.PushItem{{Queue: "warm", Partition: "p2", Payload: json.RawMessage(`1`)}})
	require.NoError(t, err)
	assert.Equal(t, map[string]uint64{"lock_queues": 1, "create_partitions": 1, "resolve_partitions": 1, "push_lock": 1,
		"push_insert_lean": 1},
		opsSince(stats, before))
}

// opsSince is what each op ran since before.
func opsSince(stats *queue.QueryStats, before map[string]uint64) map[string]uint64 {
	ops := map[string]uint64{}
	for op, n := range stats.Snapshot() {
		if d := n - before[op]; d > 0 {
			ops[op] = d
		}
	}
	return ops
}

// pushOps is what each push statement (push_*) ran during f.
func pushOps(stats *queue.QueryStats, f func()) map[string]uint64 {
	before := stats.Snapshot()
	f()
	ops := map[string]uint64{}
	for op, n := range opsSince(stats, before) {
		if strings.HasPrefix(op, "push_") {
			ops[op] = n
		}
	}
	return ops
}

// reserveNone is a HandOff with nobody waiting.
type reserveNone struct{}

func (reserveNone) Reserve([]queue.PushedPartition) []queue.Reservation { return nil }
func (reserveNone) Settle(queue.Reservation, *queue.PopResult)          {}

// A push that reserves nobody (no HandOff: an instance with producers and
// no consumers; a HandOff with nobody waiting; a transaction's push) sends
// the push statement without the hand-off's steps (push_insert_lean): with
// no reservation they lease, extend or renew nothing. A push with a
// reservation naming no lease to extend sends the statement that leases
// to it (push_insert_lease).
func TestPush_OnlyAPushWithAReservationSendsTheHandOffSteps(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	stats := s.QueryStats()
	first := push(t, s, "lean", "", nums(1, 1)...)
	lean := map[string]uint64{"push_lock": 1, "push_insert_lean": 1}

	t.Run("NoHandOff", func(t *testing.T) {
		assert.Equal(t, lean, pushOps(stats, func() { push(t, s, "lean", "", nums(2, 2)...) }))
	})
	t.Run("NobodyReserved", func(t *testing.T) {
		s.SetHandOff(reserveNone{})
		defer s.SetHandOff(nil)
		assert.Equal(t, lean, pushOps(stats, func() { push(t, s, "lean", "", nums(3, 3)...) }))
	})
	t.Run("Transaction", func(t *testing.T) {
		s.SetHandOff(&handTo{})
		defer s.SetHandOff(nil)
		assert.Equal(t, lean, pushOps(stats, func() {
			res, err := s.Transaction(ctx, []queue.TxOp{{Type: "push", Items: []queue.PushItem{{Queue: "lean",
				Payload: json.RawMessage(`{"n":4}`)}}}}, nil, "")
			require.NoError(t, err)
			require.True(t, res.Success)
		}))
	})
	t.Run("Reserved", func(t *testing.T) {
		res := pop(t, s, queue.PopRequest{Queue: "lean", Batch: 10})
		require.Equal(t, []int{1, 2, 3, 4}, payloads(t, res.Messages))
		ackAll(t, s, res, queue.StatusCompleted)
		h := &handTo{}
		s.SetHandOff(h)
		defer s.SetHandOff(nil)
		assert.Equal(t, map[string]uint64{"push_lock": 1, "push_insert_lease": 1},
			pushOps(stats, func() { push(t, s, "lean", "", nums(5, 5)...) }))
		h.mu.Lock()
		defer h.mu.Unlock()
		require.Len(t, h.got, 1, "the caught-up group was handed the push")
		assert.Equal(t, []int{5}, payloads(t, h.got[0].Messages))
		assert.Equal(t, first[0].PartitionID, h.got[0].PartitionID)
	})
}
