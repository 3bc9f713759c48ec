package gateway_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// randomSocket drives one WebSocket through random interleavings of
// subscribe, unsubscribe, ack, nack and reconnect, in several groups on one
// queue, and records which acks the server took.
type randomSocket struct {
	t     *testing.T
	e     *env
	rnd   *rand.Rand
	q     string
	c     *wsClient
	subs  map[string]string             // sub → group
	held  map[string]map[string]message // sub → transactionId → delivery not yet settled
	acked map[string]map[string]int     // group → transactionId → completed acks answered success
	// again lists deliveries of a message its group had completed, read
	// after the answer to that ack: the server must never send them.
	again []string
	seq   int
}

// pump reads the frames that arrived within wait, after those already read
// (takePending).
func (r *randomSocket) pump(wait time.Duration) {
	r.takePending()
	deadline := time.After(wait)
	for {
		select {
		case f := <-r.c.frames:
			r.take(f)
		case <-deadline:
			return
		}
	}
}

// takePending takes the frames read so far while waiting for another.
func (r *randomSocket) takePending() {
	pending := r.c.pending
	r.c.pending = nil
	for _, f := range pending {
		r.take(f)
	}
}

// take holds a delivery's messages by their subscription (those of a
// subscription that ended are dropped: the server gave their leases back)
// and keeps any other frame pending.
func (r *randomSocket) take(f map[string]json.RawMessage) {
	if string(f["type"]) != `"deliver"` {
		r.c.pending = append(r.c.pending, f)
		return
	}
	var sub string
	require.NoError(r.t, json.Unmarshal(f["sub"], &sub))
	g, ok := r.subs[sub]
	if !ok {
		return
	}
	for _, m := range deliveredMessages(r.t, f) {
		if r.acked[g][m.TransactionID] > 0 {
			r.again = append(r.again, fmt.Sprintf("group %s: %s delivered to %s after its ack was answered", g, m.TransactionID, sub))
		}
		r.held[sub][m.TransactionID] = m
	}
}

func (r *randomSocket) subscribe(group string) {
	sub := r.c.subscribe(fmt.Sprintf(`{"type":"subscribe","queue":%q,"consumerGroup":%q,"batch":%d,"maxInFlight":%d}`,
		r.q, group, 1+r.rnd.IntN(4), 2+r.rnd.IntN(8)))
	r.subs[sub], r.held[sub] = group, map[string]message{}
}

func (r *randomSocket) unsubscribe(sub string) {
	r.c.send(fmt.Sprintf(`{"type":"unsubscribe","id":"u","sub":%q}`, sub))
	delete(r.subs, sub)
	delete(r.held, sub)
	r.c.next("unsubscribed")
}

func (r *randomSocket) reconnect() {
	_ = r.c.ws.Close()
	r.c = r.e.dialWS(r.t)
	groups := map[string]bool{}
	for _, g := range r.subs {
		groups[g] = true
	}
	r.subs, r.held = map[string]string{}, map[string]map[string]message{}
	for g := range groups {
		r.subscribe(g)
	}
}

// settle acks (or nacks) some of what sub holds in one frame, naming only
// the message and its lease, and records what the server took.
func (r *randomSocket) settle(sub string, all bool) {
	var items []string
	var ms []message
	var statuses []string
	for _, m := range r.held[sub] {
		if !all && r.rnd.IntN(2) == 0 {
			continue
		}
		status := "completed"
		if !all && r.rnd.IntN(4) == 0 {
			status = []string{"failed", "retry"}[r.rnd.IntN(2)]
		}
		items = append(items, fmt.Sprintf(`{"transactionId":%q,"partitionId":%q,"leaseId":%q,"status":%q}`,
			m.TransactionID, m.PartitionID, m.LeaseID, status))
		ms, statuses = append(ms, m), append(statuses, status)
	}
	if len(items) == 0 {
		return
	}
	r.seq++
	r.c.send(fmt.Sprintf(`{"type":"ack","id":"a%d","items":[%s]}`, r.seq, strings.Join(items, ",")))
	var res []ackResult
	require.NoError(r.t, json.Unmarshal(r.c.next("ack_result")["results"], &res))
	require.Len(r.t, res, len(ms))
	// Frames read before the answer were sent before the ack was taken:
	// take them now, so that only later ones count as deliveries after it.
	r.takePending()
	for i, m := range ms {
		if r.held[sub][m.TransactionID].LeaseID == m.LeaseID {
			delete(r.held[sub], m.TransactionID) // taken, or given back: it comes again
		}
		if res[i].Success && statuses[i] == "completed" {
			r.acked[r.subs[sub]][m.TransactionID]++
		}
	}
}

func (r *randomSocket) anySub() string {
	for sub := range r.subs {
		return sub
	}
	return ""
}

// Random interleavings on one socket settle every message
// exactly once per group, with nothing dead-lettered.
func TestWS_RandomInterleavingsOnOneSocket(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	e := newEnv(t)
	const n = 30
	groups := []string{"r1", "r2", "r3"}
	r := &randomSocket{t: t, e: e, rnd: rand.New(rand.NewPCG(seed, seed)), q: "random-socket", c: e.dialWS(t),
		subs: map[string]string{}, held: map[string]map[string]message{}, acked: map[string]map[string]int{}}
	require.Equal(t, 200, e.post("/api/v1/configure", `{"queue":"random-socket","options":{"retryLimit":1000}}`).status)
	for _, g := range groups {
		r.acked[g] = map[string]int{}
	}
	var items []string
	for i := range n {
		items = append(items, fmt.Sprintf(`{"queue":"random-socket","partition":"p%d","payload":%d}`, i%3, i))
	}
	e.pushItems("[" + strings.Join(items, ",") + "]")

	for range 120 {
		r.pump(5 * time.Millisecond)
		switch k := r.rnd.IntN(10); {
		case k < 3 || len(r.subs) == 0:
			if len(r.subs) < 6 {
				r.subscribe(groups[r.rnd.IntN(len(groups))])
			}
		case k < 4:
			r.unsubscribe(r.anySub())
		case k < 5 && r.rnd.IntN(3) == 0:
			r.reconnect()
		default:
			r.settle(r.anySub(), false)
		}
	}
	// Finish: one subscription per group, everything acked.
	r.reconnect()
	for _, g := range groups {
		found := false
		for _, sg := range r.subs {
			found = found || sg == g
		}
		if !found {
			r.subscribe(g)
		}
	}
	done := func() bool {
		for _, g := range groups {
			if len(r.acked[g]) < n {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(15 * time.Second)
	for !done() && time.Now().Before(deadline) {
		r.pump(20 * time.Millisecond)
		for sub := range r.subs {
			r.settle(sub, true)
		}
	}
	for _, g := range groups {
		assert.Len(t, r.acked[g], n, "group %s settled every message", g)
	}
	// A completed message is never delivered again; a stale copy acked
	// again answers success and changes nothing (acks are idempotent).
	assert.Empty(t, r.again)
	lag, _, dead := e.settledState("random-socket")
	assert.Zero(t, lag, "every group finished")
	assert.Zero(t, dead, "nothing dead-lettered")
}
