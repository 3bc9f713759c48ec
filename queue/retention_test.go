package queue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

func pushN(t *testing.T, s *queue.Store, q string, n int) {
	t.Helper()
	var items []queue.PushItem
	for i := range n {
		items = append(items, queue.PushItem{Queue: q, Payload: json.RawMessage(fmt.Sprint(i))})
	}
	_, err := s.Push(context.Background(), items)
	require.NoError(t, err)
}

// age moves messages of q with offsets in [from, to] back in time (instead
// of sleeping).
func age(t *testing.T, s *queue.Store, q string, from, to int, secs int) {
	t.Helper()
	_, err := s.Pool().Exec(context.Background(), `UPDATE messages m SET created_at = m.created_at - make_interval(secs => $4)
		FROM partitions p JOIN queues q ON q.id = p.queue_id
		WHERE p.id = m.partition_id AND q.name = $1 AND m.seq BETWEEN $2 AND $3`, q, from, to, secs)
	require.NoError(t, err)
}

func deletedBy(d []queue.RetentionDeleted, q, reason string) int64 {
	for _, x := range d {
		if x.Queue == q && x.Reason == reason {
			return x.N
		}
	}
	return 0
}

// retentionSeconds deletes what is older, consumed or not; a group that had
// not reached it moves on, so nothing waits for what is gone; a leased
// message stays until its lease ends.
func TestRetention_Age(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	_, err := s.Configure(ctx, queue.ConfigureRequest{Queue: "ra",
		Options: json.RawMessage(`{"retentionEnabled":true,"retentionSeconds":60}`)})
	require.NoError(t, err)
	pushN(t, s, "ra", 6)
	// Group "lease" holds offset 1 under a live lease.
	res, err := s.Pop(ctx, queue.PopRequest{Queue: "ra", Group: "lease", Batch: 1})
	require.NoError(t, err)
	require.Len(t, res.Messages, 1)
	age(t, s, "ra", 1, 4, 120)

	deleted, ran, err := s.RunRetention(ctx, 2) // batches of 2: the loop goes on until a short one
	require.NoError(t, err)
	require.True(t, ran)
	assert.EqualValues(t, 3, deletedBy(deleted, "ra", queue.RetentionAge), "offsets 2–4; 1 is leased, 5–6 are young")

	// Queue mode never read it: it gets what is left, from offset 5.
	res, err = s.Pop(ctx, queue.PopRequest{Queue: "ra", Batch: 10, AutoAck: true})
	require.NoError(t, err)
	var got []int64
	for _, m := range res.Messages {
		got = append(got, m.Offset)
	}
	assert.Equal(t, []int64{1, 5, 6}, got, "the leased message is kept (another group holds it), 2–4 are gone")
}

// completedRetentionSeconds deletes what every group acknowledged; a
// message acked by one group but not the other is kept.
func TestRetention_Completed(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	_, err := s.Configure(ctx, queue.ConfigureRequest{Queue: "rc", Options: json.RawMessage(`{"completedRetentionSeconds":60}`)})
	require.NoError(t, err)
	pushN(t, s, "rc", 4)
	for _, g := range []struct {
		name  string
		batch int
	}{{"g1", 4}, {"g2", 2}} {
		res, err := s.Pop(ctx, queue.PopRequest{Queue: "rc", Group: g.name, Batch: g.batch, AutoAck: true})
		require.NoError(t, err)
		require.Len(t, res.Messages, g.batch)
	}
	age(t, s, "rc", 1, 4, 120)
	deleted, ran, err := s.RunRetention(ctx, 0)
	require.NoError(t, err)
	require.True(t, ran)
	assert.EqualValues(t, 2, deletedBy(deleted, "rc", queue.RetentionCompleted), "only 1–2: g2 has not done 3–4")

	res, err := s.Pop(ctx, queue.PopRequest{Queue: "rc", Group: "g2", Batch: 10, AutoAck: true})
	require.NoError(t, err)
	require.Len(t, res.Messages, 2, "g2 still gets 3 and 4")
	assert.EqualValues(t, 3, res.Messages[0].Offset)

	// Now g2 has done 3–4 too (and both have done the young 5): 3–4 go,
	// 5 stays until it is old.
	pushN(t, s, "rc", 1)
	for _, g := range []string{"g1", "g2"} {
		_, err = s.Pop(ctx, queue.PopRequest{Queue: "rc", Group: g, Batch: 10, AutoAck: true})
		require.NoError(t, err)
	}
	deleted, _, err = s.RunRetention(ctx, 0)
	require.NoError(t, err)
	assert.EqualValues(t, 2, deletedBy(deleted, "rc", queue.RetentionCompleted))
	var left []int64
	rows, err := s.Pool().Query(ctx, `SELECT m.seq FROM messages m JOIN partitions p ON p.id = m.partition_id
		JOIN queues q ON q.id = p.queue_id WHERE q.name = 'rc' ORDER BY 1`)
	require.NoError(t, err)
	for rows.Next() {
		var seq int64
		require.NoError(t, rows.Scan(&seq))
		left = append(left, seq)
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, []int64{5}, left)
}

