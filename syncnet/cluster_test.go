package syncnet_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/server"
	"github.com/heraldmq/herald/internal/server/servertest"
	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/syncnet"
)

// The seed's correctness table (UDPSYNC, "Scenario Analysis"): whatever the
// shared state says, wrongly or not, nothing is lost or delivered twice.
// Stale presence either way is in notify_test.go.

type leased struct {
	Messages []struct {
		TransactionID string `json:"transactionId"`
		PartitionID   string `json:"partitionId"`
		LeaseID       string `json:"leaseId"`
		Data          struct {
			I int `json:"i"`
		} `json:"data"`
	} `json:"messages"`
}

func decodeLeased(t *testing.T, body string) leased {
	t.Helper()
	var p leased
	require.NoError(t, json.Unmarshal([]byte(body), &p), body)
	return p
}

// ackAll acknowledges every message of a pop.
func ackAll(in *servertest.Instance, p leased) {
	in.T.Helper()
	for _, m := range p.Messages {
		status, body := in.Call(http.MethodPost, "/api/v1/ack", fmt.Sprintf(
			`{"transactionId":%q,"partitionId":%q,"leaseId":%q,"status":"completed","consumerGroup":"g"}`,
			m.TransactionID, m.PartitionID, m.LeaseID))
		require.Equal(in.T, http.StatusOK, status, body)
		require.Contains(in.T, body, `"success":true`)
	}
}

// waitLeased long-polls queue for group g without autoAck (a lease), and
// returns once it waits.
func waitLeased(in *servertest.Instance, queueName string, timeout time.Duration) <-chan servertest.Answer {
	in.T.Helper()
	return in.Waiting(fmt.Sprintf("/api/v1/pop/queue/%s?wait=true&timeout=%d&consumerGroup=g", queueName, timeout.Milliseconds()))
}

// hintScene: B holds the lease of queue's Default partition for group g
// (message 0) while A has a consumer of g waiting, and message 1 is pushed
// through A. It returns A's waiting pop and B's lease.
func hintScene(t *testing.T, a, b *servertest.Instance, queueName string) (<-chan servertest.Answer, leased) {
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("A: %+v", a.Node().Stats())
			t.Logf("B: %+v", b.Node().Stats())
		}
	})
	servertest.Link(a, b)
	// A lease time of 30 s: a hint lives 6 s, a lease 30 s; the sweep is
	// a minute (only wake-ups, timers and hints are at work).
	status, body := a.Call(http.MethodPost, "/api/v1/configure", fmt.Sprintf(`{"queue":%q,"options":{"leaseTime":30}}`, queueName))
	require.Equal(t, http.StatusOK, status, body)
	// A is present for the queue (a consumer of another group, on a
	// partition nobody pushes to), so B's hints reach it.
	_ = waitLeasedPartition(a, queueName, "elsewhere", 30*time.Second)
	require.Eventually(t, func() bool {
		has, known := b.Node().HasSubscribers(queueName)
		return known && has
	}, 10*time.Second, 10*time.Millisecond, "B knows A's consumer")
	a.Push(queueName, `{"i":0}`)
	status, body = b.Call(http.MethodGet, "/api/v1/pop/queue/"+queueName+"?consumerGroup=g", "")
	require.Equal(t, http.StatusOK, status, body)
	held := decodeLeased(t, body)
	require.Len(t, held.Messages, 1)
	// A's consumer registers; its first cycle (a pre-flight, which finds
	// the partition leased) must be over before the push, so that the
	// push's wake-up takes the hinted path.
	preflights := func() uint64 { return a.Store().QueryStats().Snapshot()["preflight"] }
	before := preflights()
	got := waitLeased(a, queueName, 30*time.Second)
	require.Eventually(t, func() bool { return preflights() > before }, 10*time.Second, time.Millisecond)
	return got, held
}

// waitLeasedPartition long-polls one partition for group "watch".
func waitLeasedPartition(in *servertest.Instance, queueName, partition string, timeout time.Duration) <-chan servertest.Answer {
	in.T.Helper()
	return in.Waiting(fmt.Sprintf("/api/v1/pop/queue/%s/partition/%s?wait=true&timeout=%d&consumerGroup=watch",
		queueName, partition, timeout.Milliseconds()))
}

