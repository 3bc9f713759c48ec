package poller_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
)

// Idle long-polls ask again when their wait ends, and
// each new intention ran a pre-flight that found nothing (938 long-polls
// cost 7 queries a second). A target the last pre-flight found empty, with
// no wake-up since, still is: a new intention on it waits without a query.
// Another group, or anything after a wake-up, is checked as before.
func TestPoller_EmptyTargetCostsNoQueryPerIntention(t *testing.T) {
	e := newEnv(t, slowSweep)
	e.push("q", "", 1, 1)
	first := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q", Group: "g"}, AutoAck: true})
	receive(t, first, 5*time.Second) // the group is registered and caught up
	waiting := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q", Group: "g"}, AutoAck: true})
	defer waiting.Cancel()
	e.settled() // its pre-flight found nothing

	stats := e.store.QueryStats()
	before := stats.Total()
	for range 5 {
		w := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q", Group: "g"}})
		eventually(t, 5*time.Second, func() bool { return e.p.Intentions() == 2 }, "registered")
		e.settled() // time for the cycle its registration signalled
		assert.Nil(t, w.Cancel())
	}
	assert.Equal(t, before, stats.Total(), "intentions on a target known empty sent queries")

	// Another group on the queue was never looked at: checked on arrival.
	other := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q", Group: "h"}, AutoAck: true})
	assert.Equal(t, []int{1}, ns(receive(t, other, 5*time.Second)), "a new group reads from the start")

	// A push wakes the queue: the waiting intention gets it, and the
	// next one is checked again.
	e.push("q", "", 2, 2)
	assert.Equal(t, []int{2}, ns(receive(t, waiting, 5*time.Second)))
	e.push("q", "", 3, 3)
	late := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q", Group: "g"}})
	res := receive(t, late, 5*time.Second)
	require.NotNil(t, res)
	assert.Equal(t, []int{3}, ns(res))
}

// An assignment whose consumer row another transaction held (pops skip
// locked rows) came back empty, and nothing looked again: the holder may
// change nothing and wake nobody (a refused ack after a seek), so the
// waiting consumer got its message from the safety sweep, seconds later
// (TestGroups_SeekAndDeleteUnderALiveSubscription failed so under load).
// The queue is looked at again emptyRetry later, and again while the row
// stays held.
func TestPoller_EmptyAssignmentIsLookedAtAgain(t *testing.T) {
	e := newEnv(t, slowSweep)
	e.push("q", "", 1, 1)
	first := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q"}, AutoAck: true})
	assert.Equal(t, []int{1}, ns(receive(t, first, 5*time.Second)), "the group and its row exist")
	e.push("q", "", 2, 2) // no intention waits: no hand-off
	e.settled()

	ctx := context.Background()
	tx, err := e.store.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM consumers c JOIN partitions p ON p.id = c.partition_id
		JOIN queues q ON q.id = p.queue_id WHERE q.name = 'q' FOR UPDATE OF c`)
	require.NoError(t, err)

	stats := e.store.QueryStats()
	pops := func() uint64 { return stats.Snapshot()["pop_assigned"] }
	before := pops()
	w := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "q"}, AutoAck: true})
	// The sweep is a minute away: only the retry pops again.
	eventually(t, 5*time.Second, func() bool { return pops() >= before+2 }, "the pop tried again while the row is held")
	require.NoError(t, tx.Commit(ctx)) // changes nothing, wakes nobody
	assert.Equal(t, []int{2}, ns(receive(t, w, 5*time.Second)))
}