// Two instances never run retention at once: while one holds the lock,
// the other's run is skipped.
func TestRetention_OneAtATime(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	conn, err := s.Pool().Acquire(ctx)
	require.NoError(t, err)
	var got bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtext('herald_retention:' || current_schema()))`).Scan(&got))
	require.True(t, got)
	_, ran, err := s.RunRetention(ctx, 0)
	require.NoError(t, err)
	assert.False(t, ran, "another instance holds the lock")
	_, err = conn.Exec(ctx, `SELECT pg_advisory_unlock(hashtext('herald_retention:' || current_schema()))`)
	require.NoError(t, err)
	conn.Release()
	_, ran, err = s.RunRetention(ctx, 0)
	require.NoError(t, err)
	assert.True(t, ran)
}

// maxSize: a push beyond the queue's limit is refused per item; what fits
// is stored; retention making room lets pushes in again.
func TestMaxSize(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	_, err := s.Configure(ctx, queue.ConfigureRequest{Queue: "full",
		Options: json.RawMessage(`{"maxSize":3,"retentionEnabled":true,"retentionSeconds":60}`)})
	require.NoError(t, err)
	var items []queue.PushItem
	for i := range 5 {
		items = append(items, queue.PushItem{Queue: "full", Partition: fmt.Sprintf("p%d", i%2), Payload: json.RawMessage(fmt.Sprint(i))})
	}
	res, err := s.Push(ctx, items)
	require.NoError(t, err)
	var statuses []queue.PushStatus
	for _, r := range res {
		statuses = append(statuses, r.Status)
	}
	assert.Equal(t, []queue.PushStatus{queue.StatusQueued, queue.StatusQueued, queue.StatusQueued,
		queue.StatusRejected, queue.StatusRejected}, statuses)
	assert.Contains(t, res[4].Error, "maxSize of 3")
	assert.Empty(t, res[4].MessageID)

	res, err = s.Push(ctx, []queue.PushItem{{Queue: "full", Payload: json.RawMessage(`9`)}})
	require.NoError(t, err)
	assert.Equal(t, queue.StatusRejected, res[0].Status, "still full")

	age(t, s, "full", 1, 10, 120)
	_, _, err = s.RunRetention(ctx, 0)
	require.NoError(t, err)
	res, err = s.Push(ctx, []queue.PushItem{{Queue: "full", Payload: json.RawMessage(`10`)}})
	require.NoError(t, err)
	assert.Equal(t, queue.StatusQueued, res[0].Status, "retention made room")
}

// Empty partitions idle past the cleanup age are deleted, their peers told
// (OnPartitionDeleted) and their cached ids dropped; a later push to the
// same name works. A partition with a dead letter, or recent activity, stays.
func TestRetention_PartitionCleanup(t *testing.T) {
	ctx := ctxT(t)
	base := newStore(t)
	var told []string
	s, err := queue.New(queue.Config{Pool: base.Pool(), PartitionCleanupAfter: time.Hour,
		OnPartitionDeleted: func(q, p string) { told = append(told, q+"/"+p) }})
	require.NoError(t, err)
	for _, p := range []string{"idle", "busy", "dlq"} {
		_, err := s.Push(ctx, []queue.PushItem{{Queue: "pc", Partition: p, Payload: json.RawMessage(`1`)}})
		require.NoError(t, err)
	}
	// idle: consumed and its message gone; dlq: its message dead-lettered.
	for _, p := range []string{"idle", "dlq"} {
		res, err := s.Pop(ctx, queue.PopRequest{Queue: "pc", Partition: p, Batch: 1})
		require.NoError(t, err)
		require.Len(t, res.Messages, 1)
		status := queue.StatusCompleted
		if p == "dlq" {
			status = queue.StatusDLQ
		}
		_, err = s.Ack(ctx, []queue.Ack{{TransactionID: res.Messages[0].TransactionID, PartitionID: res.PartitionID,
			LeaseID: res.LeaseID, Status: status}})
		require.NoError(t, err)
	}
	_, err = s.Pool().Exec(ctx, `DELETE FROM messages m USING partitions p WHERE p.id = m.partition_id AND p.name IN ('idle', 'dlq')`)
	require.NoError(t, err)
	_, err = s.Pool().Exec(ctx, `UPDATE partitions SET last_push_at = now() - interval '2 hours', created_at = now() - interval '2 hours'`)
	require.NoError(t, err)
	_, err = s.Pool().Exec(ctx, `UPDATE consumers SET leased_at = now() - interval '2 hours'`)
	require.NoError(t, err)
	_, err = s.Pool().Exec(ctx, `UPDATE partitions SET last_push_at = now() WHERE name = 'busy'`)
	require.NoError(t, err)

	deleted, ran, err := s.RunRetention(ctx, 0)
	require.NoError(t, err)
	require.True(t, ran)
	assert.EqualValues(t, 1, deletedBy(deleted, "pc", queue.RetentionPartition))
	assert.Equal(t, []string{"pc/idle"}, told, "only the empty, idle one without dead letters")

	res, err := s.Push(ctx, []queue.PushItem{{Queue: "pc", Partition: "idle", Payload: json.RawMessage(`2`)}})
	require.NoError(t, err)
	assert.Equal(t, queue.StatusQueued, res[0].Status, "the name is created again")
	pop, err := s.Pop(ctx, queue.PopRequest{Queue: "pc", Partition: "idle", Batch: 10, AutoAck: true})
	require.NoError(t, err)
	require.Len(t, pop.Messages, 1)
	assert.JSONEq(t, `2`, string(pop.Messages[0].Data))
}

// maxWaitTimeSeconds: what a group has not consumed in time goes to its DLQ
// with the reason, is not delivered to it any more, and the group goes on;
// another group under a live lease is left alone.
func TestRetention_MaxWait(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	_, err := s.Configure(ctx, queue.ConfigureRequest{Queue: "mw", Options: json.RawMessage(`{"maxWaitTimeSeconds":60}`)})
	require.NoError(t, err)
	pushN(t, s, "mw", 1)
	for _, g := range []string{"slow", "busy"} {
		res, err := s.Pop(ctx, queue.PopRequest{Queue: "mw", Group: g, Batch: 1, AutoAck: true})
		require.NoError(t, err)
		require.Len(t, res.Messages, 1)
	}
	pushN(t, s, "mw", 3)                                                            // offsets 2–4
	held, err := s.Pop(ctx, queue.PopRequest{Queue: "mw", Group: "busy", Batch: 1}) // busy holds 2
	require.NoError(t, err)
	require.Len(t, held.Messages, 1)
	age(t, s, "mw", 2, 3, 120)

	deleted, ran, err := s.RunRetention(ctx, 0)
	require.NoError(t, err)
	require.True(t, ran)
	assert.EqualValues(t, 2, deletedBy(deleted, "mw", queue.RetentionMaxWait), "2 and 3, for slow only")

	res, err := s.Pop(ctx, queue.PopRequest{Queue: "mw", Group: "slow", Batch: 10, AutoAck: true})
	require.NoError(t, err)
	require.Len(t, res.Messages, 1)
	assert.EqualValues(t, 4, res.Messages[0].Offset, "slow goes on at 4")

	dl, err := s.DLQ(ctx, queue.DLQQuery{Queue: "mw", Group: "slow", Limit: 10})
	require.NoError(t, err)
	require.Len(t, dl.Messages, 2)
	for _, d := range dl.Messages {
		assert.Equal(t, queue.MaxWaitError, d.ErrorMessage)
	}
	var cursor int64
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT cursor FROM consumers WHERE consumer_group = 'slow'`).Scan(&cursor))
	assert.EqualValues(t, 4, cursor)
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT cursor FROM consumers WHERE consumer_group = 'busy'`).Scan(&cursor))
	assert.EqualValues(t, 1, cursor, "busy, under a live lease, is untouched")
}

// maxWaitTimeSeconds covers a queue no consumer group has read
// yet, with the reference server's effect: messages older than the limit
// are deleted, on every partition (no group's dead-letter queue to take
// them); younger ones stay, and a group subscribing later reads only those.
// A queue without the option keeps everything.
func TestRetention_MaxWaitOnUnreadQueue(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	_, err := s.Configure(ctx, queue.ConfigureRequest{Queue: "unread", Options: json.RawMessage(`{"maxWaitTimeSeconds":60}`)})
	require.NoError(t, err)
	for _, part := range []string{"a", "b"} {
		push(t, s, "unread", part, nums(1, 3)...)
		push(t, s, "kept", part, nums(1, 3)...)
	}
	age(t, s, "unread", 1, 2, 120)
	age(t, s, "kept", 1, 3, 120)

	deleted, ran, err := s.RunRetention(ctx, 0)
	require.NoError(t, err)
	require.True(t, ran)
	assert.EqualValues(t, 4, deletedBy(deleted, "unread", queue.RetentionMaxWaitUnread), "offsets 1–2 of both partitions")
	assert.Zero(t, deletedBy(deleted, "kept", queue.RetentionMaxWaitUnread))
	var dead int
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT count(*) FROM dead_letters`).Scan(&dead))
	assert.Zero(t, dead, "deleted, not dead-lettered: no group to give them to")

	res := pop(t, s, queue.PopRequest{Queue: "unread", Group: "late", Batch: 10, Partitions: 2})
	assert.Equal(t, []int{3, 3}, payloads(t, res.Messages), "a group subscribing now reads what is left")
}

