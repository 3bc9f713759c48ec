package poller_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/queue/queuetest"
)

// slowSweep keeps the safety sweep out of a test, so only wake-ups and
// eligibility timers can explain a delivery.
func slowSweep(c *poller.Config) { c.SweepMin, c.SweepMax = time.Minute, time.Minute }

func TestPoller_OnePushOneWaiter(t *testing.T) {
	e := newEnv(t, slowSweep)
	waiters := make([]*poller.Waiter, 3)
	for i := range waiters {
		waiters[i] = e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q"}, Batch: 10})
	}
	eventually(t, 5*time.Second, func() bool { return e.p.Intentions() == 3 }, "registered")
	start := time.Now()
	e.push("q", "", 1, 1)

	var got []*queue.PopResult
	deadline := time.After(5 * time.Second)
	for len(got) == 0 {
		for _, w := range waiters {
			select {
			case res := <-w.C():
				got = append(got, res)
			default:
			}
		}
		select {
		case <-deadline:
			t.Fatal("no waiter got the message")
		case <-time.After(time.Millisecond):
		}
	}
	t.Logf("push → delivery: %v", time.Since(start))
	assert.Less(t, time.Since(start), time.Second, "promptly, not at a sweep")
	require.Len(t, got, 1)
	assert.Equal(t, []int{1}, ns(got[0]))
	assert.NotEmpty(t, got[0].LeaseID)
	// Exactly one: the other two are still waiting.
	assert.Equal(t, 2, e.p.Intentions())
	for _, w := range waiters {
		if res := w.Cancel(); res != nil {
			assert.Equal(t, got[0], res)
		}
	}
}

func TestPoller_SpecificPartitionBeatsAny(t *testing.T) {
	e := newEnv(t, slowSweep)
	anyW := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q"}}) // older
	specW := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q", Partition: "p1"}})
	eventually(t, 5*time.Second, func() bool { return e.p.Intentions() == 2 }, "registered")
	// Their registrations' cycles are over: a cycle still running when the
	// push holds specW for its hand-off would see it unable to take, and
	// give p1 to the other (the preference is a cycle's, not a promise
	// across a hand-off in flight).
	e.settled()
	e.push("q", "p1", 1, 1)
	res := receive(t, specW, 5*time.Second)
	assert.Equal(t, "p1", res.Partition)
	nothing(t, anyW, 100*time.Millisecond)
	assert.Nil(t, anyW.Cancel())
}

func TestPoller_LeaseExpiryWakesWaiter(t *testing.T) {
	e := newEnv(t, slowSweep)
	_, err := e.store.Configure(context.Background(), queue.ConfigureRequest{Queue: "q", Options: []byte(`{"leaseTime":1}`)})
	require.NoError(t, err)
	e.push("q", "", 1, 1)
	first, err := e.store.Pop(context.Background(), queue.PopRequest{Queue: "q"})
	require.NoError(t, err)
	require.Len(t, first.Messages, 1)
	leasedAt := time.Now()

	w := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q"}})
	res := receive(t, w, 5*time.Second)
	waited := time.Since(leasedAt)
	t.Logf("delivered %v after the lease was taken", waited)
	assert.Equal(t, []int{1}, ns(res))
	assert.Equal(t, 1, res.Messages[0].RetryCount, "the expired lease counted as an attempt")
	assert.GreaterOrEqual(t, waited, 900*time.Millisecond, "not before the lease expired")
	assert.Less(t, waited, 4*time.Second, "at expiry, by the eligibility timer (the sweep is 1 min)")
}

func TestPoller_DelayedMessageAtVisibility(t *testing.T) {
	e := newEnv(t, slowSweep)
	_, err := e.store.Configure(context.Background(), queue.ConfigureRequest{Queue: "q", Options: []byte(`{"delayedProcessing":1}`)})
	require.NoError(t, err)
	w := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q"}})
	eventually(t, 5*time.Second, func() bool { return e.p.Intentions() == 1 }, "registered")
	pushed := time.Now()
	e.push("q", "", 1, 1)
	res := receive(t, w, 5*time.Second)
	waited := time.Since(pushed)
	t.Logf("delayed message delivered after %v", waited)
	assert.Equal(t, []int{1}, ns(res))
	assert.GreaterOrEqual(t, waited, 900*time.Millisecond)
	assert.Less(t, waited, 4*time.Second, "at visibility, by the eligibility timer (the sweep is 1 min)")
}