// finish acks B's lease, waits for A to receive message 1, and checks that
// nothing else is left for the group: every message exactly once.
func finish(t *testing.T, a, b *servertest.Instance, queueName string, got <-chan servertest.Answer, held leased) time.Duration {
	t.Helper()
	assert.Equal(t, 0, held.Messages[0].Data.I)
	acked := time.Now()
	ackAll(b, held)
	// A hint lapses within 6 s; but when A asked the database instead (1
	// lookup in 100 audits the hint, or the key went to a pre-flight),
	// it was given the lease's own expiry (30 s) as the time to look
	// again.
	ceiling := 20 * time.Second
	if c := a.Node().Stats().Counters; c["hint:used"] == 0 || c["hint:audit"] > 0 {
		ceiling = 45 * time.Second
	}
	ans := servertest.Wait(t, got, ceiling)
	require.Equal(t, http.StatusOK, ans.Status, ans.Body)
	p := decodeLeased(t, ans.Body)
	require.Len(t, p.Messages, 1)
	assert.Equal(t, 1, p.Messages[0].Data.I)
	ackAll(a, p)
	for _, in := range []*servertest.Instance{a, b} {
		status, body := in.Call(http.MethodGet, "/api/v1/pop/queue/"+queueName+"?consumerGroup=g", "")
		assert.Equal(t, http.StatusNoContent, status, "nothing twice: %s", body)
	}
	return ans.At.Sub(acked)
}

// pushPastHint waits until A holds B's hint, pushes message 1 through A and
// waits until A's wake-up asked the hint (and, but for an audit, skipped
// the pop).
func pushPastHint(t *testing.T, a *servertest.Instance, queueName string) {
	t.Helper()
	require.Eventually(t, func() bool { return a.Node().Stats().LeaseHints == 1 }, 10*time.Second, time.Millisecond,
		"A holds B's hint")
	preflights := func() uint64 { return a.Store().QueryStats().Snapshot()["preflight"] }
	before := preflights()
	a.Push(queueName, `{"i":1}`)
	// The push's wake-up asks the hint on the fast path; a key already
	// marked for a pre-flight (the presence re-checks of A's first
	// consumer, late on a busy machine) asks the database instead.
	require.Eventually(t, func() bool {
		c := a.Node().Stats().Counters
		return c["hint:used"]+c["hint:audit"] >= 1 || preflights() > before
	}, 10*time.Second, time.Millisecond, "A's wake-up asked the hint or the database")
}

// A right hint: A skips the pop of a partition B holds (no query), and B's
// release wakes A at once.
func TestSyncnet_LeaseHintRight(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	a, b := servertest.Start(t, dsn, "syncnet"), servertest.Start(t, dsn, "syncnet")
	got, held := hintScene(t, a, b, "hint-right")
	pushPastHint(t, a, "hint-right")
	took := finish(t, a, b, "hint-right", got, held)
	t.Logf("ack on B → delivery on A: %v", took)
	// Without the release's wake-up A would look again only when the hint
	// lapses (6 s) or at its sweep.
	assert.Less(t, took, 3*time.Second, "B's LEASE_HINT_RELEASED woke A")
}

// A wrong hint, one way: the hint says B holds the lease but B released it
// (its LEASE_HINT_RELEASED is lost). A finds the message when the hint
// lapses or at its sweep: later, but once.
func TestSyncnet_LeaseHintStaleLeased(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	a, b := servertest.Start(t, dsn, "syncnet-norelease"), servertest.Start(t, dsn, "syncnet-norelease")
	got, held := hintScene(t, a, b, "hint-stale")
	pushPastHint(t, a, "hint-stale")
	took := finish(t, a, b, "hint-stale", got, held)
	t.Logf("ack on B → delivery on A with the release lost: %v", took)
}

// A wrong hint, the other way: B holds the lease but A never heard (its
// LEASE_HINT_ACQUIRED is lost). A's pop finds nothing to lease, and B's
// release wakes A.
func TestSyncnet_LeaseHintMissing(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	a, b := servertest.Start(t, dsn, "syncnet-noacquire"), servertest.Start(t, dsn, "syncnet-noacquire")
	got, held := hintScene(t, a, b, "hint-missing")
	a.Push("hint-missing", `{"i":1}`)
	finish(t, a, b, "hint-missing", got, held)
	c := a.Node().Stats().Counters
	assert.Zero(t, c["hint:used"]+c["hint:audit"], "A had no hint to ask")
}

