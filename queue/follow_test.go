package queue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// readAll follows t from pos until a read comes back short and holds
// nothing back, with batches of limit.
func readAll(t *testing.T, s *queue.Store, tg queue.FollowTarget, pos queue.FollowPos, limit int) ([]queue.FollowMessage, queue.FollowPos) {
	t.Helper()
	var out []queue.FollowMessage
	for {
		b, err := s.ReadFollow(ctxT(t), tg, pos, limit)
		require.NoError(t, err)
		out = append(out, b.Messages...)
		pos = b.Last(pos)
		if !b.Full {
			return out, pos
		}
	}
}

// A queue-wide follow read in batches, resumed at random positions while
// many producers push to many partitions at once (single and multi-
// partition pushes, so that transactions take their ids in another order
// than they commit): every message exactly once, in one order that every
// resume agrees with, each partition in offset order.
func TestFollow_QueueOrderIsExactAcrossConcurrentPushes(t *testing.T) {
	s := newStore(t)
	const producers, pushes, parts = 8, 40, 12
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	pushed := make(chan string, producers*pushes*3)
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range pushes {
				n := 1 + i%3 // one to three partitions in one transaction
				items := make([]queue.PushItem, n)
				for k := range n {
					items[k] = queue.PushItem{Queue: "fq", Partition: fmt.Sprintf("p%d", rand.N(parts)),
						Payload: json.RawMessage(fmt.Sprintf(`{"p":%d,"i":%d,"k":%d}`, p, i, k))}
				}
				res, err := s.Push(ctx, items)
				if !assert.NoError(t, err) {
					return
				}
				for _, r := range res {
					if r.Status == queue.StatusQueued {
						pushed <- r.MessageID
					}
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	tg := queue.FollowTarget{Queue: "fq"}
	var order []queue.FollowMessage // what the follower read, in order
	var pos queue.FollowPos
	finished := false
	for deadline := time.Now().Add(60 * time.Second); !finished; {
		require.True(t, time.Now().Before(deadline), "the follower did not catch up with the producers")
		select {
		case <-done:
			finished = true
		default:
		}
		// A resume from a random earlier position reads exactly what the
		// follower read after it.
		if len(order) > 0 && rand.N(4) == 0 {
			i := rand.N(len(order))
			again, _ := readAll(t, s, tg, order[i].Pos, 1+rand.N(7))
			require.GreaterOrEqual(t, len(again), len(order)-i-1)
			for k := range order[i+1:] {
				require.Equal(t, order[i+1+k].ID, again[k].ID, "a resume from a read position reads the same messages in the same order")
			}
		}
		b, err := s.ReadFollow(ctxT(t), tg, pos, 1+rand.N(9))
		require.NoError(t, err)
		order = append(order, b.Messages...)
		pos = b.Last(pos)
		if finished {
			more, _ := readAll(t, s, tg, pos, 50)
			order = append(order, more...)
		}
	}
	close(pushed)
	want := map[string]bool{}
	for id := range pushed {
		want[id] = true
	}
	got := map[string]bool{}
	lastOff := map[string]int64{}
	for i, m := range order {
		require.False(t, got[m.ID], "message %s read twice", m.ID)
		got[m.ID] = true
		if i > 0 {
			require.Equal(t, 1, m.Pos.Compare(order[i-1].Pos), "positions grow")
		}
		require.Greater(t, m.Offset, lastOff[m.PartitionID], "partition %s in offset order", m.Partition)
		lastOff[m.PartitionID] = m.Offset
	}
	require.Equal(t, len(want), len(got))
	for id := range want {
		require.True(t, got[id], "message %s never read", id)
	}
}

// A push whose transaction took its id before another push to the same
// partition committed gets a later offset with an older xid: the follow
// order still puts it after (follow_xid is raised to the partition's).
func TestFollow_OlderTransactionKeepsPartitionOrder(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	push(t, s, "fo", "a", 0)
	tx, err := s.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT pg_current_xact_id()`) // the older xid
	require.NoError(t, err)
	push(t, s, "fo", "a", 1) // a younger xid, committed first: offset 2
	_, err = tx.Exec(ctx, `SELECT push('fo', 'a', '{"n":2}')`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	got, _ := readAll(t, s, queue.FollowTarget{Queue: "fo"}, queue.FollowPos{}, 10)
	require.Len(t, got, 3)
	for i, m := range got {
		assert.EqualValues(t, i+1, m.Offset, "queue-wide follow keeps the partition's offset order")
	}
}

// A message committed after a transaction that is still open (any
// transaction with an id) waits behind it: the read holds it back and says
// so, and gives it once that transaction ends. A position read never has
// a message appear below it later.
func TestFollow_OpenTransactionHoldsLaterMessagesBack(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	push(t, s, "fh", "a", 1)
	tx, err := s.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT pg_current_xact_id()`)
	require.NoError(t, err)
	push(t, s, "fh", "b", 2)
	for _, tg := range []queue.FollowTarget{{Queue: "fh"}, {Queue: "fh", Partition: "b"}} {
		b, err := s.ReadFollow(ctx, tg, queue.FollowPos{}, 10)
		require.NoError(t, err)
		assert.True(t, b.Held, "%v: a committed message waits behind the open transaction", tg)
		for _, m := range b.Messages {
			assert.NotEqual(t, "b", m.Partition, "%v: the message above the barrier is not read yet", tg)
		}
	}
	require.NoError(t, tx.Commit(ctx))
	got, _ := readAll(t, s, queue.FollowTarget{Queue: "fh"}, queue.FollowPos{}, 10)
	require.Len(t, got, 2)
	b, err := s.ReadFollow(ctx, queue.FollowTarget{Queue: "fh"}, got[1].Pos, 10)
	require.NoError(t, err)
	assert.False(t, b.Held)
	assert.Empty(t, b.Messages)
}

// from=beginning, now, a time and an event id, for a queue and a
// partition.
func TestFollow_StartPositions(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	push(t, s, "fs", "a", 1, 2)
	push(t, s, "fs", "b", 3)
	// The time start is a boundary between pushes: mid is after every
	// created_at so far, and the next pushes wait until the database's
	// clock has passed it (its clock, not this process's, stamps them).
	var mid time.Time
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT max(created_at) + interval '1 millisecond' FROM messages`).Scan(&mid))
	require.Eventually(t, func() bool {
		var passed bool
		require.NoError(t, s.Pool().QueryRow(ctx, `SELECT clock_timestamp() > $1`, mid).Scan(&passed))
		return passed
	}, 10*time.Second, time.Millisecond, "the database's clock passes the boundary")
	push(t, s, "fs", "a", 4)
	push(t, s, "fs", "b", 5)

	ns := func(msgs []queue.FollowMessage) []int {
		var out []int
		for _, m := range msgs {
			var v int
			require.NoError(t, json.Unmarshal(m.Data, &v))
			out = append(out, v)
		}
		return out
	}
	for _, c := range []struct {
		part string
		from queue.FollowFrom
		want []int
	}{
		{"", queue.FollowFrom{Beginning: true}, []int{1, 2, 3, 4, 5}},
		{"", queue.FollowFrom{}, nil},
		{"", queue.FollowFrom{Time: mid}, []int{4, 5}},
		{"a", queue.FollowFrom{Beginning: true}, []int{1, 2, 4}},
		{"a", queue.FollowFrom{}, nil},
		{"b", queue.FollowFrom{Time: mid}, []int{5}},
		{"", queue.FollowFrom{Time: time.Now().Add(time.Hour)}, nil},
	} {
		tg := queue.FollowTarget{Queue: "fs", Partition: c.part}
		pos, err := s.FollowStart(ctx, tg, c.from)
		require.NoError(t, err)
		got, _ := readAll(t, s, tg, pos, 2)
		assert.Equal(t, c.want, ns(got), "partition %q from %+v", c.part, c.from)
	}
	// now, then a push: it is read.
	pos, err := s.FollowStart(ctx, queue.FollowTarget{Queue: "fs"}, queue.FollowFrom{})
	require.NoError(t, err)
	push(t, s, "fs", "c", 6)
	got, last := readAll(t, s, queue.FollowTarget{Queue: "fs"}, pos, 2)
	assert.Equal(t, []int{6}, ns(got))

	// An event id round-trips and resumes after its message.
	all, _ := readAll(t, s, queue.FollowTarget{Queue: "fs"}, queue.FollowPos{}, 10)
	id := queue.EncodeFollowID("fs", all[2].Pos)
	_, p, err := queue.ParseFollowFrom("fs", id)
	require.NoError(t, err)
	require.NotNil(t, p)
	assert.Equal(t, all[2].Pos, *p)
	rest, _ := readAll(t, s, queue.FollowTarget{Queue: "fs"}, *p, 10)
	assert.Equal(t, ns(all[3:]), ns(rest))
	assert.Equal(t, last, rest[len(rest)-1].Pos)
}

// A position of another queue, or one that is not a position at all, is
// an input error.
func TestFollow_ForeignOrMalformedPositionIsRefused(t *testing.T) {
	id := queue.EncodeFollowID("one", queue.FollowPos{XID: 77, PartitionID: queue.NewID(), Offset: 9})
	for _, bad := range []string{id, "f1", "f1!!", "x" + id[1:], id[:len(id)-2], "f1" + "AAAAAAAA", id + "AA"} {
		_, _, err := queue.ParseFollowFrom("two", bad)
		if bad == id {
			require.Error(t, err)
		}
		if err != nil {
			assert.True(t, queue.IsInputError(err), "%q: %v", bad, err)
		}
	}
	_, err := queue.DecodeFollowID("one", id)
	require.NoError(t, err)
	_, _, err = queue.ParseFollowFrom("one", "yesterday")
	assert.True(t, queue.IsInputError(err))
}

// Retention that deletes messages a follower has not read yet: the next
// read reports the highest position deleted (a gap) and still gives what
// is stored after the follower's position; a follower past the deleted
// messages sees no gap.
func TestFollow_RetentionGapIsReported(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	_, err := s.Configure(ctx, queue.ConfigureRequest{Queue: "fg",
		Options: json.RawMessage(`{"retentionEnabled":true,"retentionSeconds":60}`)})
	require.NoError(t, err)
	push(t, s, "fg", "a", 1, 2, 3)
	push(t, s, "fg", "b", 4)
	all, _ := readAll(t, s, queue.FollowTarget{Queue: "fg"}, queue.FollowPos{}, 10)
	require.Len(t, all, 4)
	age(t, s, "fg", 1, 2, 120) // a:1, a:2, b:1
	_, ran, err := s.RunRetention(ctx, 0)
	require.NoError(t, err)
	require.True(t, ran)

	// Slow: it had read only a:1.
	slow := queue.FollowPos{}
	for _, m := range all {
		if m.Partition == "a" && m.Offset == 1 {
			slow = m.Pos
		}
	}
	b, err := s.ReadFollow(ctx, queue.FollowTarget{Queue: "fg"}, slow, 10)
	require.NoError(t, err)
	require.NotNil(t, b.Gone, "the deleted messages after the position are reported")
	require.Len(t, b.Messages, 1)
	assert.Equal(t, int64(3), b.Messages[0].Offset)

	// The partition's own follow: a:2 is gone after a:1.
	pb, err := s.ReadFollow(ctx, queue.FollowTarget{Queue: "fg", Partition: "a"}, slow, 10)
	require.NoError(t, err)
	require.NotNil(t, pb.Gone)
	assert.EqualValues(t, 2, pb.Gone.Offset)
	// Partition b from its offset 1 (read before): nothing lost.
	var bpos queue.FollowPos
	for _, m := range all {
		if m.Partition == "b" {
			bpos = m.Pos
		}
	}
	pb, err = s.ReadFollow(ctx, queue.FollowTarget{Queue: "fg", Partition: "b"}, bpos, 10)
	require.NoError(t, err)
	assert.Nil(t, pb.Gone)

	// Caught up: no gap.
	b, err = s.ReadFollow(ctx, queue.FollowTarget{Queue: "fg"}, all[3].Pos, 10)
	require.NoError(t, err)
	assert.Nil(t, b.Gone)
}