// A consumer that is gone when its messages arrive gets nothing, and the
// lease is released at once: the next consumer gets the message now, with
// no attempt counted.
func TestPoller_GoneConsumerReleasesLease(t *testing.T) {
	e := newEnv(t, slowSweep)
	refused := make(chan struct{}, 1)
	cancel := e.p.Register(&poller.Intention{Target: queue.Target{Queue: "q"}, Deliver: func(*queue.PopResult) bool {
		refused <- struct{}{}
		return false
	}})
	defer cancel()
	eventually(t, 5*time.Second, func() bool { return e.p.Intentions() == 1 }, "registered")
	e.push("q", "", 1, 1)
	select {
	case <-refused:
	case <-time.After(5 * time.Second):
		t.Fatal("no delivery attempt")
	}
	eventually(t, 5*time.Second, func() bool {
		res, err := e.store.Pop(context.Background(), queue.PopRequest{Queue: "q"})
		require.NoError(t, err)
		if len(res.Messages) == 0 {
			return false
		}
		assert.Equal(t, 0, res.Messages[0].RetryCount)
		return true
	}, "the lease was released")
}

// Waiters that cancel while messages arrive never swallow one: every
// message ends up either delivered or still in the queue.
func TestPoller_CancelRaceLosesNothing(t *testing.T) {
	e := newEnv(t)
	const n = 40
	var mu sync.Mutex
	delivered := map[int]bool{}
	var wg sync.WaitGroup
	pushed := make([]chan struct{}, n/4)
	for k := range pushed {
		pushed[k] = make(chan struct{})
	}
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q"}})
			if i%2 == 1 {
				<-pushed[i/4] // half cancel right after a push, half at once
			}
			res := w.Cancel()
			if res == nil {
				select {
				case res = <-w.C():
				default:
				}
			}
			if res != nil {
				mu.Lock()
				for _, v := range ns(res) {
					delivered[v] = true
				}
				mu.Unlock()
				_, err := e.store.Ack(context.Background(), []queue.Ack{{TransactionID: res.Messages[0].TransactionID,
					PartitionID: res.Messages[0].PartitionID, LeaseID: res.LeaseID}})
				assert.NoError(t, err)
			}
		}()
		if i%4 == 0 {
			e.push("q", "", i, i)
			close(pushed[i/4])
		}
	}
	wg.Wait()
	// What was not delivered comes back without waiting for a lease to
	// expire (the lease time is 300 s): a worker may still be releasing it.
	eventually(t, 5*time.Second, func() bool {
		res, err := e.store.Pop(context.Background(), queue.PopRequest{Queue: "q", Batch: 100, AutoAck: true})
		require.NoError(t, err)
		for _, v := range ns(res) {
			assert.False(t, delivered[v], "message %d both delivered and still queued", v)
			delivered[v] = true
		}
		for i := 0; i < n; i += 4 {
			if !delivered[i] {
				return false
			}
		}
		return true
	}, "every message delivered or given back")
}

func TestPoller_Validate(t *testing.T) {
	_, err := poller.New(poller.Config{})
	assert.ErrorContains(t, err, "Store")
}

// Once the poller knows a partition, a push to it is served without a
// pre-flight: one statement from wake-up to delivery. The fast path keeps
// the decision rules: a waiter naming the partition beats an older wildcard.
func TestPoller_PushHintSkipsPreflight(t *testing.T) {
	// The hinted path itself: a push hands nothing off here.
	e := newEnv(t, slowSweep, func(c *poller.Config) { c.NoHandOff = true })
	// First round: learn the partition id (a normal cycle).
	w := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q"}, AutoAck: true})
	e.push("q", "p1", 1, 1)
	assert.Equal(t, []int{1}, ns(receive(t, w, 5*time.Second)))

	anyW := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q"}}) // older
	specW := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q", Partition: "p1"}})
	eventually(t, 5*time.Second, func() bool { return e.p.Intentions() == 2 }, "registered")
	e.settled()
	stats := e.store.QueryStats()
	before := stats.Snapshot()

	e.push("q", "p1", 2, 2)
	res := receive(t, specW, 5*time.Second)
	assert.Equal(t, []int{2}, ns(res))
	after := stats.Snapshot()
	assert.Equal(t, before["preflight"], after["preflight"], "no pre-flight on the hinted path")
	assert.Equal(t, before["pop_assigned"]+1, after["pop_assigned"])
	nothing(t, anyW, 100*time.Millisecond)
	assert.Nil(t, anyW.Cancel())
}

