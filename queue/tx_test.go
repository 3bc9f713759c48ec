package queue_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// A transaction whose push is refused by a queue's maxSize rolls
// back as a whole (the ack before it too), reports which push was refused,
// and pushes of earlier operations of the same transaction count towards
// the limit.
func TestTransaction_MaxSizeRefusalIsAllOrNothing(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	_, err := s.Configure(ctx, queue.ConfigureRequest{Queue: "full", Options: json.RawMessage(`{"maxSize":2}`)})
	require.NoError(t, err)
	push(t, s, "src", "", nums(1, 1)...)
	src := pop(t, s, queue.PopRequest{Queue: "src"})
	require.Len(t, src.Messages, 1)
	m := src.Messages[0]
	push(t, s, "full", "", nums(1, 1)...) // one place left

	res, err := s.Transaction(ctx, []queue.TxOp{
		{Type: "ack", Ack: queue.Ack{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID}},
		{Type: "push", Items: []queue.PushItem{{Queue: "other", Payload: json.RawMessage(`{"n":7}`)}}},
		{Type: "push", Items: []queue.PushItem{
			{Queue: "full", Payload: json.RawMessage(`{"n":2}`)},
			{Queue: "full", Payload: json.RawMessage(`{"n":3}`), TransactionID: "refused"},
			{Queue: "full", Payload: json.RawMessage(`{"n":4}`)},
		}},
	}, nil, "")
	require.NoError(t, err)
	assert.False(t, res.Success, "a refused push fails the transaction")
	assert.Equal(t, "PUSH operation failed: queue full is full: it holds its maxSize of 2 messages", res.Error)
	require.NotEmpty(t, res.Results)
	last := res.Results[len(res.Results)-1]
	require.NotNil(t, last.Push, "the results end with the refused push")
	assert.Equal(t, queue.StatusRejected, last.Push.Status)
	assert.Equal(t, "refused", last.Push.TransactionID)
	assert.Equal(t, 3, last.Index, "ack 0, push 1, push 2, the refused push 3")

	// Nothing was committed: the ack, the push to another queue and the
	// push that still fitted are all rolled back.
	assert.Equal(t, []int{1}, payloads(t, pop(t, s, queue.PopRequest{Queue: "full", Batch: 10}).Messages))
	assert.Empty(t, pop(t, s, queue.PopRequest{Queue: "other"}).Messages)
	exec(t, s, `UPDATE consumers SET lease_expires_at = now() - interval '1 second'`)
	again := pop(t, s, queue.PopRequest{Queue: "src"})
	require.Len(t, again.Messages, 1, "the ack was rolled back")
	assert.Equal(t, m.ID, again.Messages[0].ID)

	// Two push operations of one transaction share the queue's room: the
	// first takes the last place, the second is refused.
	res, err = s.Transaction(ctx, []queue.TxOp{
		{Type: "push", Items: []queue.PushItem{{Queue: "full", Payload: json.RawMessage(`{"n":5}`)}}},
		{Type: "push", Items: []queue.PushItem{{Queue: "full", Payload: json.RawMessage(`{"n":6}`)}}},
	}, nil, "")
	require.NoError(t, err)
	assert.False(t, res.Success, "the second push exceeds maxSize")
	require.Len(t, res.Results, 2)
	assert.Equal(t, queue.StatusRejected, res.Results[1].Push.Status)
	assert.Equal(t, []int{1}, payloads(t, pop(t, s, queue.PopRequest{Queue: "full", Batch: 10, Group: "g"}).Messages))

	// Within the limit it commits.
	res, err = s.Transaction(ctx, []queue.TxOp{
		{Type: "push", Items: []queue.PushItem{{Queue: "full", Payload: json.RawMessage(`{"n":8}`)}}},
	}, nil, "")
	require.NoError(t, err)
	assert.True(t, res.Success, res.Error)
}

// Every result of a transaction carries its own index, counting
// each pushed item as one operation as the reference server does (it
// flattens push items): results[i].Index == i.
func TestTransaction_ResultsCarryTheirIndex(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	push(t, s, "src", "", nums(1, 1)...)
	src := pop(t, s, queue.PopRequest{Queue: "src"})
	require.Len(t, src.Messages, 1)
	m := src.Messages[0]

	res, err := s.Transaction(ctx, []queue.TxOp{
		{Type: "push", Items: []queue.PushItem{
			{Queue: "dst", Payload: json.RawMessage(`{"n":1}`)},
			{Queue: "dst", Payload: json.RawMessage(`{"n":2}`)},
			{Queue: "dst", Payload: json.RawMessage(`{"n":3}`)},
		}},
		{Type: "ack", Ack: queue.Ack{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID}},
		{Type: "push", Items: []queue.PushItem{
			{Queue: "dst", Payload: json.RawMessage(`{"n":4}`)},
			{Queue: "dst", Payload: json.RawMessage(`{"n":5}`)},
		}},
	}, []string{src.LeaseID}, "")
	require.NoError(t, err)
	require.True(t, res.Success, res.Error)
	require.Len(t, res.Results, 6)
	types := make([]string, len(res.Results))
	for i, r := range res.Results {
		assert.Equal(t, i, r.Index, "result %d", i)
		types[i] = r.Type
	}
	assert.Equal(t, []string{"push", "push", "push", "ack", "push", "push"}, types)
	seen := map[string]bool{}
	for _, r := range res.Results {
		if r.Push != nil {
			assert.False(t, seen[r.Push.MessageID], "one message per push result")
			seen[r.Push.MessageID] = true
		}
	}
	assert.Equal(t, ints(1, 5), payloads(t, pop(t, s, queue.PopRequest{Queue: "dst", Batch: 10}).Messages))
}
