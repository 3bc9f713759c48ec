package poller_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
)

// A reconciliation of the instance's leases gives back those below
// LeaseBound that no stream holds: a lease a pop made and has not handed
// to its subscription yet must stay at or above it. Seen from inside
// Deliver (the pop's last step) the bound is below the delivery's lease;
// once delivered, a new bound is above it.
func TestPoller_LeaseBoundStaysBelowALeaseUntilItIsDelivered(t *testing.T) {
	e := newEnv(t)
	type seen struct{ lease, bound string }
	got := make(chan seen, 10)
	sub := &poller.Intention{Target: queue.Target{Queue: "q"}, Batch: 10, Credit: 10, Standing: true,
		Deliver: func(res *queue.PopResult) bool {
			got <- seen{res.Messages[0].LeaseID, e.p.LeaseBound()}
			return true
		}}
	cancel := e.p.Register(sub)
	defer cancel()
	e.push("q", "", 1, 3)
	var s seen
	select {
	case s = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("no delivery within 5 s")
	}
	require.NotEmpty(t, s.lease)
	assert.Less(t, s.bound, s.lease, "while the pop delivers, the bound stays below its lease")
	eventually(t, 5*time.Second, func() bool { return e.p.LeaseBound() > s.lease },
		"once delivered, the bound passes its lease")
}