// In WakePoll mode a push wakes nobody: only the sweep finds messages (the
// reference server's behaviour, kept as the benchmark baseline).
func TestPoller_PollModeIgnoresPushWakeups(t *testing.T) {
	e := newEnv(t, slowSweep, func(c *poller.Config) { c.Mode = poller.WakePoll })
	assert.Equal(t, poller.WakePoll, e.p.Mode())
	w := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q"}})
	eventually(t, 5*time.Second, func() bool { return e.p.Intentions() == 1 }, "registered")
	e.settled()
	e.push("q", "", 1, 1)
	nothing(t, w, 300*time.Millisecond)
	// A new intention is still checked on arrival, and finds the message.
	assert.Nil(t, w.Cancel())
	w2 := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q"}})
	assert.Equal(t, []int{1}, ns(receive(t, w2, 5*time.Second)))
}

func TestPoller_StandingIntentionCredit(t *testing.T) {
	e := newEnv(t, slowSweep)
	got := make(chan *queue.PopResult, 10)
	in := &poller.Intention{Target: queue.Target{Queue: "q"}, Batch: 2, Credit: 3, Standing: true, AutoAck: true,
		Deliver: func(res *queue.PopResult) bool { got <- res; return true }}
	cancel := e.p.Register(in)
	defer cancel()
	// Its registration's cycle is over: one still holding its credit while
	// the push hands off leaves the hand-off one message ([1] then [2, 3]).
	e.settled()
	e.push("q", "", 1, 5)
	first := <-got
	assert.Equal(t, []int{1, 2}, ns(first), "a batch at most")
	second := <-got
	assert.Equal(t, []int{3}, ns(second), "then only the credit left")
	select {
	case res := <-got:
		t.Fatalf("delivered beyond its credit: %v", ns(res))
	case <-time.After(200 * time.Millisecond):
	}
	e.p.AddCredit(in, 2)
	assert.Equal(t, []int{4, 5}, ns(<-got))
	assert.Equal(t, 1, e.p.Intentions(), "a standing intention stays")
}

// With no intention registered nothing is ever dirty: no SQL at all, however
// often the sweep and wake-ups fire.
func TestPoller_NothingWaitingNoSQL(t *testing.T) {
	e := newEnv(t, func(c *poller.Config) { c.SweepMin, c.SweepMax = 10*time.Millisecond, 20*time.Millisecond })
	stats := e.store.QueryStats()
	before := stats.Total()
	tick := time.NewTicker(10 * time.Millisecond) // sweeps run between the ticks
	defer tick.Stop()
	for range 50 {
		e.p.Wake(poller.SourcePush, "q", "p")
		e.p.Wake(poller.SourceAck, "q", "")
		<-tick.C
	}
	assert.Equal(t, before, stats.Total())
}

// With presence gossiped (OnPresence), a queue's first consumer is checked
// again shortly after it registers: a message committed elsewhere, whose
// wake-up this instance never got, is delivered then, not at the sweep.
func TestPoller_PresenceGraceRecheck(t *testing.T) {
	var mu sync.Mutex
	var told []string
	// A grace a loaded machine cannot outrun: the push below must commit
	// inside it (with 50 ms, a slow push came after the re-check and only
	// the one-minute sweep would have found it).
	const grace = time.Second
	e := newEnv(t, slowSweep, func(c *poller.Config) {
		c.PresenceGrace = grace
		c.OnPresence = func(q string, present bool) bool {
			mu.Lock()
			told = append(told, fmt.Sprintf("%s:%v", q, present))
			mu.Unlock()
			return present // every registration is news
		}
	})
	// The queue, its partition and the consumer row exist already.
	first := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "pg"}, AutoAck: true})
	e.push("pg", "", 1, 1)
	receive(t, first, 5*time.Second)
	eventually(t, 5*time.Second, func() bool { return e.p.Intentions() == 0 }, "withdrawn")

	w := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "pg"}})
	eventually(t, 5*time.Second, func() bool { return e.p.Intentions() == 1 }, "registered")
	// Another instance pushes; no wake-up reaches this one.
	_, err := e.store.Push(context.Background(), []queue.PushItem{{Queue: "pg", Payload: []byte(`{"n":2}`)}})
	require.NoError(t, err)
	start := time.Now()
	res := receive(t, w, 5*time.Second)
	assert.Equal(t, []int{2}, ns(res))
	assert.Less(t, time.Since(start), grace+2*time.Second, "by the re-check, not the one-minute sweep")
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"pg:true", "pg:false", "pg:true", "pg:false"}, told)
}

