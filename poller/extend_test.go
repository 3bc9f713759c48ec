package poller_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/queue/queuetest"
)

// extendingStream subscribes a stream that a push may extend the lease of
// (as a WebSocket subscription is) to queue q, and has it hold partition
// p's lease over message 1: the first delivery, not acked.
func extendingStream(t *testing.T, e *env, q string) (*poller.Intention, <-chan *queue.PopResult, *queue.PopResult) {
	t.Helper()
	in, got := e.subscribe(poller.Intention{Target: queue.Target{Queue: q}, Batch: 10, Credit: 100, Extend: true})
	e.push(q, "p", 1, 1)
	first := receive1(t, got)
	require.Equal(t, []int{1}, ns(first))
	require.NotEmpty(t, first.LeaseID)
	return in, got, first
}

// stickyFollow keeps an idle following lease a minute (Config.FollowIdle),
// so that a test's next push after its acks finds it on a busy machine.
func stickyFollow(c *poller.Config) { c.FollowIdle = time.Minute }

// followingStream is extendingStream whose lease follows the partition, all
// it holds acked: a second push extends it (or the first push's hand-off
// made it follow), and both messages are acked.
func followingStream(t *testing.T, e *env, q string) (*poller.Intention, <-chan *queue.PopResult, string) {
	t.Helper()
	in, got, first := extendingStream(t, e, q)
	return in, got, follow(t, e, q, in, got, first)
}

// follow has the stream in, which holds first's lease, follow the
// partition: see followingStream. It returns the lease.
func follow(t *testing.T, e *env, q string, in *poller.Intention, got <-chan *queue.PopResult, first *queue.PopResult) string {
	t.Helper()
	e.push(q, "p", 2, 2)
	second := receive1(t, got)
	require.Equal(t, first.LeaseID, second.LeaseID, "extended over the second push")
	r := ackAs(t, e, in, queue.StatusCompleted, first.Messages[0], second.Messages[0])
	require.True(t, r[0].Success && r[1].Success && !r[1].LeaseReleased, "the lease stays, following: %+v", r)
	return first.LeaseID
}

// ackAs acknowledges msgs with status under the lease each names and does
// what the gateway does after: a released lease is told to the poller
// (and its partition woken when messages wait), the credit comes back.
func ackAs(t *testing.T, e *env, in *poller.Intention, status queue.AckStatus, msgs ...queue.Message) []queue.AckResult {
	t.Helper()
	var acks []queue.Ack
	for _, m := range msgs {
		acks = append(acks, queue.Ack{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID,
			Group: m.Group, Status: status})
	}
	out, err := e.store.Ack(context.Background(), acks)
	require.NoError(t, err)
	for i, r := range out {
		if r.Idle {
			m := msgs[i]
			e.p.FollowIdle(m.Queue, m.Partition, m.PartitionID, m.Group, r.LeaseID)
		}
		if !r.LeaseReleased {
			continue
		}
		m := msgs[i]
		e.p.LeaseReleased(m.Queue, m.Partition, m.PartitionID, m.Group)
		if r.Pending {
			e.p.Wake(poller.SourceAck, m.Queue, m.Partition)
		}
	}
	e.p.AddCredit(in, len(msgs))
	return out
}

// receiveAcking receives n messages, acking each delivery as it comes
// (a failed message may come alone, the rest after its ack).
func receiveAcking(t *testing.T, e *env, in *poller.Intention, got <-chan *queue.PopResult, n int) []queue.Message {
	t.Helper()
	var out []queue.Message
	for len(out) < n {
		res := receive1(t, got)
		out = append(out, res.Messages...)
		for _, r := range ackAs(t, e, in, queue.StatusCompleted, res.Messages...) {
			require.True(t, r.Success, r.Error)
		}
	}
	return out
}

