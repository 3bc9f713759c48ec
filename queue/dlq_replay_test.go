package queue_test

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// dlqFixture: queue q (retry limit 0) with messages 1..n on its Default
// partition; group g finished them all but dead-lettered the offsets in
// poison; group h finished them all.
func dlqFixture(t *testing.T, s *queue.Store, n int, poison ...int) {
	t.Helper()
	_, err := s.Configure(ctxT(t), queue.ConfigureRequest{Queue: "q", Options: optsJSON(func(o *queue.Options) { o.RetryLimit = 0 })})
	require.NoError(t, err)
	push(t, s, "q", "", nums(1, n)...)
	bad := map[int]bool{}
	for _, p := range poison {
		bad[p] = true
	}
	for _, g := range []string{"g", "h"} {
		res := pop(t, s, queue.PopRequest{Queue: "q", Group: g, Batch: n})
		require.Len(t, res.Messages, n)
		acks := make([]queue.Ack, n)
		for i, m := range res.Messages {
			acks[i] = queue.Ack{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID, Group: g,
				Status: queue.StatusCompleted}
			if g == "g" && bad[i+1] {
				acks[i].Status, acks[i].Error = queue.StatusFailed, "boom "+strconv.Itoa(i+1)
			}
		}
		out, err := s.Ack(ctxT(t), acks)
		require.NoError(t, err)
		for _, r := range out {
			require.True(t, r.Success, "%+v", r)
		}
	}
}

// deadLetters lists the dead letters of q for group g, by offset payload.
func deadLetters(t *testing.T, s *queue.Store, g string) map[int]string {
	t.Helper()
	page, err := s.DLQ(ctxT(t), queue.DLQQuery{Queue: "q", Group: g, Limit: queue.MaxDLQLimit})
	require.NoError(t, err)
	out := map[int]string{}
	for _, d := range page.Messages {
		out[payloads(t, []queue.Message{{Data: d.Data}})[0]] = d.RowID
	}
	return out
}

func rowIDs(t *testing.T, ids ...string) []int64 {
	t.Helper()
	out := make([]int64, len(ids))
	for i, id := range ids {
		n, err := strconv.ParseInt(id, 10, 64)
		require.NoError(t, err)
		out[i] = n
	}
	return out
}