// A peer may hear of a new consumer later than PresenceGrace on a busy
// machine: its push after the first re-check is found by a later one (4
// and 20 times the grace), not at the sweep.
func TestPoller_PresenceNewsIsCheckedAgainLater(t *testing.T) {
	const grace = 100 * time.Millisecond
	var registrations atomic.Int64
	e := newEnv(t, slowSweep, func(c *poller.Config) {
		c.PresenceGrace = grace
		// Only the second registration is news (the first sets the queue
		// up, and its re-checks would be counted below).
		c.OnPresence = func(_ string, present bool) bool { return present && registrations.Add(1) == 2 }
	})
	first := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "pl"}, AutoAck: true})
	e.push("pl", "", 1, 1)
	receive(t, first, 5*time.Second)
	eventually(t, 5*time.Second, func() bool { return e.p.Intentions() == 0 }, "withdrawn")

	preflights := func() uint64 { return e.store.QueryStats().Snapshot()["preflight"] }
	before := preflights()
	w := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "pl"}})
	// Its registration's pre-flight and the first re-check's.
	eventually(t, 10*time.Second, func() bool { return preflights() >= before+2 }, "checked at PresenceGrace")
	// Another instance pushes now; no wake-up reaches this one.
	_, err := e.store.Push(context.Background(), []queue.PushItem{{Queue: "pl", Payload: []byte(`{"n":2}`)}})
	require.NoError(t, err)
	assert.Equal(t, []int{2}, ns(receive(t, w, 10*time.Second)), "by a later re-check, not the one-minute sweep")
}

// A subscription that is kept up to date pays one pop per
// message and nothing more. A delivery that drained its partition, an ack
// that ended its lease with the partition drained and the credit the ack
// gave back left nothing to find: before, each of them marked the queue
// for a pre-flight (one to three per message).
func TestPoller_DrainedDeliveriesNeedNoPreflight(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, slowSweep, func(c *poller.Config) { c.Registerer = reg })
	in, got := e.subscribe(poller.Intention{Target: queue.Target{Queue: "q"}, Batch: 10, Credit: 100})
	e.push("q", "p", 0, 0) // the group's registration and its first pre-flights
	first := receive1(t, got)
	ackAll(t, e, in, first)
	e.settled()
	before := metricValue(t, reg, "herald_poll_cycles_total")
	const n = 20
	for i := 1; i <= n; i++ {
		e.push("q", "p", i, i)
		res := receive1(t, got)
		require.Equal(t, []int{i}, ns(res))
		assert.False(t, res.More, "the partition is drained")
		ackAll(t, e, in, res)
	}
	e.settled()
	cycles := metricValue(t, reg, "herald_poll_cycles_total") - before
	t.Logf("%d messages: %.0f pre-flights", n, cycles)
	assert.LessOrEqual(t, cycles, 1.0, "no pre-flight per message")
}

// subscribe registers in as a standing intention (a subscription) whose
// deliveries arrive on the channel it returns, until the test ends.
func (e *env) subscribe(in poller.Intention) (*poller.Intention, <-chan *queue.PopResult) {
	got := make(chan *queue.PopResult, 1000)
	in.Standing = true
	in.Deliver = func(res *queue.PopResult) bool { got <- res; return true }
	e.t.Cleanup(e.p.Register(&in))
	return &in, got
}

func receive1(t *testing.T, got <-chan *queue.PopResult) *queue.PopResult {
	t.Helper()
	select {
	case res := <-got:
		return res
	case <-time.After(5 * time.Second):
		t.Fatal("no delivery")
		return nil
	}
}

// ackAll completes res and does what the gateway does after: wake the
// queue if the ack says messages wait, give the credit back.
func ackAll(t *testing.T, e *env, in *poller.Intention, res *queue.PopResult) {
	t.Helper()
	for _, r := range ackResult(t, e, res) {
		if r.LeaseReleased && r.Pending {
			e.p.Wake(poller.SourceAck, r.Queue, r.Partition)
		}
	}
	e.p.AddCredit(in, len(res.Messages))
}