// A stream holding a partition gets the partition's next push while its
// earlier message is still unacked: the push extends the lease over it,
// with no pop and no pre-flight, and from then on the lease follows the
// partition: later pushes hand it their messages without writing its
// consumer row, which an ack holds locked through its commit.
func TestExtend_StreamHoldingAPartitionGetsItsNextPushBeforeItsAck(t *testing.T) {
	e := newEnv(t, slowSweep, stickyFollow)
	in, got, first := extendingStream(t, e, "x")
	e.settled()
	stats := e.store.QueryStats()
	before := stats.Snapshot()

	e.push("x", "p", 2, 2)
	second := receive1(t, got)
	assert.Equal(t, []int{2}, ns(second))
	assert.Equal(t, first.LeaseID, second.LeaseID, "under the lease the stream holds")
	row := consumerRowVersion(t, e, "x")
	e.push("x", "p", 3, 4)
	third := receive1(t, got)
	assert.Equal(t, []int{3, 4}, ns(third))
	assert.Equal(t, first.LeaseID, third.LeaseID)
	assert.Equal(t, row, consumerRowVersion(t, e, "x"), "a push to a following lease does not write the consumer row")
	e.settled()
	ops := opsBetween(before, stats.Snapshot())
	assert.Zero(t, ops["pop_assigned"], "no pop: %v", ops)
	assert.Zero(t, ops["preflight"], "no pre-flight: %v", ops)
	assert.Equal(t, uint64(2), ops["push_insert"], "the statement with the steps of a stream's lease: %v", ops)

	r := ackAs(t, e, in, queue.StatusCompleted, first.Messages[0], second.Messages[0])
	assert.True(t, r[0].Success && r[1].Success, "%v", r)
	assert.False(t, r[1].LeaseReleased, "the lease holds 3 and 4 still")
	r = ackAs(t, e, in, queue.StatusCompleted, third.Messages...)
	assert.True(t, r[0].Success && r[1].Success, "%v", r)
	assert.False(t, r[1].LeaseReleased, "a following lease stays when all it holds is done")
	e.push("x", "p", 5, 5)
	fifth := receive1(t, got)
	assert.Equal(t, []int{5}, ns(fifth))
	assert.Equal(t, first.LeaseID, fifth.LeaseID, "the next push is handed under it")
	assert.True(t, ackAs(t, e, in, queue.StatusCompleted, fifth.Messages...)[0].Success)
}

// consumerRowVersion is the version (xmin, ctid) of queue q's consumer row
// for partition p and the default group: it changes with every write.
func consumerRowVersion(t *testing.T, e *env, q string) string {
	t.Helper()
	var v string
	err := e.store.Pool().QueryRow(context.Background(), `SELECT c.xmin::text || c.ctid::text FROM consumers c
		JOIN partitions p ON p.id = c.partition_id JOIN queues qu ON qu.id = p.queue_id
		WHERE qu.name = $1 AND p.name = 'p' AND c.consumer_group = $2`, q, queue.DefaultGroup).Scan(&v)
	require.NoError(t, err)
	return v
}

// A nack under an extended lease gives back from the first unacked
// message, as for any lease: what followed it comes again in order, the
// failed one with its attempt counted, and acks under the ended lease are
// refused.
func TestExtend_NackRedeliversFromTheFirstUnacked(t *testing.T) {
	e := newEnv(t, slowSweep, stickyFollow)
	in, got, first := extendingStream(t, e, "x")
	e.push("x", "p", 2, 2)
	second := receive1(t, got)
	e.push("x", "p", 3, 3)
	third := receive1(t, got)
	require.Equal(t, first.LeaseID, third.LeaseID)

	require.True(t, ackAs(t, e, in, queue.StatusCompleted, first.Messages[0])[0].Success)
	r := ackAs(t, e, in, queue.StatusFailed, second.Messages[0])
	require.True(t, r[0].Success, r[0].Error)
	assert.True(t, r[0].LeaseReleased, "the nack ends the lease")
	r = ackAs(t, e, in, queue.StatusCompleted, third.Messages[0])
	assert.Equal(t, queue.ErrTextInvalidLease, r[0].Error, "3 was extended over the ended lease")

	again := receiveAcking(t, e, in, got, 2)
	assert.Equal(t, []int{2, 3}, ns(&queue.PopResult{Messages: again}), "from the first unacked, in order")
	assert.Equal(t, 1, again[0].RetryCount, "the nack counted an attempt")
	assert.NotEqual(t, first.LeaseID, again[0].LeaseID, "under a new lease")
}

