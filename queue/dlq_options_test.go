package queue_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// What a queue's deadLetterQueue and dlqAfterMaxRetries do: a message a
// group gives up on is kept as a dead letter, or dropped (finished for the
// group, no copy kept, counted as dropped).

func configure(t *testing.T, s *queue.Store, q, options string) {
	t.Helper()
	_, err := s.Configure(ctxT(t), queue.ConfigureRequest{Queue: q, Options: json.RawMessage(options)})
	require.NoError(t, err)
}

func deadLetterTotal(t *testing.T, s *queue.Store, q string) int64 {
	t.Helper()
	page, err := s.DLQ(ctxT(t), queue.DLQQuery{Queue: q})
	require.NoError(t, err)
	return page.Total
}

func ackOne(t *testing.T, s *queue.Store, m queue.Message, status queue.AckStatus) queue.AckResult {
	t.Helper()
	out, err := s.Ack(ctxT(t), []queue.Ack{{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID,
		Status: status, Error: "boom"}})
	require.NoError(t, err)
	require.Len(t, out, 1)
	require.True(t, out[0].Success, "%+v", out[0])
	return out[0]
}

// dlqAfterMaxRetries false: a message failed past retryLimit is dropped,
// and the group goes on with the next one; an ack with status dlq still
// dead-letters (the queue has a dead-letter queue).
func TestAck_FailedPastRetryLimitWithoutDLQAfterMaxRetriesIsDropped(t *testing.T) {
	s := newStore(t)
	configure(t, s, "q", `{"retryLimit":0,"deadLetterQueue":true,"dlqAfterMaxRetries":false}`)
	push(t, s, "q", "", nums(1, 3)...)

	res := pop(t, s, queue.PopRequest{Queue: "q"})
	require.Equal(t, []int{1}, payloads(t, res.Messages))
	r := ackOne(t, s, res.Messages[0], queue.StatusFailed)
	assert.False(t, r.DLQ, "not dead-lettered")
	assert.True(t, r.Dropped)
	assert.Zero(t, deadLetterTotal(t, s, "q"))

	res = pop(t, s, queue.PopRequest{Queue: "q"})
	require.Equal(t, []int{2}, payloads(t, res.Messages), "1 is finished for the group")
	r = ackOne(t, s, res.Messages[0], queue.StatusDLQ)
	assert.True(t, r.DLQ, "an explicit dlq ack keeps its dead letter")
	assert.False(t, r.Dropped)
	assert.EqualValues(t, 1, deadLetterTotal(t, s, "q"))
}

// deadLetterQueue false: nothing of the queue is dead-lettered, neither a
// message failed past retryLimit nor one acked dlq; both are finished for
// the group.
func TestAck_WithoutDeadLetterQueueEveryGivenUpMessageIsDropped(t *testing.T) {
	s := newStore(t)
	configure(t, s, "q", `{"retryLimit":0,"deadLetterQueue":false,"dlqAfterMaxRetries":true}`)
	push(t, s, "q", "", nums(1, 3)...)
	for _, status := range []queue.AckStatus{queue.StatusFailed, queue.StatusDLQ} {
		res := pop(t, s, queue.PopRequest{Queue: "q"})
		require.Len(t, res.Messages, 1)
		r := ackOne(t, s, res.Messages[0], status)
		assert.False(t, r.DLQ, string(status))
		assert.True(t, r.Dropped, string(status))
	}
	assert.Zero(t, deadLetterTotal(t, s, "q"))
	assert.Equal(t, []int{3}, payloads(t, pop(t, s, queue.PopRequest{Queue: "q", Batch: 10}).Messages))
}

// A lease that expires past retryLimit on a queue with dlqAfterMaxRetries
// false: the next pop drops the message (counted in Dropped, not in
// DeadLettered) and delivers the one after it.
func TestLease_ExpiredPastRetryLimitWithoutDLQAfterMaxRetriesIsDropped(t *testing.T) {
	s := newStore(t)
	configure(t, s, "q", `{"retryLimit":0,"dlqAfterMaxRetries":false}`)
	push(t, s, "q", "", nums(1, 2)...)
	require.Equal(t, []int{1}, payloads(t, pop(t, s, queue.PopRequest{Queue: "q"}).Messages))
	exec(t, s, `UPDATE consumers SET lease_expires_at = now() - interval '1 second' WHERE lease_id IS NOT NULL`)

	res := pop(t, s, queue.PopRequest{Queue: "q"})
	assert.Equal(t, []int{2}, payloads(t, res.Messages))
	assert.Equal(t, map[string]int{"q": 1}, res.Dropped)
	assert.Empty(t, res.DeadLettered)
	assert.Zero(t, deadLetterTotal(t, s, "q"))
}