// A push leases its messages to the consumer waiting for them in
// its own transaction (the hand-off): the consumer gets them when the push
// commits, and no pre-flight or pop runs. A group that is not caught up
// (older messages pending) is left to the poll cycle, which delivers in
// order.
func TestPoller_PushHandsOffToWaitingConsumers(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, slowSweep, func(c *poller.Config) { c.Registerer = reg })
	in, got := e.subscribe(poller.Intention{Target: queue.Target{Queue: "h"}, Batch: 10, Credit: 100})
	e.push("h", "p", 0, 0) // registers the group, learns the partition
	ackAll(t, e, in, receive1(t, got))
	e.settled()
	handoffs := metricValue(t, reg, "herald_handoffs_total")
	stats := e.store.QueryStats()
	before := stats.Snapshot()
	start := time.Now()
	e.push("h", "p", 1, 3)
	res := receive1(t, got)
	t.Logf("push → delivery: %v", time.Since(start))
	assert.Equal(t, []int{1, 2, 3}, ns(res))
	assert.Equal(t, handoffs+1, metricValue(t, reg, "herald_handoffs_total"))
	m := res.Messages[0]
	assert.NotEmpty(t, res.LeaseID)
	assert.Equal(t, res.LeaseID, m.LeaseID)
	assert.Equal(t, queue.DefaultGroup, m.Group)
	assert.Equal(t, "h", m.Queue)
	assert.Equal(t, "p", m.Partition)
	assert.False(t, m.CreatedAt.IsZero(), "created_at as stored")
	assert.EqualValues(t, 2, m.Offset)
	assert.False(t, res.More)
	e.settled()
	ops := opsBetween(before, stats.Snapshot())
	assert.Zero(t, ops["preflight"], "no pre-flight: %v", ops)
	assert.Zero(t, ops["pop_assigned"], "no pop: %v", ops)
	// The lease is real: held in the database, and the ack releases it.
	ackAll(t, e, in, res)

	// Not caught up: a message pending for the group (credit 0 kept it
	// from being delivered) is delivered first, by the poll cycle.
	in.Credit = 0
	e.p.AddCredit(in, -100)
	e.push("h", "p", 4, 4)
	e.settled()
	e.p.AddCredit(in, 1)
	first := receive1(t, got)
	assert.Equal(t, []int{4}, ns(first))
	e.push("h", "p", 5, 5) // leased? no: 4 is still unacked, the row is not caught up
	e.p.AddCredit(in, 99)
	ackAll(t, e, in, first)
	assert.Equal(t, []int{5}, ns(receive1(t, got)), "after 4, by a poll cycle")
	assert.Equal(t, handoffs+1, metricValue(t, reg, "herald_handoffs_total"), "no hand-off while older messages were pending")
}

func opsBetween(before, after map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// A subscription alone on a queue with a backlog is served by claims from
// the queue's ready rows (Store.PopClaim), not by a pre-flight and a pop
// per cycle; order per partition holds, nothing is delivered twice, and
// once the backlog is gone the pre-flight takes over again.
func TestPoller_BacklogDrainsByClaimsWithoutPreflights(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, slowSweep, func(c *poller.Config) { c.Registerer = reg })
	const parts, each = 60, 3
	var items []queue.PushItem
	for p := range parts {
		for i := range each {
			items = append(items, queue.PushItem{Queue: "q", Partition: fmt.Sprintf("p%02d", p),
				Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, p*each+i))})
		}
	}
	_, err := e.store.Push(context.Background(), items)
	require.NoError(t, err)
	in, got := e.subscribe(poller.Intention{Target: queue.Target{Queue: "q"}, Batch: 2, Partitions: 8, Credit: 10})
	last := map[string]int{}
	seen := map[int]bool{}
	deliveries := 0
	for len(seen) < parts*each {
		res := receive1(t, got)
		deliveries++
		for i, m := range res.Messages {
			n := ns(res)[i]
			require.False(t, seen[n], "message %d delivered twice", n)
			seen[n] = true
			if prev, ok := last[m.Partition]; ok {
				require.Greater(t, n, prev, "order in %s", m.Partition)
			}
			last[m.Partition] = n
		}
		ackAll(t, e, in, res)
	}
	e.settled()
	claims := metricValue(t, reg, "herald_poll_claims_total")
	preflights := metricValue(t, reg, "herald_poll_cycles_total")
	t.Logf("%d messages in %d deliveries: %.0f claims, %.0f pre-flights", parts*each, deliveries, claims, preflights)
	assert.Greater(t, claims, 10.0)
	assert.LessOrEqual(t, preflights, 6.0, "the pre-flight runs at the start and once the claims come back short")

	// Caught up: a new message is found as before (push hint or pre-flight).
	e.push("q", "p00", 1000, 1000)
	assert.Equal(t, []int{1000}, ns(receive1(t, got)))
}

