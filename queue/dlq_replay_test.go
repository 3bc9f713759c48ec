package queue_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// A replay that settles an expired lease first can leave the group's row
// caught up with messages after its cursor: the expired lease's last
// attempt dead-letters its first message (retry limit 0) and the cursor
// passes it, beyond the row's copy of last_offset (a push left the row
// alone: the group was behind). The row is marked after the replay's
// commit, so a waiting consumer gets the replayed message at once, not
// after the hygiene loop's repair.
func TestDLQReplay_WaitingConsumerIsServedAtOnce(t *testing.T) {
	s := newStore(t)
	const q, g = "replay-wait", "g"
	_, err := s.Configure(ctxT(t), queue.ConfigureRequest{Queue: q, Options: optsJSON(func(o *queue.Options) { o.RetryLimit = 0 })})
	require.NoError(t, err)
	assert.Empty(t, pop(t, s, queue.PopRequest{Queue: q, Group: g}).Messages) // registers g
	push(t, s, q, "", nums(1, 1)...)
	push(t, s, q, "", nums(2, 2)...) // g is behind: its row keeps the copy 1
	res := pop(t, s, queue.PopRequest{Queue: q, Group: g, Batch: 2})
	require.Equal(t, []int{1, 2}, payloads(t, res.Messages))
	m2 := res.Messages[1]
	out, err := s.Ack(ctxT(t), []queue.Ack{{TransactionID: m2.TransactionID, PartitionID: m2.PartitionID,
		LeaseID: m2.LeaseID, Group: g, Status: queue.StatusDLQ}})
	require.NoError(t, err)
	require.True(t, out[0].Success, out[0].Error)
	require.False(t, out[0].LeaseReleased, "message 1 is still leased")
	exec(t, s, `UPDATE consumers SET lease_expires_at = now() - interval '1 second' WHERE consumer_group = $1`, g)

	page, err := s.DLQ(ctxT(t), queue.DLQQuery{Queue: q, Group: g})
	require.NoError(t, err)
	require.Len(t, page.Messages, 1)
	replayed, err := s.ReplayDeadLetters(ctxT(t), queue.DLQSelection{IDs: rowIDs(t, page.Messages[0].RowID)})
	require.NoError(t, err)
	require.Equal(t, queue.DLQReplayed, replayed.Items[0].Status, replayed.Items[0].Reason)
	assert.Equal(t, map[string]int{q: 1}, replayed.DeadLettered, "the expired lease's last attempt dead-lettered message 1")

	got := pop(t, s, queue.PopRequest{Queue: q, Group: g, Batch: 10})
	assert.Equal(t, []int{2}, payloads(t, got.Messages), "the replayed message is served at once")
}