// An extended lease that expires (its consumer stopped acking) gives back
// from its first unacked message, as any lease: everything it was extended
// over comes again, in order, with an attempt counted.
func TestExtend_ExpiryRedeliversFromTheFirstUnacked(t *testing.T) {
	e := newEnv(t, slowSweep, stickyFollow)
	_, err := e.store.Configure(context.Background(), queue.ConfigureRequest{Queue: "x", Options: []byte(`{"leaseTime":1}`)})
	require.NoError(t, err)
	in, got, first := extendingStream(t, e, "x")
	e.push("x", "p", 2, 2)
	second := receive1(t, got)
	require.Equal(t, first.LeaseID, second.LeaseID)
	// The stream looks again, as a WebSocket session's lease check has it
	// do: its pre-flight finds the partition blocked until the lease's
	// expiry, which arms the poller's timer (no ack ever comes).
	e.p.AddCredit(in, 0)

	again := receiveAcking(t, e, in, got, 2)
	assert.Equal(t, []int{1, 2}, ns(&queue.PopResult{Messages: again}))
	assert.Equal(t, 1, again[0].RetryCount, "the expiry counted an attempt")
	assert.NotEqual(t, first.LeaseID, again[0].LeaseID)
}

// Two pushes extending one stream's lease at once reach it in offset
// order: the later one's answer, come first, waits for the earlier's
// delivery.
func TestExtend_TwoPushesInFlightAreDeliveredInOrder(t *testing.T) {
	e := newEnv(t, slowSweep, stickyFollow)
	_, got, _ := extendingStream(t, e, "x")
	e.settled()
	entered, release := make(chan struct{}), make(chan struct{})
	var once bool
	t.Cleanup(e.p.AfterSettle(func() {
		if !once {
			once = true // only the first push's Settle runs the hook: the second parks before it
			close(entered)
			<-release
		}
	}))
	pushed := make(chan struct{})
	go func() {
		defer close(pushed)
		e.push("x", "p", 2, 2)
	}()
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the first push's hand-off was not settled")
	}
	e.push("x", "p", 3, 3) // its Settle comes while 2's delivery waits
	select {
	case res := <-got:
		t.Fatalf("delivered %v before 2", ns(res))
	default:
	}
	close(release)
	<-pushed
	assert.Equal(t, []int{2}, ns(receive1(t, got)))
	assert.Equal(t, []int{3}, ns(receive1(t, got)))
}

// A message pushed where no hand-off reserved it (another instance) is
// never extended over: a later push here is not handed past it, and both
// come in order once the stream's lease ends.
func TestExtend_PushElsewhereStopsTheExtensionUntilTheLeaseEnds(t *testing.T) {
	e := newEnv(t, slowSweep, stickyFollow)
	in, got, first := extendingStream(t, e, "x")
	e.store.SetHandOff(nil) // a push through another instance
	before := e.store.QueryStats().Snapshot()
	_, err := e.store.Push(context.Background(), []queue.PushItem{{Queue: "x", Partition: "p", Payload: []byte(`{"n":2}`)}})
	require.NoError(t, err)
	require.Equal(t, before["push_insert_lean"]+1, e.store.QueryStats().Snapshot()["push_insert_lean"],
		"the push with no reservation sends the statement without the hand-off's steps")
	e.store.SetHandOff(e.p)
	e.push("x", "p", 3, 3)
	select {
	case res := <-got:
		t.Fatalf("delivered %v while 1's lease holds", ns(res))
	case <-time.After(300 * time.Millisecond):
	}
	r := ackAs(t, e, in, queue.StatusCompleted, first.Messages[0])
	require.True(t, r[0].LeaseReleased && r[0].Pending, "%+v", r[0])
	var next []queue.Message
	for len(next) < 2 {
		next = append(next, receive1(t, got).Messages...)
	}
	assert.Equal(t, []int{2, 3}, ns(&queue.PopResult{Messages: next}))
}