// A poller with nothing waiting does not wake: its workers arm no sweep
// timer (each wake-up of an idle process costs the runtime more than the
// empty cycle). A registration wakes it, and while something waits the
// safety sweep runs: a message pushed without a wake-up is still found.
func TestPoller_IdleWithNothingWaitingDoesNotWake(t *testing.T) {
	fast := func(c *poller.Config) {
		c.Workers, c.SweepMin, c.SweepMax = 2, 10*time.Millisecond, 20*time.Millisecond
	}
	store := queuetest.NewStore(t)
	// The idle span on a fake clock (an idle poller sends no SQL, so its
	// workers run in the bubble): the sleep returns once every goroutine
	// of the poller is blocked for good and the clock has moved 50 sweep
	// intervals, each a timer the workers would have fired.
	synctest.Test(t, func(t *testing.T) {
		c := poller.Config{Store: store}
		fast(&c)
		p, err := poller.New(c)
		require.NoError(t, err)
		t.Cleanup(p.Start())
		// 50 sweep intervals, each a tick on the bubble's clock looked at
		// once every goroutine of the poller is blocked.
		tick := time.NewTicker(c.SweepMax)
		defer tick.Stop()
		for i := range 50 {
			<-tick.C
			synctest.Wait()
			require.LessOrEqual(t, int(p.WorkerRuns()), c.Workers, "sweep interval %d: a worker ran twice", i+1)
		}
		assert.Equal(t, c.Workers, int(p.WorkerRuns()),
			"each worker's first sweep, then none: the workers swept with nothing waiting")
	})

	e := newEnv(t, fast)
	eventually(t, 10*time.Second, func() bool { return e.p.WorkerRuns() >= 2 && !e.p.Pending() }, "the workers' first sweeps ran: idle")
	w := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q"}, AutoAck: true})
	defer w.Cancel()
	eventually(t, 5*time.Second, func() bool { return e.p.Intentions() == 1 }, "registered")
	_, err := e.store.Push(context.Background(), []queue.PushItem{{Queue: "q", Payload: json.RawMessage(`{"n":1}`)}})
	require.NoError(t, err) // no Wake: only the sweep finds it
	assert.Equal(t, []int{1}, ns(receive(t, w, 5*time.Second)))
}

// An autoAck subscription gets a push's messages by the hand-off as a
// manual-ack one does: the push moves the group's cursor past them in its
// own transaction, no pre-flight or pop runs, and no lease is kept.
func TestPoller_PushHandsOffToAutoAckSubscriptions(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, slowSweep, func(c *poller.Config) { c.Registerer = reg })
	in, got := e.subscribe(poller.Intention{Target: queue.Target{Queue: "ha", Group: "dash"}, Batch: 10, Credit: 100, AutoAck: true})
	e.push("ha", "p", 0, 0) // registers the group, learns the partition
	assert.Equal(t, []int{0}, ns(receive1(t, got)))
	e.p.AddCredit(in, 1)
	e.settled()
	handoffs := metricValue(t, reg, "herald_handoffs_total")
	stats := e.store.QueryStats()
	before := stats.Snapshot()
	e.push("ha", "p", 1, 3)
	res := receive1(t, got)
	assert.Equal(t, []int{1, 2, 3}, ns(res))
	assert.Empty(t, res.LeaseID, "autoAck keeps no lease")
	assert.Empty(t, res.Messages[0].LeaseID)
	assert.Equal(t, handoffs+1, metricValue(t, reg, "herald_handoffs_total"))
	e.settled()
	ops := opsBetween(before, stats.Snapshot())
	assert.Zero(t, ops["preflight"], "no pre-flight: %v", ops)
	assert.Zero(t, ops["pop_assigned"], "no pop: %v", ops)
	e.p.AddCredit(in, 3)
	// The cursor moved: the next push is handed off too, and nothing is
	// delivered twice.
	e.push("ha", "p", 4, 4)
	assert.Equal(t, []int{4}, ns(receive1(t, got)))
	assert.Equal(t, handoffs+2, metricValue(t, reg, "herald_handoffs_total"))
}

