package gateway_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/gateway"
	"github.com/heraldmq/herald/poller"
)

// Acks over a WebSocket resolve per delivery, never per
// connection; what follows an ack happens whichever path made it.

// settledState is the queue's state in the database: what every group has
// left to do, the leases holding a message not done and the dead letters.
func (e *env) settledState(q string) (lag, leased, dead int) {
	e.t.Helper()
	require.NoError(e.t, e.store.Pool().QueryRow(ctxT(e.t), `SELECT coalesce(sum(p.last_offset - c.cursor - cardinality(c.done)), 0),
		count(*) FILTER (WHERE c.lease_id IS NOT NULL AND greatest(c.lease_to,
			CASE WHEN c.follow_lease = c.lease_id THEN p.last_offset ELSE 0 END) > c.cursor)
		FROM consumers c JOIN partitions p ON p.id = c.partition_id JOIN queues q ON q.id = p.queue_id WHERE q.name = $1`, q).
		Scan(&lag, &leased))
	require.NoError(e.t, e.store.Pool().QueryRow(ctxT(e.t), `SELECT count(*) FROM dead_letters d JOIN queues q ON q.id = d.queue_id
		WHERE q.name = $1`, q).Scan(&dead))
	return lag, leased, dead
}

// deliveries reads deliver frames until every subscription got n messages.
func deliveries(t *testing.T, c *wsClient, subs []string, n int) map[string][]message {
	t.Helper()
	got := map[string][]message{}
	for done := 0; done < len(subs); {
		f := c.next("deliver")
		var sub string
		require.NoError(t, json.Unmarshal(f["sub"], &sub))
		got[sub] = append(got[sub], deliveredMessages(t, f)...)
		if len(got[sub]) == n {
			done++
		}
	}
	return got
}

// The bug as a browser met it: one socket, one queue, two (and three)
// groups; every ack was refused (the connection kept one group per
// message), the leases expired and with retryLimit 1 the messages went to
// every group's DLQ. The acks name only the message and its lease, as
// herald.js sent them; each group's deliveries are acked in reverse order.
func TestWS_GroupsOnOneSocketAckPerDelivery(t *testing.T) {
	t.Parallel()
	for _, groups := range [][]string{{"g1", "g2"}, {"g1", "g2", "g3"}} {
		t.Run(fmt.Sprintf("%dGroups", len(groups)), func(t *testing.T) {
			e := newEnv(t)
			q := fmt.Sprintf("one-socket-%d", len(groups))
			require.Equal(t, http.StatusOK, e.post("/api/v1/configure", `{"queue":"`+q+`","options":{"retryLimit":1}}`).status)
			c := e.dialWS(t)
			var subs []string
			for _, g := range groups {
				subs = append(subs, c.subscribe(`{"type":"subscribe","queue":"`+q+`","consumerGroup":"`+g+`","batch":5,"maxInFlight":5}`))
			}
			e.push(q, `1`, `2`, `3`, `4`, `5`)
			got := deliveries(t, c, subs, 5)
			for i := len(subs) - 1; i >= 0; i-- {
				ms := got[subs[i]]
				items := make([]string, len(ms))
				for j := range ms {
					m := ms[len(ms)-1-j]
					items[j] = fmt.Sprintf(`{"transactionId":%q,"partitionId":%q,"leaseId":%q}`, m.TransactionID, m.PartitionID, m.LeaseID)
				}
				c.send(`{"type":"ack","id":"a","items":[` + strings.Join(items, ",") + `]}`)
				var res []ackResult
				require.NoError(t, json.Unmarshal(c.next("ack_result")["results"], &res))
				for _, r := range res {
					assert.True(t, r.Success, "group %s, item %d: %s", groups[i], r.Index, deref(r.Error))
				}
			}
			lag, leased, dead := e.settledState(q)
			assert.Zero(t, lag, "every group finished")
			assert.Zero(t, leased, "no message left under a lease")
			assert.Zero(t, dead, "nothing dead-lettered")
		})
	}
}