// A following lease that expires after its last ack (its consumer stopped
// acking) counts an attempt on the first message a push handed it since,
// which the database's lease_to does not reach, and gives it back: the
// lease's end is read as the partition's last offset. The session's lease
// check (HeldLeases) brings the row's copy up and wakes the partition, as
// the WebSocket session does.
func TestExtend_ExpiryCountsAnAttemptOnAMessageHandedSinceTheLastAck(t *testing.T) {
	e := newEnv(t, slowSweep, stickyFollow)
	_, err := e.store.Configure(context.Background(), queue.ConfigureRequest{Queue: "x", Options: []byte(`{"leaseTime":1}`)})
	require.NoError(t, err)
	_, got, lease := followingStream(t, e, "x")
	e.push("x", "p", 3, 3)
	third := receive1(t, got)
	require.Equal(t, lease, third.LeaseID, "handed under the following lease")

	var again *queue.PopResult
	deadline := time.Now().Add(10 * time.Second)
	for again == nil && time.Now().Before(deadline) {
		held, err := e.store.HeldLeases(context.Background(), queue.DefaultGroup, []string{third.PartitionID})
		require.NoError(t, err)
		if held[third.PartitionID].Lapsed {
			e.p.Wake(poller.SourceAck, "x", "p")
		}
		select {
		case again = <-got:
		case <-time.After(100 * time.Millisecond):
		}
	}
	require.NotNil(t, again, "message 3 came back after the lease's expiry")
	assert.Equal(t, []int{3}, ns(again))
	assert.Equal(t, 1, again.Messages[0].RetryCount, "the expiry counted an attempt on it")
	assert.NotEqual(t, lease, again.LeaseID)
}

// A stream that ends gives back, with its following lease, the messages
// pushes handed it without writing its row: they are ready for any
// consumer at once, not when a repair finds them.
func TestExtend_StreamEndGivesBackWhatFollowingPushesHandedIt(t *testing.T) {
	e := newEnv(t, slowSweep, stickyFollow)
	got := make(chan *queue.PopResult, 100)
	in := &poller.Intention{Target: queue.Target{Queue: "x"}, Batch: 10, Credit: 100, Extend: true, Standing: true,
		Deliver: func(res *queue.PopResult) bool { got <- res; return true }}
	cancel := e.p.Register(in)
	e.push("x", "p", 1, 1)
	first := receive1(t, got)
	lease := follow(t, e, "x", in, got, first)
	e.push("x", "p", 3, 3)
	third := receive1(t, got)
	require.Equal(t, lease, third.LeaseID)
	cancel()                                                              // the stream ends
	require.NoError(t, e.store.ReleaseLease(context.Background(), lease)) // and the gateway gives its leases back

	res, err := e.store.Pop(context.Background(), queue.PopRequest{Queue: "x", Batch: 10})
	require.NoError(t, err)
	assert.Equal(t, []int{3}, ns(res), "the released message is ready for the group's next pop")
}