// A long-poll whose wait ends while a cycle pops for it (autoAck: the pop
// consumes) loses nothing: its Cancel waits for the pop under way and
// returns what it took.
func TestWaiter_CancelDuringAnAutoAckPopLosesNothing(t *testing.T) {
	e := newEnv(t, slowSweep)
	ctx := context.Background()
	e.push("q", "", 1, 1)
	w := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q"}, Batch: 10, AutoAck: true})
	cancelled := make(chan *queue.PopResult, 1)
	hooked := make(chan bool, 1) // whether Cancel returned before the pop
	var once sync.Once
	t.Cleanup(e.p.BeforePop(func() {
		once.Do(func() {
			// The long-poll's wait ends now: in the pop's way.
			go func() { cancelled <- w.Cancel() }()
			select {
			case got := <-cancelled:
				cancelled <- got
				hooked <- true
			case <-time.After(time.Second): // it waits for the pop under way
				hooked <- false
			}
		})
	}))
	var before bool
	select {
	case before = <-hooked:
	case <-time.After(10 * time.Second):
		t.Fatal("no pop for the long-poll")
	}
	var got *queue.PopResult
	select {
	case got = <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("Cancel did not return")
	}
	t.Logf("Cancel returned before the pop: %v", before)
	require.NotNil(t, got, "the pop under way took message 1 for the long-poll: Cancel returns it")
	assert.Equal(t, []int{1}, ns(got))
	res, err := e.store.Pop(ctx, queue.PopRequest{Queue: "q", AutoAck: true, Batch: 10})
	require.NoError(t, err)
	assert.Empty(t, res.Messages, "taken once")
}

// A subscription's credit is charged for what a hand-off gave it in the
// same step as the hand-off's hold ends: a push meanwhile (here from the
// delivery itself, before it returns) leases nothing past maxInFlight.
// Before, the credit was taken only after the delivery, and a WebSocket
// with maxInFlight 2 got a third message (TestWS_MaxInFlightAndNack, CI).
func TestHandOff_CreditIsChargedBeforeTheDelivery(t *testing.T) {
	e := newEnv(t, slowSweep)
	inside := make(chan int, 1)
	in := &poller.Intention{Target: queue.Target{Queue: "hc"}, Batch: 1, Credit: 1, Standing: true}
	in.Deliver = func(*queue.PopResult) bool {
		rs := e.p.Reserve([]queue.PushedPartition{{Queue: "hc", Partition: "b", PartitionID: "pid-b", Messages: 1}})
		for _, r := range rs {
			e.p.Settle(r, nil)
		}
		inside <- len(rs)
		return true
	}
	t.Cleanup(e.p.Register(in))
	e.settled()
	rs := e.p.Reserve([]queue.PushedPartition{{Queue: "hc", Partition: "a", PartitionID: "pid-a", Messages: 1}})
	require.Len(t, rs, 1, "its one credit reserved")
	e.p.Settle(rs[0], &queue.PopResult{Queue: "hc", Partition: "a", PartitionID: "pid-a", LeaseID: rs[0].LeaseID,
		PartitionsClaimed: 1, Messages: []queue.Message{{Queue: "hc", Partition: "a", PartitionID: "pid-a", LeaseID: rs[0].LeaseID}}})
	select {
	case n := <-inside:
		assert.Zero(t, n, "a push during the delivery reserves nothing: the credit is taken")
	case <-time.After(10 * time.Second):
		t.Fatal("not delivered")
	}
}

// A push to a partition whose lease a stream of this instance holds costs
// no statement: the pop would find the lease and come back empty, and the
// pre-flight after it would say so again. The ack's release, told before
// its wake-up (as the gateway tells it), serves what the pushes left.
func TestPoller_PushToAPartitionThisInstanceHoldsCostsNoQuery(t *testing.T) {
	e := newEnv(t, slowSweep, func(c *poller.Config) { c.NoHandOff, c.HeldNote = true, time.Minute })
	got, first := heldStream(t, e)
	require.Equal(t, []int{1}, ns(first))
	e.settled()
	stats := e.store.QueryStats()
	before := stats.Snapshot()

	for i := 2; i <= 4; i++ {
		e.push("q", "p1", i, i)
	}
	e.settled()
	after := stats.Snapshot()
	assert.Equal(t, before["pop_assigned"], after["pop_assigned"], "no pop of a partition held here")
	assert.Equal(t, before["preflight"], after["preflight"], "no pre-flight after a pop that could not be")
	select {
	case res := <-got:
		t.Fatalf("delivered while its lease is held: %v", ns(res))
	default:
	}

	m := first.Messages[0]
	res := e.ackFirst(first)
	require.True(t, res[0].LeaseReleased)
	e.p.LeaseReleased("q", "p1", m.PartitionID, "")
	e.p.Wake(poller.SourceAck, "q", "p1")
	assert.Equal(t, []int{2, 3, 4}, ns(delivered(t, got, "the ack's release did not serve the pushed messages")),
		"what the pushes left, at the ack")
}