// Without a leaseId an item is matched by the message and the sub or group
// it names; ambiguous or foreign items get a per-item error and change
// nothing, and the other items of the frame are applied.
func TestWS_AckItemsResolvePerDelivery(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.dialWS(t)
	s1 := c.subscribe(`{"type":"subscribe","queue":"resolve","consumerGroup":"a","batch":1,"maxInFlight":1}`)
	s2 := c.subscribe(`{"type":"subscribe","queue":"resolve","consumerGroup":"b","batch":1,"maxInFlight":1}`)
	e.push("resolve", `1`)
	got := deliveries(t, c, []string{s1, s2}, 1)
	ma, mb := got[s1][0], got[s2][0]
	require.Equal(t, ma.TransactionID, mb.TransactionID, "the same message, two deliveries")
	require.NotEqual(t, ma.LeaseID, mb.LeaseID)

	item := func(extra string) string {
		return fmt.Sprintf(`{"transactionId":%q,"partitionId":%q%s}`, ma.TransactionID, ma.PartitionID, extra)
	}
	c.send(`{"type":"ack","id":"x","items":[` + strings.Join([]string{
		item(``), // which of the two?
		item(`,"leaseId":"01a20000-0000-7000-8000-000000000000"`),   // not a lease of this connection
		item(fmt.Sprintf(`,"leaseId":%q,"sub":%q`, ma.LeaseID, s2)), // a's lease, b's subscription
		item(`,"consumerGroup":"a"`),                                // a's delivery
		item(fmt.Sprintf(`,"sub":%q`, s2)),                          // b's delivery
	}, ",") + `]}`)
	var res []ackResult
	require.NoError(t, json.Unmarshal(c.next("ack_result")["results"], &res))
	require.Len(t, res, 5)
	for i, want := range []string{gateway.ErrTextAmbiguous, gateway.ErrTextNotHeld, gateway.ErrTextNotHeld} {
		assert.False(t, res[i].Success, "item %d", i)
		require.NotNil(t, res[i].Error, "item %d", i)
		assert.Equal(t, want, *res[i].Error, "item %d", i)
		assert.Equal(t, i, res[i].Index)
	}
	assert.True(t, res[3].Success, "%s", deref(res[3].Error))
	assert.True(t, res[4].Success, "%s", deref(res[4].Error))
	assert.Equal(t, 4, res[4].Index)
	lag, leased, dead := e.settledState("resolve")
	assert.Zero(t, lag+leased+dead)
}

// A transaction's acks wake a consumer waiting on the partition at once
// (the sweep is a minute away here) and give an SSE stream of this instance
// its credit back at once (its lease check is a minute away too).
func TestTransactionAcksFollowedAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnvPolling(t, func(c *poller.Config) { c.SweepMin, c.SweepMax = time.Minute, time.Minute },
		func(c *gateway.Config) { c.SSELeaseCheck = time.Minute })

	t.Run("WakesALongPoll", func(t *testing.T) {
		e.push("tx-wake", `1`, `2`)
		held := e.pop("/api/v1/pop/queue/tx-wake?batch=1")
		require.Len(t, held.Messages, 1)
		waiting := e.waitingPop("/api/v1/pop/queue/tx-wake?wait=true&timeout=10000&batch=1")
		m := held.Messages[0]
		r := e.post("/api/v1/transaction", fmt.Sprintf(`{"operations":[{"type":"ack","transactionId":%q,"partitionId":%q}],
			"requiredLeases":[%q]}`, m.TransactionID, m.PartitionID, held.LeaseID))
		require.Contains(t, string(r.body), `"success":true`, "%s", r)
		res := <-waiting
		require.Equal(t, http.StatusOK, res.status, "the waiting consumer got the rest at once: %s", res)
		var pr popResult
		require.NoError(t, json.Unmarshal(res.body, &pr))
		require.Len(t, pr.Messages, 1)
		assert.JSONEq(t, `2`, string(pr.Messages[0].Data))
	})

	t.Run("ReturnsSSECredit", func(t *testing.T) {
		st := e.openSSE(t, "/api/v1/sse/queue/tx-sse?maxInFlight=1&batch=1", nil)
		e.push("tx-sse", `1`, `2`)
		m, _ := st.next()
		assert.JSONEq(t, `1`, string(m.Data))
		st.nothing(300 * time.Millisecond) // credit 1: nothing more until the ack
		r := e.post("/api/v1/transaction", fmt.Sprintf(`{"operations":[{"type":"ack","transactionId":%q,"partitionId":%q,"leaseId":%q},
			{"type":"push","items":[{"queue":"tx-other","payload":3}]}]}`, m.TransactionID, m.PartitionID, m.LeaseID))
		require.Contains(t, string(r.body), `"success":true`, "%s", r)
		next, _ := st.next()
		assert.JSONEq(t, `2`, string(next.Data), "credit came back with the transaction's ack")
	})
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// A lease that expires gives its credit back to the
// WebSocket subscription holding the delivery (through the lease check),
// so a subscription whose client never answered is not stuck at zero
// credit: the message comes to it again.
func TestWS_ExpiredLeaseGivesCreditBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *gateway.Config) { c.WSLeaseCheck = 200 * time.Millisecond })
	c := e.dialWS(t)
	c.subscribe(`{"type":"subscribe","queue":"ws-expiry","batch":1,"maxInFlight":1}`)
	e.push("ws-expiry", `1`)
	first := deliveredMessages(t, c.next("deliver"))[0]
	e.exec(`UPDATE consumers SET lease_expires_at = now() - interval '1 second' WHERE lease_id IS NOT NULL`)
	again := deliveredMessages(t, c.next("deliver"))[0]
	assert.Equal(t, first.TransactionID, again.TransactionID)
	assert.Equal(t, 1, again.RetryCount, "the expiry counted an attempt")
	assert.NotEqual(t, first.LeaseID, again.LeaseID)
}