// A replay settles the group's expired lease first, as its next pop would:
// past retryLimit on a queue that keeps no dead letter of it, the lease's
// message is dropped, and the replay counts it (Dropped), as it counts one
// it dead-letters (DeadLettered).
func TestDLQReplay_ExpiredLeaseItSettlesIsDroppedAndCounted(t *testing.T) {
	s := newStore(t)
	dlqFixture(t, s, 2, 1)
	dl := deadLetters(t, s, "g")
	require.Len(t, dl, 1)
	exec(t, s, `UPDATE queues SET dlq_after_max_retries = false WHERE name = 'q'`)
	push(t, s, "q", "", nums(3, 3)...)
	require.Equal(t, []int{3}, payloads(t, pop(t, s, queue.PopRequest{Queue: "q", Group: "g"}).Messages))
	exec(t, s, `UPDATE consumers SET lease_expires_at = now() - interval '1 second' WHERE consumer_group = 'g'`)

	res, err := s.ReplayDeadLetters(ctxT(t), queue.DLQSelection{IDs: rowIDs(t, dl[1])})
	require.NoError(t, err)
	require.Len(t, res.Items, 1)
	assert.Equal(t, queue.DLQReplayed, res.Items[0].Status)
	assert.Empty(t, res.DeadLettered)
	assert.Equal(t, map[string]int{"q": 1}, res.Dropped, "the expired lease's message, dropped")
	assert.Empty(t, deadLetters(t, s, "g"), "no dead letter kept of it")
}

// The defaults keep every message given up on: a queue created by a push
// (the column defaults) and one configured with nothing dead-letter a
// message failed past retryLimit, and a lease expired past it, as before
// the options were honoured.
func TestConfigure_DefaultsDeadLetterAndNeverExpire(t *testing.T) {
	s := newStore(t)
	d := queue.DefaultOptions()
	assert.True(t, d.DeadLetterQueue)
	assert.True(t, d.DLQAfterMaxRetries)
	assert.Zero(t, d.TTL, "no expiry")

	push(t, s, "pushed", "", nums(1, 1)...)
	keep, after, ttl := storedOptions(t, s, "pushed")
	assert.True(t, keep)
	assert.True(t, after)
	assert.Zero(t, ttl)

	res, err := s.Configure(ctxT(t), queue.ConfigureRequest{Queue: "configured", Options: json.RawMessage(`{"retryLimit":0}`)})
	require.NoError(t, err)
	assert.True(t, res.Options.DeadLetterQueue)
	assert.True(t, res.Options.DLQAfterMaxRetries)
	assert.Zero(t, res.Options.TTL)
	push(t, s, "configured", "", nums(1, 2)...)
	m := pop(t, s, queue.PopRequest{Queue: "configured"}).Messages
	require.Len(t, m, 1)
	assert.True(t, ackOne(t, s, m[0], queue.StatusFailed).DLQ)
	require.Len(t, pop(t, s, queue.PopRequest{Queue: "configured"}).Messages, 1)
	exec(t, s, `UPDATE consumers SET lease_expires_at = now() - interval '1 second' WHERE lease_id IS NOT NULL`)
	assert.Equal(t, map[string]int{"configured": 1}, pop(t, s, queue.PopRequest{Queue: "configured"}).DeadLettered)
	assert.EqualValues(t, 2, deadLetterTotal(t, s, "configured"))
}

// The upgrade keeps every existing queue's behaviour: the stored
// deadLetterQueue and dlqAfterMaxRetries (false by the old default, and
// inert) become true, and a stored ttl (3600 by the old default, never
// applied) becomes 0, so nothing starts being dropped or expired.
func TestMigrate_ExistingQueuesKeepDeadLetteringAndNoExpiry(t *testing.T) {
	s := newStore(t)
	push(t, s, "old", "", nums(1, 1)...)
	exec(t, s, `UPDATE queues SET dead_letter_queue = false, dlq_after_max_retries = false, ttl = 86400`)
	migs, err := queue.Migrations()
	require.NoError(t, err)
	var sql string
	for _, m := range migs {
		if m.Version == 20 {
			sql = m.SQL
		}
	}
	require.NotEmpty(t, sql, "migration 20")
	_, err = s.Pool().Exec(context.Background(), sql)
	require.NoError(t, err)
	keep, after, ttl := storedOptions(t, s, "old")
	assert.True(t, keep)
	assert.True(t, after)
	assert.Zero(t, ttl)
}

// storedOptions are the dead-letter options and ttl of queue name as its
// row holds them.
func storedOptions(t *testing.T, s *queue.Store, name string) (keep, after bool, ttl int) {
	t.Helper()
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT dead_letter_queue, dlq_after_max_retries, ttl FROM queues
		WHERE name = $1`, name).Scan(&keep, &after, &ttl))
	return keep, after, ttl
}