// A push through another instance ends an idle following lease (all it
// holds acked) in its own statement: its message is popped for the stream
// under a new lease, with no wait for the lease's time.
func TestExtend_PushElsewhereEndsAnIdleFollowingLease(t *testing.T) {
	e := newEnv(t, slowSweep, stickyFollow)
	_, got, lease := followingStream(t, e, "x")
	e.store.SetHandOff(nil) // a push through another instance
	before := e.store.QueryStats().Snapshot()
	_, err := e.store.Push(context.Background(), []queue.PushItem{{Queue: "x", Partition: "p", Payload: []byte(`{"n":3}`)}})
	require.NoError(t, err)
	require.Equal(t, before["push_insert_lean"]+1, e.store.QueryStats().Snapshot()["push_insert_lean"],
		"the push with no reservation sends the statement without the hand-off's steps")
	e.store.SetHandOff(e.p)
	e.p.Wake("notify", "x", "p") // its NOTIFY, as pgnotify tells it
	next := receive1(t, got)
	assert.Equal(t, []int{3}, ns(next))
	assert.NotEqual(t, lease, next.LeaseID, "under a new lease")
}

// A following lease left idle (all it holds acked, no push here since) is
// given back after Config.FollowIdle: the partition is free for any
// consumer, and the stream's next push is handed under a new lease.
func TestExtend_IdleFollowingLeaseIsGivenBack(t *testing.T) {
	e := newEnv(t, slowSweep, func(c *poller.Config) { c.FollowIdle = 50 * time.Millisecond })
	_, got, lease := followingStream(t, e, "x")
	eventually(t, 10*time.Second, func() bool {
		held, err := e.store.HeldLeases(context.Background(), queue.DefaultGroup, []string{partitionIDOf(t, e, "x")})
		require.NoError(t, err)
		for _, h := range held {
			if h.LeaseID != "" {
				return false
			}
		}
		return true
	}, "the idle lease is given back")
	e.push("x", "p", 3, 3)
	next := receive1(t, got)
	assert.Equal(t, []int{3}, ns(next))
	assert.NotEqual(t, lease, next.LeaseID, "under a new lease")
}

// A following lease that goes idle as the poller stops is not given back
// once it has stopped: the release would be a statement after Run
// returned (on a pool the server closes next); the lease lapses with its
// lease time, as one of a stopped instance does. Its FollowIdle (1 s)
// passes while the test watches the lease for 3 s after the stop.
func TestExtend_IdleFollowingLeaseIsNotGivenBackAfterThePollerStopped(t *testing.T) {
	store := queuetest.NewStore(t)
	p, err := poller.New(poller.Config{Store: store, SweepMin: time.Minute, SweepMax: time.Minute, FollowIdle: time.Second})
	require.NoError(t, err)
	stop := p.Start()
	defer stop()
	e := &env{t: t, store: store, p: p}
	_, _, lease := followingStream(t, e, "x") // its acks arm FollowIdle
	stop()
	partition := partitionIDOf(t, e, "x")
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); <-tick.C {
		held, err := store.HeldLeases(context.Background(), queue.DefaultGroup, []string{partition})
		require.NoError(t, err)
		require.Equal(t, lease, held[partition].LeaseID, "the lease given back after the poller stopped")
	}
}

// partitionIDOf is the id of queue q's partition p.
func partitionIDOf(t *testing.T, e *env, q string) string {
	t.Helper()
	var id string
	require.NoError(t, e.store.Pool().QueryRow(context.Background(), `SELECT p.id::text FROM partitions p
		JOIN queues qu ON qu.id = p.queue_id WHERE qu.name = $1 AND p.name = 'p'`, q).Scan(&id))
	return id
}