// Retention's lock holds a connection for the run and the deletes take a
// second one: with a pool of one it fails at once instead of waiting for
// the connection it holds itself.
func TestRetention_PoolOfOneConnectionIsRefusedNotHung(t *testing.T) {
	ctx := ctxT(t)
	s, _ := storeOnOneConnection(t, nil)
	_, ran, err := s.RunRetention(ctx, 0)
	require.ErrorContains(t, err, "at least 2 connections")
	assert.False(t, ran)
}

// A consumer group nobody has read with for longer than its queue's
// idleGroupRetentionSeconds, holding no lease, is removed with its rows,
// counted per queue; then it no longer holds back completed retention. A
// group with a live lease, one that read recently, the default group and
// the groups of a queue with the option 0 all stay.
func TestRetention_RemovesIdleGroups(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	_, err := s.Configure(ctx, queue.ConfigureRequest{Queue: "churn",
		Options: json.RawMessage(`{"idleGroupRetentionSeconds": 3600, "completedRetentionSeconds": 1, "retentionEnabled": true}`)})
	require.NoError(t, err)
	_, err = s.Configure(ctx, queue.ConfigureRequest{Queue: "keep", Options: json.RawMessage(`{"idleGroupRetentionSeconds": 0}`)})
	require.NoError(t, err)
	_, err = s.Configure(ctx, queue.ConfigureRequest{Queue: "busy", Options: json.RawMessage(`{"idleGroupRetentionSeconds": 3600}`)})
	require.NoError(t, err)
	for _, q := range []string{"churn", "keep", "busy"} {
		push(t, s, q, "", nums(1, 1)...)
		push(t, s, q, "p2", nums(1, 1)...)
	}
	read := func(q, g string, ack bool) {
		for range 2 {
			res := pop(t, s, queue.PopRequest{Queue: q, Group: g, Batch: 10})
			if ack && len(res.Messages) > 0 {
				ackAll(t, s, res, queue.StatusCompleted)
			}
		}
	}
	read("churn", "tab1", false) // abandoned holding nothing done: blocks completed retention
	read("churn", "tab2", true)
	read("busy", "leased", false)
	read("churn", "recent", true)
	read("churn", "", true)
	read("keep", "backend", false)
	// Time passes: every group's last read is two hours old, but the
	// leased group's lease is live.
	exec(t, s, `UPDATE consumer_groups SET last_seen_at = now() - interval '2 hours' WHERE name <> 'recent'`)
	exec(t, s, `UPDATE consumers SET lease_expires_at = now() - interval '1 second' WHERE consumer_group = 'tab1'`)
	exec(t, s, `UPDATE consumers SET lease_expires_at = now() + interval '1 hour' WHERE consumer_group = 'leased'`)
	age(t, s, "churn", 1, 1, 10)

	deleted, ran, err := s.RunRetention(ctx, 0)
	require.NoError(t, err)
	require.True(t, ran)
	assert.EqualValues(t, 2, deletedBy(deleted, "churn", queue.RetentionIdleGroup), "%v", deleted)
	assert.Zero(t, deletedBy(deleted, "keep", queue.RetentionIdleGroup))
	var groups []string
	rows, err := s.Pool().Query(ctx, `SELECT q.name || '/' || g.name FROM consumer_groups g JOIN queues q ON q.id = g.queue_id ORDER BY 1`)
	require.NoError(t, err)
	for rows.Next() {
		var g string
		require.NoError(t, rows.Scan(&g))
		groups = append(groups, g)
	}
	assert.Equal(t, []string{"busy/leased", "churn/__QUEUE_MODE__", "churn/recent", "keep/backend"}, groups)
	var orphans int
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT count(*) FROM consumers WHERE consumer_group IN ('tab1', 'tab2')`).Scan(&orphans))
	assert.Zero(t, orphans, "their rows go with them")
	// tab1 never finished its messages: gone, they no longer wait for it.
	assert.EqualValues(t, 2, deletedBy(deleted, "churn", queue.RetentionCompleted), "%v", deleted)
}

// maxWaitTimeSeconds on a queue with deadLetterQueue false: a message a
// group did not consume in time is finished for it with no dead letter
// (reason max_wait_dropped), and the group goes on after it.
func TestRetention_MaxWaitWithoutDeadLetterQueueIsDropped(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	_, err := s.Configure(ctx, queue.ConfigureRequest{Queue: "mwd",
		Options: json.RawMessage(`{"maxWaitTimeSeconds":60,"deadLetterQueue":false}`)})
	require.NoError(t, err)
	pushN(t, s, "mwd", 1)
	res, err := s.Pop(ctx, queue.PopRequest{Queue: "mwd", Group: "slow", Batch: 1, AutoAck: true})
	require.NoError(t, err)
	require.Len(t, res.Messages, 1)
	pushN(t, s, "mwd", 2) // offsets 2, 3
	age(t, s, "mwd", 2, 2, 120)

	deleted, ran, err := s.RunRetention(ctx, 0)
	require.NoError(t, err)
	require.True(t, ran)
	assert.EqualValues(t, 1, deletedBy(deleted, "mwd", queue.RetentionMaxWaitDropped))
	assert.Zero(t, deletedBy(deleted, "mwd", queue.RetentionMaxWait))
	dl, err := s.DLQ(ctx, queue.DLQQuery{Queue: "mwd"})
	require.NoError(t, err)
	assert.Zero(t, dl.Total)
	res, err = s.Pop(ctx, queue.PopRequest{Queue: "mwd", Group: "slow", Batch: 10, AutoAck: true})
	require.NoError(t, err)
	require.Len(t, res.Messages, 1)
	assert.EqualValues(t, 3, res.Messages[0].Offset, "slow goes on at 3")
}

// ttl: retention deletes a message older than the queue's ttl, consumed or
// not and whatever retentionEnabled says, except one under a live lease;
// a group that had not reached it goes on after it, caught up (no row left
// ready for what is gone); younger messages stay. A queue with ttl 0 keeps
// everything.
func TestRetention_MessageOlderThanTTLIsDeleted(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	_, err := s.Configure(ctx, queue.ConfigureRequest{Queue: "tt", Options: json.RawMessage(`{"ttl":60}`)})
	require.NoError(t, err)
	_, err = s.Configure(ctx, queue.ConfigureRequest{Queue: "keep", Options: json.RawMessage(`{"ttl":0}`)})
	require.NoError(t, err)
	pushN(t, s, "tt", 5)
	pushN(t, s, "keep", 2)
	// Group "done" consumed 1–2; group "lease" holds 1 under a live lease.
	res, err := s.Pop(ctx, queue.PopRequest{Queue: "tt", Group: "done", Batch: 2, AutoAck: true})
	require.NoError(t, err)
	require.Len(t, res.Messages, 2)
	res, err = s.Pop(ctx, queue.PopRequest{Queue: "tt", Group: "lease", Batch: 1})
	require.NoError(t, err)
	require.Len(t, res.Messages, 1)
	age(t, s, "tt", 1, 3, 120)
	age(t, s, "keep", 1, 2, 10*365*24*3600)

	deleted, ran, err := s.RunRetention(ctx, 0)
	require.NoError(t, err)
	require.True(t, ran)
	assert.EqualValues(t, 2, deletedBy(deleted, "tt", queue.RetentionTTL), "2 and 3; 1 is leased, 4–5 are young")
	assert.Zero(t, deletedBy(deleted, "keep", queue.RetentionTTL))

	res, err = s.Pop(ctx, queue.PopRequest{Queue: "tt", Group: "done", Batch: 10, AutoAck: true})
	require.NoError(t, err)
	var got []int64
	for _, m := range res.Messages {
		got = append(got, m.Offset)
	}
	assert.Equal(t, []int64{4, 5}, got, "the expired message 3 is not delivered")
	res, err = s.Pop(ctx, queue.PopRequest{Queue: "keep", Batch: 10, AutoAck: true})
	require.NoError(t, err)
	assert.Len(t, res.Messages, 2, "ttl 0: nothing expires")
}