// An ack's credit comes back when the connection reads the ack, not when
// the ack's transaction commits: while another transaction holds the acked
// partition's consumer row (so the ack waits for it), the subscription,
// at maxInFlight 1, is already leased a message of another partition.
func TestWS_AckCreditBeforeItsCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxT(t)
	c := e.dialWS(t)
	c.subscribe(`{"type":"subscribe","queue":"ws-early-credit","batch":1,"maxInFlight":1}`)
	e.pushItems(`[{"queue":"ws-early-credit","partition":"a","payload":1},
		{"queue":"ws-early-credit","partition":"b","payload":2}]`)
	first := deliveredMessages(t, c.next("deliver"))
	require.Len(t, first, 1)

	tx, err := e.store.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM consumers WHERE partition_id = $1::uuid FOR UPDATE`, first[0].PartitionID)
	require.NoError(t, err)
	c.send(ackFrame(first, "completed"))

	second := deliveredMessages(t, c.next("deliver")) // before the ack can commit
	require.Len(t, second, 1)
	assert.NotEqual(t, first[0].PartitionID, second[0].PartitionID)
	assert.Empty(t, c.pending, "no ack_result while its transaction waits")

	require.NoError(t, tx.Rollback(ctx))
	var results []ackResult
	require.NoError(t, json.Unmarshal(c.next("ack_result")["results"], &results))
	require.Len(t, results, 1)
	assert.True(t, results[0].Success, "the ack applied once the row was free")
	c.send(ackFrame(second, "completed"))
	c.next("ack_result")
	lag, leased, dead := e.settledState("ws-early-credit")
	assert.Equal(t, [3]int{0, 0, 0}, [3]int{lag, leased, dead})
}

// A delivery made while the lease check reads the leases (under a lease
// taken after that read) is not judged by the read: it stays the
// connection's, and its ack is taken. Judged by it, it was forgotten as if
// acked elsewhere, its ack refused ("not delivered on this connection",
// which the SDK does not look at), and its lease, never acked, held its
// partition for the lease time.
func TestWS_DeliveryMadeDuringALeaseCheckIsNotForgotten(t *testing.T) {
	e := newEnvPolling(t, func(c *poller.Config) { c.FollowIdle = 10 * time.Millisecond },
		func(c *gateway.Config) { c.WSLeaseCheck = 20 * time.Millisecond })
	c := e.dialWS(t)
	c.subscribe(`{"type":"subscribe","queue":"ws-check-race","batch":5,"maxInFlight":10}`)
	reading, resume := make(chan struct{}), make(chan struct{})
	var reads atomic.Int32
	gateway.OnLeaseCheckRead(t, func() {
		if reads.Add(1) == 1 {
			close(reading)
			<-resume
		}
	})
	e.push("ws-check-race", `1`)
	first := deliveredMessages(t, c.next("deliver"))
	select {
	case <-reading: // the check read the lease of 1, and waits
	case <-time.After(5 * time.Second):
		t.Fatal("no lease check while 1 was unacknowledged")
	}
	c.send(ackFrame(first, "completed"))
	c.next("ack_result")
	require.Eventually(t, func() bool { return e.partitionLease("ws-check-race", "Default") == "" }, 5*time.Second,
		10*time.Millisecond, "the idle following lease given back")
	e.push("ws-check-race", `2`)
	second := deliveredMessages(t, c.next("deliver"))
	require.NotEqual(t, first[0].LeaseID, second[0].LeaseID, "under a new lease")
	checked := make(chan struct{})
	gateway.OnLeaseCheckDone(t, func() {
		select {
		case checked <- struct{}{}:
		default:
		}
	})
	close(resume)
	select {
	case <-checked: // the check that read before 2 judged the deliveries
	case <-time.After(5 * time.Second):
		t.Fatal("the lease check did not end")
	}

	c.send(ackFrame(second, "completed"))
	var results []ackResult
	require.NoError(t, json.Unmarshal(c.next("ack_result")["results"], &results))
	require.Len(t, results, 1)
	assert.True(t, results[0].Success, "the ack of 2, delivered during the check, is taken: %v", ptrText(results[0].Error))
}

// ptrText is *s, or "" for nil.
func ptrText(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