// A push that hands a stream messages under the lease it holds leaves each
// of them at least half the queue's lease time from its hand-off, however
// little of the lease was left: a lease with less than that is renewed in
// the push's statement (its time starts again), as an ack renews it, so a
// message handed late in a lease is not given back before its consumer
// could ack it. With more than half left a push to a following lease still
// only reads the row (TestExtend_StreamHoldingAPartitionGetsItsNextPushBeforeItsAck).
// Lease time 2 s: the test waits, on the database's clock, until less than
// 0.9 s of the lease is left, and pushes.
func TestExtend_HandOffLeavesEachMessageAtLeastHalfItsLeaseTime(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lease func(t *testing.T, e *env) (<-chan *queue.PopResult, string)
	}{
		{"lease holding an unacked message", func(t *testing.T, e *env) (<-chan *queue.PopResult, string) {
			_, got, first := extendingStream(t, e, "x")
			return got, first.LeaseID
		}},
		{"following lease all acked", func(t *testing.T, e *env) (<-chan *queue.PopResult, string) {
			_, got, lease := followingStream(t, e, "x")
			return got, lease
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, slowSweep, stickyFollow)
			ctx := context.Background()
			_, err := e.store.Configure(ctx, queue.ConfigureRequest{Queue: "x", Options: []byte(`{"leaseTime":2}`)})
			require.NoError(t, err)
			got, lease := tc.lease(t, e)
			pid := partitionIDOf(t, e, "x")
			left := func() time.Duration {
				var ms float64
				require.NoError(t, e.store.Pool().QueryRow(ctx, `SELECT extract(epoch FROM lease_expires_at - clock_timestamp()) * 1000
					FROM consumers WHERE partition_id = $1::uuid AND consumer_group = $2 AND lease_id = $3::uuid`,
					pid, queue.DefaultGroup, lease).Scan(&ms))
				return time.Duration(ms * float64(time.Millisecond))
			}
			eventually(t, 10*time.Second, func() bool { return left() < 900*time.Millisecond },
				"less than half of the lease's time is left")

			var pushedAt time.Time
			require.NoError(t, e.store.Pool().QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&pushedAt))
			e.push("x", "p", 9, 9)
			res := receive1(t, got)
			require.Equal(t, []int{9}, ns(res))
			require.Equal(t, lease, res.LeaseID, "handed under the lease the stream holds")
			var expires time.Time
			require.NoError(t, e.store.Pool().QueryRow(ctx, `SELECT lease_expires_at FROM consumers
				WHERE partition_id = $1::uuid AND consumer_group = $2 AND lease_id = $3::uuid`,
				pid, queue.DefaultGroup, lease).Scan(&expires))
			assert.GreaterOrEqual(t, expires.Sub(pushedAt), time.Second,
				"the message handed has at least half the lease time (1 s of 2 s) from its hand-off")
		})
	}
}

// A following lease whose messages are all acked stays held for the next
// push, but holds nothing: the queue's status (the demo page's "leased")
// counts no partition under it, as for a group with nothing in flight.
func TestExtend_AckedFollowingLeaseIsNotCountedAsLeased(t *testing.T) {
	e := newEnv(t, slowSweep, stickyFollow)
	followingStream(t, e, "x")
	pid := partitionIDOf(t, e, "x")
	held, err := e.store.HeldLeases(context.Background(), queue.DefaultGroup, []string{pid})
	require.NoError(t, err)
	require.NotEmpty(t, held[pid].LeaseID, "the following lease is still held")
	st, err := e.store.QueueStatus(context.Background(), "x")
	require.NoError(t, err)
	require.Len(t, st.Groups, 1)
	assert.Equal(t, queue.GroupStatus{Group: queue.DefaultGroup, Lag: 0, Leased: 0}, st.Groups[0])
}

