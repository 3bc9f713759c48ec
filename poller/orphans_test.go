package poller_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/queue/queuetest"
)

// newProxiedEnv is newEnv with the poller's store behind a pgtest.Proxy,
// whose cuts break the poller's connections.
func newProxiedEnv(t *testing.T, cfg ...func(*poller.Config)) (*env, *pgtest.Proxy) {
	t.Helper()
	proxy, dsn := pgtest.NewProxy(t, pgtest.DSN(t))
	store := queuetest.NewStoreDSN(t, dsn)
	c := poller.Config{Store: store}
	for _, f := range cfg {
		f(&c)
	}
	p, err := poller.New(c)
	require.NoError(t, err)
	t.Cleanup(p.Start())
	return &env{t: t, store: store, p: p}, proxy
}

// armed waits for a proxy's armed cut to happen.
func armed(t *testing.T, cut <-chan struct{}) {
	t.Helper()
	select {
	case <-cut:
	case <-time.After(10 * time.Second):
		t.Fatal("the statement whose answer the proxy cuts never ran")
	}
}

// A pop whose statement committed its lease but whose answer was lost
// (the connection broke while the rows were on their way) leaves nobody
// holding the messages: they are given back at once, with no attempt
// charged, and the waiting consumer gets them within seconds, not after
// the lease time (5 min) with retryCount 1. The safety sweep is slowed to
// a minute, so it cannot be what delivers them.
func TestPoller_LostPopAnswerIsGivenBackUncharged(t *testing.T) {
	for _, standing := range []bool{false, true} {
		t.Run(map[bool]string{false: "LongPoll", true: "Subscription"}[standing], func(t *testing.T) {
			e, proxy := newProxiedEnv(t, slowSweep)
			e.push("q", "p", 1, 2) // before anyone waits: no hand-off, a pop takes them
			cut := proxy.CutAnswer("intention")
			start := time.Now()
			var res *queue.PopResult
			if standing {
				_, got := e.subscribe(poller.Intention{Target: queue.Target{Queue: "q"}, Batch: 10, Credit: 10})
				armed(t, cut)
				res = receive1(t, got)
			} else {
				w := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q"}, Batch: 10})
				armed(t, cut)
				res = receive(t, w, 5*time.Second)
			}
			t.Logf("lost answer → delivery: %v", time.Since(start))
			assert.Equal(t, []int{1, 2}, ns(res))
			for _, m := range res.Messages {
				assert.Zero(t, m.RetryCount, "no attempt charged for a delivery that never happened")
			}
		})
	}
}

// A push that leased its messages to a waiting subscription (the hand-off)
// and whose answer was lost after its commit: the producer gets an error,
// the lease it may have taken is given back, and the subscription gets the
// messages within seconds, uncharged.
func TestPoller_LostHandOffAnswerIsGivenBackUncharged(t *testing.T) {
	e, proxy := newProxiedEnv(t, slowSweep)
	in, got := e.subscribe(poller.Intention{Target: queue.Target{Queue: "h"}, Batch: 10, Credit: 100})
	e.push("h", "p", 0, 0) // registers the group, learns the partition
	ackAll(t, e, in, receive1(t, got))
	e.settled()

	cut := proxy.CutAnswer(`"cut": "here"`) // the push's whole answer, its commit's too, is dropped
	var items []queue.PushItem
	for i := 1; i <= 2; i++ {
		items = append(items, queue.PushItem{Queue: "h", Partition: "p", Payload: json.RawMessage(fmt.Sprintf(`{"n": %d, "cut": "here"}`, i))})
	}
	start := time.Now()
	_, err := e.store.Push(context.Background(), items)
	require.Error(t, err, "the push's answer was cut")
	armed(t, cut)
	res := receive1(t, got)
	t.Logf("lost push answer → delivery: %v", time.Since(start))
	assert.Equal(t, []int{1, 2}, ns(res), "the push had committed")
	for _, m := range res.Messages {
		assert.Zero(t, m.RetryCount, "no attempt charged for a delivery that never happened")
	}
}

// A push handing messages to a stream's following lease whose answer was
// lost (its commit may have landed, its messages never delivered): what it
// handed is read back and delivered under the lease, uncharged, followed
// in order by a push after it, whose delivery had waited behind the lost
// one's (it stalled the partition when nothing delivered the lost one's).
func TestPoller_LostFollowingHandOffAnswerIsReadBackUncharged(t *testing.T) {
	e, proxy := newProxiedEnv(t, slowSweep, stickyFollow)
	in, got, lease := followingStream(t, e, "h")

	cut := proxy.CutAnswer(`"cut": "here"`)
	_, err := e.store.Push(context.Background(), []queue.PushItem{{Queue: "h", Partition: "p",
		Payload: json.RawMessage(`{"n": 3, "cut": "here"}`)}})
	require.Error(t, err, "the push's answer was cut")
	armed(t, cut)
	e.push("h", "p", 4, 4)

	again := receiveAcking(t, e, in, got, 2)
	assert.Equal(t, []int{3, 4}, ns(&queue.PopResult{Messages: again}), "from the first unacked, in order")
	for _, m := range again {
		assert.Zero(t, m.RetryCount, "no attempt charged for a delivery that never happened")
		assert.Equal(t, lease, m.LeaseID, "under the lease the stream holds")
	}
}

