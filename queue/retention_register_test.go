package queue_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// A group registered while completed retention deleted a
// message from the middle of a partition, between retention's delete and
// its commit: the delete could not see the new group (so it took a message
// the group had not finished), and the registration's snapshot still saw
// the message (so it did not count its offset as finished). The group
// ended with cursor 1, done [3] and a lag of 1 forever; a seek back over
// the offset likewise. Retention now share-locks the queues it deletes
// from before it deletes, which a registration's (and a seek's) queue lock
// waits for: they run before it or after it, never across.
func TestRegister_WaitsForCompletedRetention(t *testing.T) {
	t.Run("Register", func(t *testing.T) {
		groupActAcrossRetention(t, "late", "herald:groups_lock", func(s *queue.Store) error {
			return s.EnsureConsumers(ctxT(t), []queue.Target{{Queue: "cr", Group: "late"}})
		})
	})
	// A seek back to the beginning (a group reset alike) places g's
	// cursor from the messages and holes it reads, as a registration does.
	t.Run("Seek", func(t *testing.T) {
		groupActAcrossRetention(t, "g", "herald:group_queues_lock", func(s *queue.Store) error {
			_, err := s.Seek(ctxT(t), "g", "cr", "", new(time.Time))
			return err
		})
	})
}

// groupActAcrossRetention runs act (which places group's cursors; marker
// names its first statement) while completed retention holds its delete
// of offset 2 of queue "cr" open, and checks that act waited for it and
// that group then waits for no deleted offset.
func groupActAcrossRetention(t *testing.T, group, marker string, act func(*queue.Store) error) {
	ctx := ctxT(t)
	s := newStore(t)
	completedRetentionReady(t, s)

	actDone := make(chan error, 1)
	var ranAcross bool
	queue.SetRetentionHook(t, func(step string) {
		if step != "deleted" {
			return
		}
		go func() { actDone <- act(s) }()
		// Hold the delete open until the act has either finished across
		// it (the bug) or is seen waiting for a lock.
		require.Eventually(t, func() bool {
			select {
			case err := <-actDone:
				actDone <- err
				ranAcross = true
				return true
			default:
			}
			var n int
			require.NoError(t, s.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND query LIKE '%'||$1||'%'`, marker).Scan(&n))
			return n > 0
		}, 10*time.Second, time.Millisecond, "the act neither finished nor waited")
	})
	_, ran, err := s.RunRetention(ctx, 0)
	require.NoError(t, err)
	require.True(t, ran)
	select {
	case err := <-actDone:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the act did not finish after retention")
	}
	assert.False(t, ranAcross, "the act ran across retention's delete")
	var left int
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT count(*) FROM messages`).Scan(&left))
	require.Equal(t, 2, left, "offset 2, finished out of order, is gone")

	res := pop(t, s, queue.PopRequest{Queue: "cr", Group: group, Batch: 10})
	assert.Equal(t, []int{1, 3}, payloads(t, res.Messages))
	for _, r := range ackAll(t, s, res, queue.StatusCompleted) {
		require.True(t, r.Success, r.Error)
	}
	lags, _, err := s.GroupPartitions(ctx, group, "cr")
	require.NoError(t, err)
	require.Len(t, lags, 1)
	assert.Zero(t, lags[0].OffsetLag, "the group waits for no deleted offset")
	push(t, s, "cr", "", nums(4, 4)...)
	res = pop(t, s, queue.PopRequest{Queue: "cr", Group: group, Batch: 10, AutoAck: true})
	assert.Equal(t, []int{4}, payloads(t, res.Messages), "not waiting for offset 2")
}

// completedRetentionReady leaves queue "cr" with offsets 1 to 3, all old,
// group g having finished offset 2 only (out of order) and no live lease:
// completed retention's next run deletes offset 2 alone.
func completedRetentionReady(t *testing.T, s *queue.Store) {
	t.Helper()
	ctx := ctxT(t)
	_, err := s.Configure(ctx, queue.ConfigureRequest{Queue: "cr", Options: []byte(`{"completedRetentionSeconds":1}`)})
	require.NoError(t, err)
	push(t, s, "cr", "", nums(1, 3)...)
	res := pop(t, s, queue.PopRequest{Queue: "cr", Group: "g", Batch: 3})
	require.Len(t, res.Messages, 3)
	m2 := res.Messages[1]
	out, err := s.Ack(ctx, []queue.Ack{{TransactionID: m2.TransactionID, PartitionID: m2.PartitionID, LeaseID: m2.LeaseID, Group: "g"}})
	require.NoError(t, err)
	require.True(t, out[0].Success)
	age(t, s, "cr", 1, 3, 120)
	exec(t, s, `UPDATE consumers SET lease_expires_at = now() - interval '1 second' WHERE lease_id IS NOT NULL`)
}
