package queue_test

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// A queue's priority orders pops by namespace and by task, as
// the reference server does: higher priorities are served first, whatever
// order the queues were created or pushed to in; the pre-flight reports
// the priority so the poller's decision follows it too.
func TestPop_PriorityOrdersNamespacePops(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	for name, prio := range map[string]int{"ns.low": 0, "ns.high": 10, "ns.mid": 5} {
		_, err := s.Configure(ctx, queue.ConfigureRequest{Queue: name, Namespace: "ns", Task: "t",
			Options: json.RawMessage(`{"priority":` + strconv.Itoa(prio) + `}`)})
		require.NoError(t, err)
	}
	for _, q := range []string{"ns.low", "ns.mid", "ns.high"} { // the lowest first
		push(t, s, q, "", nums(1, 2)...)
	}
	av, err := s.Preflight(ctx, []queue.Target{{Namespace: "ns"}})
	require.NoError(t, err)
	prio := map[string]int{}
	for _, a := range av {
		prio[a.Queue] = a.Priority
	}
	assert.Equal(t, map[string]int{"ns.low": 0, "ns.mid": 5, "ns.high": 10}, prio)

	var order []string
	for range 3 {
		res := pop(t, s, queue.PopRequest{Namespace: "ns", Batch: 1})
		require.Len(t, res.Messages, 1)
		order = append(order, res.Queue)
	}
	assert.Equal(t, []string{"ns.high", "ns.mid", "ns.low"}, order, "each pop takes the highest priority free")
	res := pop(t, s, queue.PopRequest{Task: "t", Batch: 1, Group: "g"})
	require.Len(t, res.Messages, 1)
	assert.Equal(t, "ns.high", res.Queue, "by task too")
}