// Only this instance's pushes are passed over: a wake-up from anywhere else
// (another instance's push, an ack there that released a lease this
// instance had not heard of) pops as before.
func TestPoller_WakeFromElsewherePopsAPartitionThisInstanceHeld(t *testing.T) {
	e := newEnv(t, slowSweep, func(c *poller.Config) { c.NoHandOff = true })
	got, first := heldStream(t, e)
	// Acked where this poller does not hear of it (as on another instance).
	e.ackFirst(first)
	e.push("q", "p1", 2, 2)
	e.p.Wake("syncnet", "q", "p1") // as syncnet wakes a queue
	assert.Equal(t, []int{2}, ns(delivered(t, got, "a wake-up from elsewhere did not pop the partition")))
}

// A lease released where this instance does not hear of it (an ack on
// another instance without syncnet) holds this instance's pushes back for
// Config.HeldNote at most, not for the lease's time.
func TestPoller_PushHereIsPoppedOnceTheHeldNoteLapses(t *testing.T) {
	e := newEnv(t, slowSweep, func(c *poller.Config) { c.NoHandOff, c.HeldNote = true, 300*time.Millisecond })
	got, first := heldStream(t, e)
	e.ackFirst(first)
	e.push("q", "p1", 2, 2)
	assert.Equal(t, []int{2}, ns(delivered(t, got, "a push here waited past the held note (for the lease's time)")))
}

// A push here passed over while a lease of this instance held its
// partition is served when that lease ends drained (an ack that found
// nothing after it: the push committed after it looked, and its wake-up
// came before the release was told), not when the held note lapses:
// nothing else wakes a drained partition.
func TestPoller_PushPassedOverIsServedWhenItsLeaseEndsDrained(t *testing.T) {
	e := newEnv(t, slowSweep, func(c *poller.Config) {
		// The registration's presence re-checks (pre-flights) are over
		// before the second push.
		c.NoHandOff, c.HeldNote, c.PresenceGrace = true, time.Minute, time.Millisecond
	})
	got, first := heldStream(t, e)
	e.settled()
	m := first.Messages[0]
	res := e.ackFirst(first)
	require.True(t, res[0].LeaseReleased)
	require.False(t, res[0].Pending, "drained when the ack looked")
	e.push("q", "p1", 2, 2) // after the ack looked, woken before its release is told
	e.settled()
	select {
	case res := <-got:
		t.Fatalf("popped while its lease was noted here (nothing to prove): %v", ns(res))
	default:
	}
	e.p.LeaseReleased("q", "p1", m.PartitionID, "") // as the gateway's afterAck for a drained ack, with no wake-up
	assert.Equal(t, []int{2}, ns(delivered(t, got,
		"a push passed over waited for the held note to lapse after its lease ended drained")))
}

// heldStream registers a subscription on queue q and pushes p1's first
// message to it: the subscription holds that message's lease, unacked. It
// returns what the subscription is delivered from then on, and that first
// delivery.
func heldStream(t *testing.T, e *env) (<-chan *queue.PopResult, *queue.PopResult) {
	t.Helper()
	got := make(chan *queue.PopResult, 10)
	in := &poller.Intention{Target: queue.Target{Queue: "q"}, Batch: 10, Credit: 100, Standing: true,
		Deliver: func(res *queue.PopResult) bool { got <- res; return true }}
	t.Cleanup(e.p.Register(in))
	e.push("q", "p1", 1, 1)
	return got, delivered(t, got, "the first message was not delivered")
}

// delivered waits up to 5 s for the next delivery on got; msg says what
// failed when none comes.
func delivered(t *testing.T, got <-chan *queue.PopResult, msg string) *queue.PopResult {
	t.Helper()
	select {
	case res := <-got:
		return res
	case <-time.After(5 * time.Second):
		t.Fatal(msg)
		return nil
	}
}

// ackFirst acks res's first message under its lease in the store alone:
// the poller is told nothing of it, as of an ack on another instance.
func (e *env) ackFirst(res *queue.PopResult) []queue.AckResult {
	e.t.Helper()
	m := res.Messages[0]
	out, err := e.store.Ack(context.Background(), []queue.Ack{{TransactionID: m.TransactionID, PartitionID: m.PartitionID,
		LeaseID: res.LeaseID, Status: queue.StatusCompleted}})
	require.NoError(e.t, err)
	return out
}