// A push handing messages to a stream's following lease whose answer was
// lost (its commit landed, the answer never came), while the stream holds a
// message of that lease it has not acked: the lease stays the stream's, and
// what the push handed it is read back from the database and delivered
// under it, in order, before the next push's messages. Nothing the stream
// was delivered comes again, nothing is lost, and every ack under the lease
// is taken.
func TestPoller_LostFollowingHandOffAnswerKeepsTheLeaseAndItsOrder(t *testing.T) {
	e, proxy := newProxiedEnv(t, slowSweep, stickyFollow)
	in, got, lease := followingStream(t, e, "h")
	e.push("h", "p", 3, 3)
	held := receive1(t, got)
	require.Equal(t, []int{3}, ns(held))
	require.Equal(t, lease, held.LeaseID, "handed under the following lease")

	cut := proxy.CutAnswer(`"cut": "here"`)
	_, err := e.store.Push(context.Background(), []queue.PushItem{{Queue: "h", Partition: "p",
		Payload: json.RawMessage(`{"n": 4, "cut": "here"}`)}})
	require.Error(t, err, "the push's answer was cut")
	armed(t, cut)
	e.push("h", "p", 5, 5)

	var seen []queue.Message
	for len(seen) < 2 {
		seen = append(seen, receive1(t, got).Messages...)
	}
	assert.Equal(t, []int{4, 5}, ns(&queue.PopResult{Messages: seen}), "the lost push's message, then the next push's, each once")
	for _, m := range seen {
		assert.Equal(t, lease, m.LeaseID, "under the lease the stream holds")
		assert.Zero(t, m.RetryCount, "no attempt charged")
	}
	for i, r := range ackAs(t, e, in, queue.StatusCompleted, append(held.Messages, seen...)...) {
		assert.True(t, r.Success, "ack %d under the kept lease: %s", i, r.Error)
	}
	// Anything delivered twice would come before the next push's message.
	e.push("h", "p", 6, 6)
	next := receive1(t, got)
	assert.Equal(t, []int{6}, ns(next), "nothing delivered again")
	assert.Equal(t, lease, next.LeaseID, "still the same lease")
}

// The same with a push that never committed: its backend was terminated
// while it waited for the partition's lock (a FATAL error: the outcome is
// unknown to the client). The read finds nothing, the lease stays, and the
// next push's message, which took the offset the lost one would have, is
// delivered under it at once: nothing comes twice, nothing waits.
func TestPoller_LostFollowingHandOffThatNeverCommittedLeavesNoGap(t *testing.T) {
	e, _ := newProxiedEnv(t, slowSweep, stickyFollow)
	in, got, lease := followingStream(t, e, "h")
	e.push("h", "p", 3, 3)
	held := receive1(t, got)
	require.Equal(t, []int{3}, ns(held))

	ctx := context.Background()
	blocker, err := e.store.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(ctx) }()
	_, err = blocker.Exec(ctx, `SELECT 1 FROM partitions WHERE name = 'p' FOR NO KEY UPDATE`)
	require.NoError(t, err)
	pushed := make(chan error, 1)
	go func() {
		_, err := e.store.Push(ctx, []queue.PushItem{{Queue: "h", Partition: "p", Payload: json.RawMessage(`{"n": 4}`)}})
		pushed <- err
	}()
	var pid int
	eventually(t, 10*time.Second, func() bool {
		return e.store.Pool().QueryRow(ctx, `SELECT pid FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%herald:push_lock%'`).Scan(&pid) == nil
	}, "the push waits for the partition's lock")
	_, err = e.store.Pool().Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)
	select {
	case err := <-pushed:
		require.Error(t, err)
		require.True(t, queue.OutcomeUnknown(err), "the push's outcome is unknown: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the push never returned")
	}
	require.NoError(t, blocker.Rollback(ctx))

	e.push("h", "p", 5, 5)
	next := receive1(t, got)
	assert.Equal(t, []int{5}, ns(next), "the next push's message, at once, nothing before it")
	assert.Equal(t, lease, next.LeaseID, "under the lease the stream holds")
	assert.Equal(t, held.Messages[0].Offset+1, next.Messages[0].Offset, "the lost push took no offset")
	for i, r := range ackAs(t, e, in, queue.StatusCompleted, held.Messages[0], next.Messages[0]) {
		assert.True(t, r.Success, "ack %d under the kept lease: %s", i, r.Error)
	}
	e.push("h", "p", 6, 6)
	assert.Equal(t, []int{6}, ns(receive1(t, got)), "nothing delivered again")
}