func cursorOf(t *testing.T, s *queue.Store, g string) (cursor int64, done []int64) {
	t.Helper()
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT cursor, done FROM consumers WHERE consumer_group = $1`, g).
		Scan(&cursor, &done))
	return cursor, done
}

// A replay puts exactly the dead-lettered message back, for its
// group only and in its place; once acked the cursor is where it was; a
// second replay of the same dead letter changes nothing.
func TestDLQReplay_PutsOneMessageBack(t *testing.T) {
	s := newStore(t)
	dlqFixture(t, s, 5, 2)
	dl := deadLetters(t, s, "g")
	require.Len(t, dl, 1)
	id := rowIDs(t, dl[2])
	d, err := s.DeadLetterByID(ctxT(t), id[0])
	require.NoError(t, err)
	assert.Equal(t, "boom 2", d.ErrorMessage)

	res, err := s.ReplayDeadLetters(ctxT(t), queue.DLQSelection{IDs: id})
	require.NoError(t, err)
	require.Len(t, res.Items, 1)
	assert.Equal(t, queue.DLQReplayed, res.Items[0].Status)
	assert.Equal(t, map[string]int{"q": 1}, res.Done)
	assert.Empty(t, deadLetters(t, s, "g"))
	_, err = s.DeadLetterByID(ctxT(t), id[0])
	assert.ErrorIs(t, err, queue.ErrNotFound)
	cur, done := cursorOf(t, s, "g")
	assert.Equal(t, int64(1), cur)
	assert.Equal(t, []int64{3, 4, 5}, done)

	// Messages pushed since come after it, in order; h gets only those.
	push(t, s, "q", "", nums(6, 7)...)
	got := pop(t, s, queue.PopRequest{Queue: "q", Group: "g", Batch: 10})
	assert.Equal(t, []int{2, 6, 7}, payloads(t, got.Messages), "the replayed message first, then only new ones")
	assert.Equal(t, 0, got.Messages[0].RetryCount)
	assert.Equal(t, []int{6, 7}, payloads(t, pop(t, s, queue.PopRequest{Queue: "q", Group: "h", Batch: 10}).Messages))
	// Replaying again while g holds the lease: the dead letter is gone, so
	// not_found, nothing changes.
	res, err = s.ReplayDeadLetters(ctxT(t), queue.DLQSelection{IDs: id})
	require.NoError(t, err)
	assert.Equal(t, queue.ReasonNotFound, res.Items[0].Reason)
	ackAll(t, s, got, queue.StatusCompleted)
	cur, done = cursorOf(t, s, "g")
	assert.Equal(t, int64(7), cur, "the ack jumped the cursor over the done run")
	assert.Empty(t, done)
	assert.Empty(t, pop(t, s, queue.PopRequest{Queue: "q", Group: "g", Batch: 10}).Messages, "nothing delivered twice")
	res, err = s.ReplayDeadLetters(ctxT(t), queue.DLQSelection{IDs: id})
	require.NoError(t, err)
	assert.Equal(t, queue.ReasonNotFound, res.Items[0].Reason)
	assert.Empty(t, pop(t, s, queue.PopRequest{Queue: "q", Group: "g", Batch: 10}).Messages)
}

// The reasons a replay skips a dead letter, each leaving it and
// the cursor as they were.
func TestDLQReplay_SkipsWhatItMust(t *testing.T) {
	s := newStore(t)
	dlqFixture(t, s, 6, 2, 3, 4)
	dl := deadLetters(t, s, "g")
	require.Len(t, dl, 3)

	// leased: g holds a live lease on the partition.
	push(t, s, "q", "", nums(7, 7)...)
	held := pop(t, s, queue.PopRequest{Queue: "q", Group: "g"})
	require.Equal(t, []int{7}, payloads(t, held.Messages))
	res, err := s.ReplayDeadLetters(ctxT(t), queue.DLQSelection{IDs: rowIDs(t, dl[2])})
	require.NoError(t, err)
	assert.Equal(t, queue.ReasonLeased, res.Items[0].Reason)
	cur, done := cursorOf(t, s, "g")
	assert.Equal(t, int64(6), cur)
	assert.Empty(t, done)
	ackAll(t, s, held, queue.StatusCompleted)

	// message_gone: retention took the message; its dead letter stays.
	exec(t, s, `DELETE FROM messages WHERE seq = 3`)
	res, err = s.ReplayDeadLetters(ctxT(t), queue.DLQSelection{IDs: rowIDs(t, dl[3])})
	require.NoError(t, err)
	assert.Equal(t, queue.ReasonMessageGone, res.Items[0].Reason)
	assert.Contains(t, deadLetters(t, s, "g"), 3)

	// expired: the queue's maxWaitTimeSeconds has passed for the message
	// (retention would dead-letter it again); the dead letter stays.
	exec(t, s, `UPDATE queues SET max_wait_time_seconds = 60 WHERE name = 'q'`)
	exec(t, s, `UPDATE messages SET created_at = now() - interval '2 minutes' WHERE seq = 4`)
	res, err = s.ReplayDeadLetters(ctxT(t), queue.DLQSelection{IDs: rowIDs(t, dl[4])})
	require.NoError(t, err)
	assert.Equal(t, queue.ReasonExpired, res.Items[0].Reason)
	assert.Contains(t, deadLetters(t, s, "g"), 4)
	exec(t, s, `UPDATE queues SET max_wait_time_seconds = 0 WHERE name = 'q'`)

	// too_far: the cursor stands more than MaxReplayDistance past it.
	exec(t, s, `UPDATE consumers SET cursor = cursor + $1 WHERE consumer_group = 'g'`, queue.MaxReplayDistance)
	res, err = s.ReplayDeadLetters(ctxT(t), queue.DLQSelection{IDs: rowIDs(t, dl[4])})
	require.NoError(t, err)
	assert.Equal(t, queue.ReasonTooFar, res.Items[0].Reason)
	cur, _ = cursorOf(t, s, "g")
	assert.Equal(t, int64(7+queue.MaxReplayDistance), cur)
	assert.Len(t, deadLetters(t, s, "g"), 3)
	exec(t, s, `UPDATE consumers SET cursor = cursor - $1 WHERE consumer_group = 'g'`, queue.MaxReplayDistance)

	// An expired lease is settled first (as a pop would: here its message
	// goes to the dead-letter queue), then the replayed offset is pending.
	push(t, s, "q", "", nums(8, 8)...)
	require.Equal(t, []int{8}, payloads(t, pop(t, s, queue.PopRequest{Queue: "q", Group: "g"}).Messages))
	exec(t, s, `UPDATE consumers SET lease_expires_at = now() - interval '1 second' WHERE consumer_group = 'g'`)
	res, err = s.ReplayDeadLetters(ctxT(t), queue.DLQSelection{IDs: rowIDs(t, dl[4], "999999")})
	require.NoError(t, err)
	require.Len(t, res.Items, 2)
	assert.Equal(t, queue.DLQReplayed, res.Items[0].Status)
	assert.Equal(t, queue.ReasonNotFound, res.Items[1].Reason, "an id that never was")
	assert.Equal(t, map[string]int{"q": 1}, res.DeadLettered)
	require.Len(t, res.Released, 1)
	assert.Contains(t, deadLetters(t, s, "g"), 8, "the expired lease's message was dead-lettered")
	got := pop(t, s, queue.PopRequest{Queue: "q", Group: "g", Batch: 10})
	assert.Equal(t, []int{4}, payloads(t, got.Messages))
	assert.Equal(t, 0, got.Messages[0].RetryCount, "the expired lease was not charged to the replayed message")
}

// A dead letter whose message is older than its queue's ttl is not
// replayed (expired): put back, the group's next pop would skip the
// message as expired, so the replay would delete the only copy kept of it
// (the dead letter) and deliver nothing. The dead letter and the cursor
// stay as they were.
func TestDLQReplay_MessagePastTTLIsNotPutBack(t *testing.T) {
	s := newStore(t)
	dlqFixture(t, s, 3, 2)
	dl := deadLetters(t, s, "g")
	require.Len(t, dl, 1)
	exec(t, s, `UPDATE queues SET ttl = 60 WHERE name = 'q'`)
	exec(t, s, `UPDATE messages SET created_at = now() - interval '2 minutes' WHERE seq = 2`)

	res, err := s.ReplayDeadLetters(ctxT(t), queue.DLQSelection{IDs: rowIDs(t, dl[2])})
	require.NoError(t, err)
	require.Len(t, res.Items, 1)
	assert.Equal(t, queue.DLQSkipped, res.Items[0].Status)
	assert.Equal(t, queue.ReasonExpired, res.Items[0].Reason)
	assert.Contains(t, deadLetters(t, s, "g"), 2, "the dead letter stays")
	cur, done := cursorOf(t, s, "g")
	assert.Equal(t, int64(3), cur)
	assert.Empty(t, done)
}

// Filter mode acts on at most its limit, oldest first; the error
// filter matches any case; purge deletes dead letters and is idempotent.
func TestDLQ_FilterModeAndPurge(t *testing.T) {
	s := newStore(t)
	dlqFixture(t, s, 8, 2, 3, 5, 7)
	page, err := s.DLQ(ctxT(t), queue.DLQQuery{Queue: "q", Error: "BOOM 5"})
	require.NoError(t, err)
	require.EqualValues(t, 1, page.Total)
	assert.Equal(t, "boom 5", page.Messages[0].ErrorMessage)

	res, err := s.ReplayDeadLetters(ctxT(t), queue.DLQSelection{Filter: queue.DLQQuery{Queue: "q", Group: "g"}, Limit: 2})
	require.NoError(t, err)
	assert.Equal(t, map[string]int{"q": 2}, res.Done)
	left := deadLetters(t, s, "g")
	assert.Len(t, left, 2)
	assert.Contains(t, left, 5)
	assert.Contains(t, left, 7)
	assert.Equal(t, []int{2, 3}, payloads(t, pop(t, s, queue.PopRequest{Queue: "q", Group: "g", Batch: 10}).Messages))

	_, err = s.ReplayDeadLetters(ctxT(t), queue.DLQSelection{Filter: queue.DLQQuery{Queue: "q"}, Limit: queue.MaxDLQSelection + 1})
	assert.True(t, queue.IsInputError(err))
	_, err = s.PurgeDeadLetters(ctxT(t), queue.DLQSelection{IDs: []int64{}})
	assert.True(t, queue.IsInputError(err))

	ids := rowIDs(t, left[5], left[7])
	pr, err := s.PurgeDeadLetters(ctxT(t), queue.DLQSelection{IDs: ids})
	require.NoError(t, err)
	assert.Equal(t, map[string]int{"q": 2}, pr.Done)
	assert.Empty(t, deadLetters(t, s, "g"))
	pr, err = s.PurgeDeadLetters(ctxT(t), queue.DLQSelection{IDs: ids})
	require.NoError(t, err)
	assert.Empty(t, pr.Done)
	for _, o := range pr.Items {
		assert.Equal(t, queue.ReasonNotFound, o.Reason)
	}
	// Purged messages stay finished for g.
	cur, done := cursorOf(t, s, "g")
	assert.Equal(t, int64(1), cur)
	assert.Equal(t, []int64{4, 5, 6, 7, 8}, done, "2 and 3 pending (leased), the purged 5 and 7 finished")
}

// Replay and purge while a consumer of the group pops and acks
// the partition without a pause, and a producer pushes: every message is
// delivered, each replayed one exactly once more, nothing is lost, and the
// cursor ends on the last offset with no dead letter left.
func TestDLQReplay_UnderALiveConsumer(t *testing.T) {
	s := newStore(t)
	_, err := s.Configure(ctxT(t), queue.ConfigureRequest{Queue: "q", Options: optsJSON(func(o *queue.Options) { o.RetryLimit = 0 })})
	require.NoError(t, err)
	const total = 300
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var mu sync.Mutex
	seen := map[int]int{}
	consumed := make(chan struct{}, 1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // the producer
		defer wg.Done()
		for i := 1; i <= total; i += 10 {
			if _, err := s.Push(ctx, pushItems(t, i, i+9)); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	go func() { // the consumer: every fifth message is poison the first time
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			res, err := s.Pop(ctx, queue.PopRequest{Queue: "q", Group: "g", Batch: 3})
			if err != nil {
				t.Error(err)
				return
			}
			if len(res.Messages) == 0 {
				// Nothing now: pace the loop rather than spin on the database.
				select {
				case <-stop:
					return
				case <-time.After(2 * time.Millisecond):
				}
				continue
			}
			acks := make([]queue.Ack, len(res.Messages))
			for i, m := range res.Messages {
				n := payloads(t, []queue.Message{m})[0]
				mu.Lock()
				seen[n]++
				first := seen[n] == 1
				mu.Unlock()
				acks[i] = queue.Ack{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID, Group: "g",
					Status: queue.StatusCompleted}
				if n%5 == 0 && first {
					acks[i].Status = queue.StatusDLQ
				}
			}
			if len(acks) > 0 {
				if _, err := s.Ack(ctx, acks); err != nil {
					t.Error(err)
					return
				}
				select {
				case consumed <- struct{}{}:
				default:
				}
			}
		}
	}()

	// Replay what is dead-lettered (every multiple of 5 but those of 50,
	// which are purged), over and over, while the consumer runs; a leased
	// partition is retried.
	replayed, purged := map[int]bool{}, map[int]bool{}
	deadline := time.After(30 * time.Second)
	for len(replayed)+len(purged) < total/5 {
		select {
		case <-consumed:
		case <-time.After(20 * time.Millisecond): // the consumer may be idle: look again
		case <-deadline:
			t.Fatalf("replayed %d and purged %d of %d", len(replayed), len(purged), total/5)
		}
		page, err := s.DLQ(ctx, queue.DLQQuery{Queue: "q", Group: "g", Limit: queue.MaxDLQLimit})
		require.NoError(t, err)
		byID := map[int64]int{}
		var toReplay, toPurge []int64
		for _, d := range page.Messages {
			n := payloads(t, []queue.Message{{Data: d.Data}})[0]
			id := rowIDs(t, d.RowID)[0]
			byID[id] = n
			if n%50 == 0 {
				toPurge = append(toPurge, id)
			} else {
				toReplay = append(toReplay, id)
			}
		}
		if len(toPurge) > 0 {
			res, err := s.PurgeDeadLetters(ctx, queue.DLQSelection{IDs: toPurge})
			require.NoError(t, err)
			for _, o := range res.Items {
				if o.Status == queue.DLQPurged {
					purged[byID[o.ID]] = true
				}
			}
		}
		if len(toReplay) > 0 {
			res, err := s.ReplayDeadLetters(ctx, queue.DLQSelection{IDs: toReplay})
			require.NoError(t, err)
			for _, o := range res.Items {
				switch o.Status {
				case queue.DLQReplayed:
					require.False(t, replayed[byID[o.ID]], "replayed twice")
					replayed[byID[o.ID]] = true
				default:
					require.Equal(t, queue.ReasonLeased, o.Reason, "the only reason to skip here")
				}
			}
		}
	}
	// Wait until the consumer has seen every replayed message again.
	done := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for n := 1; n <= total; n++ {
			want := 1
			if replayed[n] {
				want = 2
			}
			if seen[n] != want {
				return false
			}
		}
		return true
	}
	for !done() {
		select {
		case <-consumed:
		case <-time.After(10 * time.Second):
			mu.Lock()
			t.Fatalf("not every message was delivered as expected: %v", seen)
		}
	}
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for n := 1; n <= total; n++ {
		switch {
		case replayed[n]:
			assert.Equal(t, 2, seen[n], "replayed %d: delivered once more", n)
		default:
			assert.Equal(t, 1, seen[n], "message %d delivered once", n)
		}
	}
	cur, doneOffsets := cursorOf(t, s, "g")
	assert.Equal(t, int64(total), cur)
	assert.Empty(t, doneOffsets)
	assert.Empty(t, deadLetters(t, s, "g"))
	assert.Len(t, purged, total/50)
}

// pushItems builds {"n": from..to} items for q's Default partition.
func pushItems(t *testing.T, from, to int) []queue.PushItem {
	var items []queue.PushItem
	for _, p := range nums(from, to) {
		b, err := json.Marshal(p)
		if err != nil {
			t.Error(err)
		}
		items = append(items, queue.PushItem{Queue: "q", Payload: b})
	}
	return items
}

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
