package queue_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// Completed retention decided which messages every
// group had finished on the snapshot its scan started with. A dead letter
// replayed while it scanned (its message pending for its group again,
// committed after the scan's snapshot but before the scan locked the
// message) was deleted all the same, and the group waited on that offset.
// Retention now locks its victims first and deletes only those still
// finished by every group when it deletes, read after its locks: a replay
// that commits before that is seen; one that comes after waits for the
// lock and finds the message gone (message_gone).
//
// The replay's commit lands in that window deterministically: the retention
// hook runs right after the victims are locked, and there the test commits
// what the replay writes to the group's row (a replay itself would now
// wait for the message's lock). Deciding on the locking statement's
// snapshot, as the single statement did, deletes the message.
func TestRetention_KeepsAMessageReplayedMeanwhile(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	dlqFixture(t, s, 5, 2) // g dead-lettered offset 2; g and h finished the rest
	_, err := s.Configure(ctx, queue.ConfigureRequest{Queue: "q",
		Options: json.RawMessage(`{"retryLimit":0,"completedRetentionSeconds":1}`)})
	require.NoError(t, err)
	age(t, s, "q", 0, 5, 3600)
	var cursor int64
	var done []int64
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT cursor, done FROM consumers WHERE consumer_group = 'g'`).Scan(&cursor, &done))
	require.EqualValues(t, 5, cursor, "g passed the dead-lettered offset")

	var locked []int64
	queue.SetRetentionHook(t, func(step string) {
		if step != "locked" || locked != nil {
			return
		}
		require.NoError(t, s.Pool().QueryRow(ctx, `SELECT array_agg(seq ORDER BY seq) FROM messages
			WHERE seq <> ALL (ARRAY(SELECT seq FROM messages FOR UPDATE SKIP LOCKED))`).Scan(&locked))
		// What ReplayDeadLetters writes for offset 2: g's cursor back
		// before it, the offsets after it done, the dead letter gone.
		exec(t, s, `UPDATE consumers SET cursor = 1, done = '{3,4,5}', delivered_to = 1 WHERE consumer_group = 'g'`)
		exec(t, s, `DELETE FROM dead_letters WHERE consumer_group = 'g'`)
	})
	_, ran, err := s.RunRetention(ctx, 0)
	require.NoError(t, err)
	require.True(t, ran)
	require.Equal(t, []int64{1, 2, 3, 4, 5}, locked, "retention locked every message, offset 2 included")

	var stored []int64
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT coalesce(array_agg(seq ORDER BY seq), '{}') FROM messages`).Scan(&stored))
	require.Equal(t, []int64{2}, stored, "retention deleted the message a replay put back")
	got := pop(t, s, queue.PopRequest{Queue: "q", Group: "g", Batch: 10})
	require.Equal(t, []int{2}, payloads(t, got.Messages), "the replayed message is delivered")
}