// A read-back of a lost hand-off retries with back-off while the database
// is away (up to half a minute); the poller's stop ends it, and Run returns
// only once it has: nothing of the poller's runs after its stop.
func TestExtend_ReadBackRetryingWhileTheDatabaseIsAwayEndsWithThePoller(t *testing.T) {
	others := goleak.IgnoreCurrent()
	pool, err := pgxpool.New(context.Background(), "postgres://herald@127.0.0.1:1/away?connect_timeout=1")
	require.NoError(t, err)
	store, err := queue.New(queue.Config{Pool: pool})
	require.NoError(t, err)
	p, err := poller.New(poller.Config{Store: store})
	require.NoError(t, err)
	stop := p.Start()
	failed := make(chan struct{}, 100)
	in := &poller.Intention{Target: queue.Target{Queue: "q"}, Standing: true, Extend: true, Batch: 10, Credit: 10,
		Deliver: func(*queue.PopResult) bool { return true }}
	defer p.ReadBackGap(in, "00000000-0000-0000-0000-000000000001", "00000000-0000-7000-8000-000000000002", func() { failed <- struct{}{} })()
	select {
	case <-failed:
	case <-time.After(10 * time.Second):
		t.Fatal("the read-back never ran")
	}
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the poller's stop waited for the read-back's back-off")
	}
	pool.Close()
	goleak.VerifyNone(t, others, goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
}

// A stream that subscribes to a queue whose partitions hold a backlog
// while pushes to them go on (its first pops race the pushes' hand-offs
// and extensions of the leases they take) gets every message, and once it
// acked them all holds no ordinary lease: each lease it was handed under
// was delivered whole, so its acks ended it or it still follows its
// partition.
func TestExtend_SubscriptionStartingOnABacklogWhilePushesGoOnGetsEveryMessage(t *testing.T) {
	const partitions, backlog, pushed, rounds, producers = 16, 25, 600, 9, 3
	e := newEnv(t, slowSweep)
	ctx := context.Background()
	for round := range rounds {
		batch, credit := 100, 1000
		if round%2 == 1 {
			batch, credit = 10, 40 // short of credit: pushes find it not ready, and close its following leases
		}
		q := fmt.Sprintf("start%d", round)
		n := 0
		var items []queue.PushItem
		for i := range partitions * backlog {
			n++
			items = append(items, queue.PushItem{Queue: q, Partition: fmt.Sprintf("p%d", i%partitions),
				Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, n))})
		}
		_, err := e.store.Push(ctx, items)
		require.NoError(t, err)

		// Two producers pushing one message at a time, round the partitions.
		var next atomic.Int64
		next.Store(int64(n))
		pushErr := make(chan error, producers)
		for range producers {
			go func() {
				for {
					v := next.Add(1)
					if v > int64(n+pushed) {
						pushErr <- nil
						return
					}
					part := fmt.Sprintf("p%d", v%partitions)
					if _, err := e.store.Push(ctx, []queue.PushItem{{Queue: q, Partition: part,
						Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, v))}}); err != nil {
						pushErr <- err
						return
					}
					e.p.Wake(poller.SourcePush, q, part)
				}
			}()
		}
		// As a WebSocket session's: held while deliveries wait to be written.
		var waiting atomic.Int64
		got := make(chan *queue.PopResult, 1000)
		in := &poller.Intention{Target: queue.Target{Queue: q}, Batch: batch, Credit: credit, Extend: true, Standing: true,
			Deliver: func(res *queue.PopResult) bool { waiting.Add(1); got <- res; return true }}
		if round%3 == 2 {
			in.Hold = func() bool { return waiting.Load() >= 2 }
		}
		t.Cleanup(e.p.Register(in))
		// Odd rounds ack as the SDK and the session do: a batch of
		// whatever came meanwhile, its effects told the poller after.
		toAck, ackErr := make(chan []queue.Message, 1000), make(chan error, 1)
		ackDone := make(chan struct{})
		go func() {
			defer close(ackDone)
			for msgs := range toAck {
				for more := true; more; {
					select {
					case m, ok := <-toAck:
						if !ok {
							more = false
							break
						}
						msgs = append(msgs, m...)
					default:
						more = false
					}
				}
				if err := ackEffects(e, in, msgs); err != nil {
					select {
					case ackErr <- err:
					default:
					}
				}
			}
		}()
		want := n + pushed
		seen := map[int]bool{}
		deadline := time.After(10 * time.Second)
	receiving:
		for len(seen) < want {
			select {
			case res := <-got:
				waiting.Add(-1)
				for _, v := range ns(res) {
					seen[v] = true
				}
				if round%2 == 0 {
					for _, r := range ackAs(t, e, in, queue.StatusCompleted, res.Messages...) {
						require.True(t, r.Success, "round %d: %s", round, r.Error)
					}
				} else {
					toAck <- res.Messages
				}
			case <-deadline:
				break receiving
			}
		}
		close(toAck)
		<-ackDone
		for range producers {
			require.NoError(t, <-pushErr)
		}
		select {
		case err := <-ackErr:
			t.Fatalf("round %d: %v", round, err)
		default:
		}
		if len(seen) < want {
			t.Fatalf("round %d: %d of %d messages delivered within 10 s; the partitions:\n%s", round, len(seen), want, consumerRows(t, e, q))
		}
		eventually(t, 5*time.Second, func() bool { return ordinaryLeases(t, e, q) == 0 },
			fmt.Sprintf("round %d: an ordinary lease left held once all was acked", round))
	}
}