// QUEUE_CONFIG_SET: a queue configured on A is cached on B with its new
// settings, without B asking the database.
func TestSyncnet_ConfigBroadcast(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	a, b := servertest.Start(t, dsn, "syncnet"), servertest.Start(t, dsn, "syncnet")
	servertest.Link(a, b)
	for lease := 10; lease <= 20; lease += 10 {
		status, body := a.Call(http.MethodPost, "/api/v1/configure", fmt.Sprintf(`{"queue":"cfg-b","options":{"leaseTime":%d}}`, lease))
		require.Equal(t, http.StatusOK, status, body)
		require.Eventually(t, func() bool {
			info, ok := b.Configs().Peek("cfg-b")
			return ok && info.Options.LeaseTime == lease
		}, 10*time.Second, time.Millisecond, "B caches leaseTime %d", lease)
	}
	info, _ := b.Configs().Peek("cfg-b")
	assert.EqualValues(t, 2, info.Version)
	assert.True(t, queue.ValidUUID(info.ID))
	assert.Zero(t, b.Configs().Stats().Misses, "B never looked it up")

	status, body := a.Call(http.MethodDelete, "/api/v1/resources/queues/cfg-b", "")
	require.Equal(t, http.StatusOK, status, body)
	require.Eventually(t, func() bool { _, ok := b.Configs().Peek("cfg-b"); return !ok }, 10*time.Second, time.Millisecond,
		"QUEUE_CONFIG_DELETE drops B's entry")
}

// Stale config: B keeps a queue's old settings and ids (A's QUEUE_CONFIG_SET
// and DELETE are lost) while A changes, deletes and recreates the queue.
// Pushes through B still land, nothing is lost or doubled, and B's refresh
// heals its cache.
func TestSyncnet_StaleConfig(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	a, b := servertest.Start(t, dsn, "syncnet-noconfig"), servertest.Start(t, dsn, "syncnet-noconfig")
	servertest.Link(a, b)
	const q = "stale-cfg"
	status, body := a.Call(http.MethodPost, "/api/v1/configure", `{"queue":"`+q+`","options":{"leaseTime":30}}`)
	require.Equal(t, http.StatusOK, status, body)
	b.Push(q, `{"i":0}`) // B caches the queue (settings, partition id) from its own lookup
	old, ok := b.Configs().Peek(q)
	require.True(t, ok)
	assert.Equal(t, 30, old.Options.LeaseTime)

	status, body = a.Call(http.MethodPost, "/api/v1/configure", `{"queue":"`+q+`","options":{"leaseTime":60}}`)
	require.Equal(t, http.StatusOK, status, body)
	b.Push(q, `{"i":1}`)
	stale, _ := b.Configs().Peek(q)
	assert.Equal(t, 30, stale.Options.LeaseTime, "B did not hear: its cache is stale")

	// Deleted on A: B's cached queue (and partition id) are wrong now. A
	// push through B to a new partition skips creating the queue it
	// believes exists, finds it gone and retries with fresh lookups.
	status, body = a.Call(http.MethodDelete, "/api/v1/resources/queues/"+q, "")
	require.Equal(t, http.StatusOK, status, body)
	status, body = b.Call(http.MethodPost, "/api/v1/push",
		`{"items":[{"queue":"`+q+`","partition":"fresh","payload":{"i":2}}]}`)
	require.Equal(t, http.StatusCreated, status, body)
	status, body = a.Call(http.MethodPost, "/api/v1/configure", `{"queue":"`+q+`","options":{"leaseTime":45}}`)
	require.Equal(t, http.StatusOK, status, body)
	b.Push(q, `{"i":3}`)

	// Everything pushed after the delete, exactly once.
	seen := map[int]int{}
	for range 2 {
		status, body := a.Call(http.MethodGet, "/api/v1/pop/queue/"+q+"?consumerGroup=g&autoAck=true&batch=10", "")
		if status == http.StatusNoContent {
			break
		}
		require.Equal(t, http.StatusOK, status, body)
		for _, m := range decodeLeased(t, body).Messages {
			seen[m.Data.I]++
		}
	}
	assert.Equal(t, map[int]int{2: 1, 3: 1}, seen)

	require.NoError(t, b.Store().RefreshConfigs(context.Background()))
	fresh, ok := b.Configs().Peek(q)
	require.True(t, ok)
	assert.Equal(t, 45, fresh.Options.LeaseTime, "the refresh heals")
	assert.NotEqual(t, old.ID, fresh.ID, "the recreated queue's id")
}

