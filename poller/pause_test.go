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

// While paused (pop maintenance) the poller leases nothing: no cycle for a
// waiter or a subscription, no hand-off from a push; resumed, it serves
// them again, with no new wake-up and the sweep a minute away.
func TestPoller_Pause(t *testing.T) {
	e := newEnv(t, slowSweep)
	got := make(chan *queue.PopResult, 10)
	sub := &poller.Intention{Target: queue.Target{Queue: "q"}, Batch: 10, Credit: 10, Standing: true,
		Deliver: func(res *queue.PopResult) bool { got <- res; return true }}
	cancel := e.p.Register(sub)
	defer cancel()
	waiter := e.p.Wait(poller.Intention{Target: queue.Target{Queue: "w"}})
	eventually(t, 5*time.Second, func() bool { return e.p.Intentions() == 2 }, "registered")

	e.p.SetPaused(true)
	assert.True(t, e.p.Paused())
	e.push("q", "", 1, 3) // the subscription is caught up: a hand-off, were it not paused
	e.push("w", "", 1, 1)
	nothing(t, waiter, 200*time.Millisecond)
	select {
	case res := <-got:
		t.Fatalf("delivered while paused: %d messages", len(res.Messages))
	default:
	}
	var leased int
	require.NoError(t, e.store.Pool().QueryRow(context.Background(),
		`SELECT count(*) FROM consumers WHERE lease_id IS NOT NULL`).Scan(&leased))
	assert.Zero(t, leased, "no lease taken")

	e.p.SetPaused(false)
	res := receive1(t, got)
	assert.Equal(t, []int{1, 2, 3}, ns(res))
	assert.Equal(t, []int{1}, ns(receive(t, waiter, 5*time.Second)))
}