// ackEffects completes msgs and does what the gateway does after (ackAs),
// off the test's goroutine.
func ackEffects(e *env, in *poller.Intention, msgs []queue.Message) error {
	var acks []queue.Ack
	for _, m := range msgs {
		acks = append(acks, queue.Ack{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID,
			Group: m.Group, Status: queue.StatusCompleted})
	}
	out, err := e.store.Ack(context.Background(), acks)
	if err != nil {
		return err
	}
	for i, r := range out {
		m := msgs[i]
		if !r.Success {
			return fmt.Errorf("ack of %s offset %d: %s", m.Partition, m.Offset, r.Error)
		}
		if r.Idle {
			e.p.FollowIdle(m.Queue, m.Partition, m.PartitionID, m.Group, r.LeaseID)
		}
		if r.LeaseReleased {
			e.p.LeaseReleased(m.Queue, m.Partition, m.PartitionID, m.Group)
			if r.Pending {
				e.p.Wake(poller.SourceAck, m.Queue, m.Partition)
			}
		}
	}
	e.p.AddCredit(in, len(msgs))
	return nil
}

// ordinaryLeases counts the leases held on queue q that do not follow
// their partition.
func ordinaryLeases(t *testing.T, e *env, q string) int {
	t.Helper()
	var n int
	err := e.store.Pool().QueryRow(context.Background(), `SELECT count(*) FROM consumers c JOIN queues qu ON qu.id = c.queue_id
		WHERE qu.name = $1 AND c.lease_id IS NOT NULL AND c.follow_lease IS DISTINCT FROM c.lease_id`, q).Scan(&n)
	require.NoError(t, err)
	return n
}

// consumerRows is queue q's consumer rows, one a line, for a failure's
// message.
func consumerRows(t *testing.T, e *env, q string) string {
	t.Helper()
	rows, err := e.store.Pool().Query(context.Background(), `SELECT p.name, p.last_offset, c.cursor, c.done::text,
		coalesce(c.lease_from, 0), coalesce(c.lease_to, 0), c.lease_id IS NOT NULL, coalesce(c.follow_lease = c.lease_id, false), c.delivered_to
		FROM consumers c JOIN partitions p ON p.id = c.partition_id JOIN queues qu ON qu.id = c.queue_id
		WHERE qu.name = $1 ORDER BY p.name`, q)
	require.NoError(t, err)
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var name, done string
		var last, cursor, from, to, delivered int64
		var leased, follow bool
		require.NoError(t, rows.Scan(&name, &last, &cursor, &done, &from, &to, &leased, &follow, &delivered))
		fmt.Fprintf(&b, "%s last=%d cursor=%d done=%s lease=%v [%d,%d] follow=%v delivered_to=%d\n",
			name, last, cursor, done, leased, from, to, follow, delivered)
	}
	require.NoError(t, rows.Err())
	return b.String()
}