// Retention on A deletes an empty, idle partition: B hears PARTITION_DELETED
// and drops its cached id; B's next push to that name creates it again.
func TestSyncnet_PartitionDeletedReachesPeer(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	a, b := servertest.Start(t, dsn, "syncnet"), servertest.Start(t, dsn, "syncnet")
	servertest.Link(a, b)
	b.Push("pd", `{"i":1}`) // B caches pd/Default
	require.Equal(t, 1, b.Store().PartitionCacheStats().Entries)
	ctx := context.Background()
	_, err := a.Store().Pool().Exec(ctx, `DELETE FROM messages`)
	require.NoError(t, err)
	_, err = a.Store().Pool().Exec(ctx, `UPDATE partitions SET last_push_at = now() - interval '2 hours', created_at = now() - interval '2 hours'`)
	require.NoError(t, err)
	deleted, ran, err := a.Store().RunRetention(ctx, 0)
	require.NoError(t, err)
	require.True(t, ran)
	require.Len(t, deleted, 1)
	assert.Equal(t, "partition_cleanup", deleted[0].Reason)
	require.Eventually(t, func() bool { return b.Store().PartitionCacheStats().Entries == 0 }, 10*time.Second, time.Millisecond,
		"B dropped the cached id")
	misses := b.Store().PartitionCacheStats().Misses
	b.Push("pd", `{"i":2}`)
	assert.Equal(t, misses+1, b.Store().PartitionCacheStats().Misses, "looked up (and created) again")
	status, body := a.Call(http.MethodGet, "/api/v1/pop/queue/pd?autoAck=true", "")
	require.Equal(t, http.StatusOK, status, body)
	assert.Contains(t, body, `"data":{"i":2}`)
}

// With syncnet instead of NOTIFY: A sends MESSAGE_AVAILABLE to B, which
// has the consumer, and B's poller wakes.
func TestSyncnet_CrossInstance(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	a, b := servertest.Start(t, dsn, "syncnet"), servertest.Start(t, dsn, "syncnet")
	servertest.Link(a, b)
	// Each of 20 within 10 s, where the sweep is a minute: woken, not swept
	// (cmd/herald-bench cluster measures how fast).
	servertest.CrossLatency(t, a, b, "sq")
}

// A consumer that A hears of only after a push through A is still woken
// for it, though it looked for the last time before the push and the
// sweep is a minute: B's presence (its CONSUMER_REGISTERED, re-announced
// or pulled) reaches A after A chose whom the push wakes (a loaded
// machine delays a datagram, or a late datagram undoes it), and A answers
// it with a wake-up for the queue it pushed to.
func TestSyncnet_ConsumerHeardOfAfterThePushIsWoken(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	var held atomic.Bool // B's presence datagrams are late while it holds
	a := servertest.Start(t, dsn, "syncnet")
	b := servertest.Start(t, dsn, "syncnet", func(c *server.Config) {
		mode := c.Adjust.Syncnet
		c.Adjust.Syncnet = func(sc *syncnet.Config) {
			mode(sc)
			sc.Drop = func(t syncnet.Type) bool {
				return held.Load() && (t == syncnet.ConsumerRegistered || t == syncnet.PresenceSet)
			}
		}
		// B's own looks again after a registration come after the test:
		// only its look on arrival, before the push, remains.
		c.Adjust.Poller = func(pc *poller.Config) { pc.PresenceGrace = time.Hour }
	})
	servertest.Link(a, b)
	require.Eventually(t, func() bool {
		_, known := a.Node().HasSubscribers("heard-late")
		return known && a.Node().Known(b.Node().ServerID())
	}, 10*time.Second, 20*time.Millisecond, "A knows B's presence")

	held.Store(true)
	looked := preflights(t, b)
	got := b.LongPoll("heard-late", 20*time.Second)
	require.Eventually(t, func() bool { return preflights(t, b) > looked }, 10*time.Second, 5*time.Millisecond,
		"B looked at the queue on the long-poll's arrival")
	has, known := a.Node().HasSubscribers("heard-late")
	require.True(t, known && !has, "A does not know of B's consumer at the push")
	start := time.Now()
	a.Push("heard-late", `{"i":1}`)
	held.Store(false) // B's presence reaches A now, after the push

	ans := servertest.Wait(t, got, 25*time.Second)
	require.Equal(t, http.StatusOK, ans.Status, "woken, not answered empty at the long-poll's end")
	assert.Contains(t, ans.Body, `"data":{"i":1}`)
	t.Logf("delivered %v after the push", ans.At.Sub(start))
}

// preflights is how many pre-flight queries in's poller has run.
func preflights(t *testing.T, in *servertest.Instance) uint64 {
	t.Helper()
	mfs, err := in.Registry().Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "herald_preflight_duration_seconds" {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	return 0
}

// With 30% of syncnet's datagrams lost, every message pushed through A is
// consumed on B exactly once: a lost wake-up costs latency, never a message.
func TestSyncnet_LossyNetworkLosesNothing(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	a, b := servertest.Start(t, dsn, "syncnet-lossy"), servertest.Start(t, dsn, "syncnet-lossy")
	servertest.Link(a, b)
	var slow []time.Duration
	for _, d := range servertest.ConsumeOnce(t, a, b, "lossy", 100) {
		if d > 20*time.Millisecond {
			slow = append(slow, d)
		}
	}
	t.Logf("%d of 100 deliveries took over 20 ms (lost wake-ups, caught by re-checks): %v", len(slow), slow)
}

// Stale presence, one way: A believes B has no consumers (B's
// announcements are lost), so A sends B nothing. B still consumes every
// message exactly once: its own checks find them.
func TestSyncnet_StalePresenceAbsent(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	// A in the same mode for the same timings; it has no consumers to announce.
	a, b := servertest.Start(t, dsn, "syncnet-noregister"), servertest.Start(t, dsn, "syncnet-noregister")
	servertest.Link(a, b)
	first := b.LongPoll("stale-a", time.Second) // B has a consumer, and says so in vain
	require.Eventually(t, func() bool {
		has, known := a.Node().HasSubscribers("stale-a")
		return known && !has
	}, 10*time.Second, 20*time.Millisecond, "A's view: presence known, nobody consumes stale-a")
	// That consumer is gone before the first push (else it could take the
	// message meant for the next one, which then waited in vain).
	ans := servertest.Wait(t, first, 10*time.Second)
	require.Equal(t, http.StatusNoContent, ans.Status, ans.Body)
	servertest.ConsumeOnce(t, a, b, "stale-a", 20)
}

// Stale presence, the other way: A believes B still has a consumer (B's
// DEREGISTERED is lost), so A wakes B for nothing. Nothing is lost or
// doubled: the message waits for the next consumer.
func TestSyncnet_StalePresencePresent(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	// A in the same mode for the same timings (presence it hears lasts 3 s).
	a, b := servertest.Start(t, dsn, "syncnet-noderegister"), servertest.Start(t, dsn, "syncnet-noderegister")
	servertest.Link(a, b)
	servertest.ConsumeOnce(t, a, b, "stale-p", 1) // B had a consumer; it left, unannounced
	// A believes B has a consumer, or (once B's digest differs from A's
	// view and the pull's answer is lost too, in this mode) no longer knows:
	// either way it wakes B. Which of the two depends on timing (Reach).
	require.Eventually(t, func() bool {
		has, known := a.Node().HasSubscribers("stale-p")
		return has || !known
	}, 10*time.Second, 20*time.Millisecond, "A still wakes B for stale-p")
	a.Push("stale-p", `{"i":1}`) // B is woken with nobody waiting
	status, body := b.Call(http.MethodGet, "/api/v1/pop/queue/stale-p?autoAck=true", "")
	require.Equal(t, http.StatusOK, status, body)
	assert.Contains(t, body, `"data":{"i":1}`)
	ans := servertest.Wait(t, b.LongPoll("stale-p", 300*time.Millisecond), 5*time.Second)
	assert.Equal(t, http.StatusNoContent, ans.Status, "delivered once")
}
