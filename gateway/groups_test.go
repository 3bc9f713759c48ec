package gateway_test

import (
	"encoding/json"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/auth"
)

// datas lists the payloads of a pop (nil for 204).
func datas(t *testing.T, e *env, path string) []string {
	t.Helper()
	r := e.get(path)
	if r.status == http.StatusNoContent {
		return nil
	}
	require.Equal(t, http.StatusOK, r.status, "%s: %s", path, r)
	var res popResult
	require.NoError(t, json.Unmarshal(r.body, &res))
	out := []string{}
	for _, m := range res.Messages {
		out = append(out, string(m.Data))
	}
	return out
}

// GET /api/v1/consumer-groups, /lagging and /{group}, in the
// reference server's shapes, over Herald's rows; an unknown group is 404;
// nothing yet is 200 [] (the reference sends an empty body).
func TestGroups_Reads(t *testing.T) {
	e := newEnv(t)
	r := e.get("/api/v1/consumer-groups")
	require.Equal(t, http.StatusOK, r.status)
	assert.JSONEq(t, `[]`, string(r.body))

	e.pushItems(`[{"queue":"orders","partition":"a","payload":1},{"queue":"orders","partition":"a","payload":2},
		{"queue":"orders","partition":"b","payload":3}]`)
	// billing reads a's first message and acks it; ops subscribes as new.
	res := e.pop("/api/v1/pop/queue/orders/partition/a?consumerGroup=billing")
	require.Len(t, res.Messages, 1)
	e.ack(res.Messages[0], "completed", "")
	e.popEmpty("/api/v1/pop/queue/orders?consumerGroup=ops&subscriptionMode=new&wait=false")
	// The messages waited 10 minutes: a lagging group.
	e.exec(`UPDATE messages SET created_at = created_at - interval '10 minutes'`)
	e.exec(`UPDATE partitions SET last_push_at = last_push_at - interval '10 minutes'`)

	r = e.get("/api/v1/consumer-groups")
	require.Equal(t, http.StatusOK, r.status)
	var list []map[string]any
	require.NoError(t, json.Unmarshal(r.body, &list))
	require.Len(t, list, 2, "%s", r)
	billing, ops := list[0], list[1]
	assert.Equal(t, "billing", billing["name"])
	assert.Equal(t, []any{"orders"}, billing["topics"])
	assert.Equal(t, "orders", billing["queueName"])
	assert.EqualValues(t, 2, billing["members"], "a row on both partitions")
	assert.EqualValues(t, 2, billing["partitionsWithLag"])
	assert.Nil(t, billing["totalLag"])
	assert.GreaterOrEqual(t, billing["maxTimeLag"], float64(599))
	assert.Equal(t, "Lagging", billing["state"])
	assert.Nil(t, billing["subscriptionMode"])
	assert.Equal(t, "new", ops["subscriptionMode"])
	assert.Regexp(t, `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`, ops["subscriptionTimestamp"])
	assert.EqualValues(t, 0, ops["partitionsWithLag"], "ops subscribed after the messages")
	assert.Equal(t, "Dead", ops["state"], "never consumed anything")
	assert.ElementsMatch(t, []string{"name", "topics", "queueName", "members", "partitionsWithLag", "totalLag", "maxTimeLag",
		"state", "subscriptionMode", "subscriptionTimestamp", "subscriptionCreatedAt", "lastSeenAt", "idleGroupRetentionSeconds"},
		keys(t, array(t, r.body)[0]))

	r = e.get("/api/v1/consumer-groups/lagging?minLagSeconds=60")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	var lagging []map[string]any
	require.NoError(t, json.Unmarshal(r.body, &lagging))
	require.Len(t, lagging, 2, "billing on a and b: %s", r)
	for _, l := range lagging {
		assert.Equal(t, "billing", l["consumer_group"])
		assert.EqualValues(t, 1, l["offset_lag"])
		assert.GreaterOrEqual(t, l["time_lag_seconds"], float64(599))
		assert.InDelta(t, 0.17, l["lag_hours"], 0.01)
	}
	assert.ElementsMatch(t, []string{"consumer_group", "queue_name", "partition_name", "partition_id", "worker_id", "offset_lag",
		"time_lag_seconds", "lag_hours", "oldest_unconsumed_at", "last_consumed_at"}, keys(t, array(t, r.body)[0]))
	r = e.get("/api/v1/consumer-groups/lagging?minLagSeconds=3600")
	assert.JSONEq(t, `[]`, string(r.body), "nothing waited an hour")
	assertError(t, e.get("/api/v1/consumer-groups/lagging?minLagSeconds=soon"), http.StatusBadRequest,
		"minLagSeconds must be an integer between 0 and 315360000")

	r = e.get("/api/v1/consumer-groups/billing")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	var detail map[string]struct{ Partitions []map[string]any }
	require.NoError(t, json.Unmarshal(r.body, &detail))
	parts := detail["orders"].Partitions
	require.Len(t, parts, 2)
	assert.Equal(t, "a", parts[0]["partition"])
	assert.EqualValues(t, 1, parts[0]["totalConsumed"])
	assert.EqualValues(t, 1, parts[0]["offsetLag"])
	assert.NotNil(t, parts[0]["lastConsumedAt"])
	assert.Equal(t, false, parts[0]["leaseActive"])
	assert.EqualValues(t, 0, parts[1]["totalConsumed"])
	assert.Nil(t, parts[1]["lastConsumedAt"])
	assertError(t, e.get("/api/v1/consumer-groups/nobody"), http.StatusNotFound, "Consumer group not found")
}

// Seeking a group by time re-delivers what came after the time,
// acked or not; to the end skips everything; one partition's seek moves
// only it; every moved row loses its lease, so a holder's late ack is
// refused and the message is delivered again (nothing lost).
func TestGroups_Seek(t *testing.T) {
	e := newEnv(t)
	e.pushItems(`[{"queue":"s","partition":"a","payload":1},{"queue":"s","partition":"a","payload":2}]`)
	e.exec(`UPDATE messages SET created_at = created_at - interval '1 hour'`)
	mid := time.Now().Add(-30 * time.Minute).UTC()
	e.pushItems(`[{"queue":"s","partition":"a","payload":3},{"queue":"s","partition":"b","payload":4}]`)

	all := datas(t, e, "/api/v1/pop/queue/s?consumerGroup=g&batch=10&partitions=2&autoAck=true&wait=false")
	sort.Strings(all)
	assert.Equal(t, []string{"1", "2", "3", "4"}, all)

	// Back to the middle: 3 and 4 again, not 1 and 2.
	r := e.post("/api/v1/consumer-groups/g/queues/s/seek", `{"timestamp":"`+mid.Format(time.RFC3339Nano)+`"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	var seek map[string]any
	require.NoError(t, json.Unmarshal(r.body, &seek))
	assert.Equal(t, map[string]any{"success": true, "consumerGroup": "g", "queueName": "s", "seekToEnd": false,
		"targetTimestamp": mid.Format("2006-01-02T15:04:05.000Z"), "partitionsUpdated": float64(2)}, seek)
	popped := e.pop("/api/v1/pop/queue/s?consumerGroup=g&batch=10&partitions=2&wait=false")
	var again []string
	for _, m := range popped.Messages {
		again = append(again, string(m.Data))
		// Given back, to be read again below.
		require.True(t, e.ack(m, "retry", "").Success)
	}
	sort.Strings(again)
	assert.Equal(t, []string{"3", "4"}, again)

	// That pop holds leases: seeking to the end ends them; the holder's
	// ack is refused; nothing is left to read; a new push is read.
	held := e.pop("/api/v1/pop/queue/s/partition/a?consumerGroup=h&batch=10")
	require.Len(t, held.Messages, 3)
	r = e.post("/api/v1/consumer-groups/h/queues/s/seek", `{"toEnd":true,"timestamp":"2000-01-01T00:00:00Z"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Contains(t, string(r.body), `"seekToEnd":true`, "toEnd wins")
	assert.Contains(t, string(r.body), `"targetTimestamp":null`)
	res := e.ack(held.Messages[0], "completed", "")
	assert.False(t, res.Success, "the lease ended with the seek")
	e.popEmpty("/api/v1/pop/queue/s?consumerGroup=h&partitions=2&wait=false")
	e.pushItems(`[{"queue":"s","partition":"a","payload":5}]`)
	assert.Equal(t, []string{"5"}, datas(t, e, "/api/v1/pop/queue/s?consumerGroup=h&wait=false&autoAck=true"))

	// One partition: to its end; updated false where the group has no row
	// or the partition nothing; unknown partition 404.
	r = e.post("/api/v1/consumer-groups/g/queues/s/partitions/a/seek", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	var one map[string]any
	require.NoError(t, json.Unmarshal(r.body, &one))
	assert.Equal(t, true, one["updated"])
	assert.Regexp(t, `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`, one["cursorMovedTo"])
	assert.Equal(t, []string{"4"}, datas(t, e, "/api/v1/pop/queue/s?consumerGroup=g&partitions=2&batch=10&wait=false"),
		"a moved to its end (5 skipped); b untouched")
	r = e.post("/api/v1/consumer-groups/stranger/queues/s/partitions/a/seek", "")
	assert.Contains(t, string(r.body), `"updated":false`)
	assertError(t, e.post("/api/v1/consumer-groups/g/queues/s/partitions/zz/seek", ""), http.StatusNotFound, "Partition not found")
	assertError(t, e.post("/api/v1/consumer-groups/g/queues/s/seek", `{}`), http.StatusBadRequest,
		"Must specify either 'toEnd': true or 'timestamp'")
	assertError(t, e.post("/api/v1/consumer-groups/g/queues/s/seek", `{"timestamp":"yesterday"}`), http.StatusBadRequest,
		"timestamp must be an RFC 3339 time string")
	assertError(t, e.post("/api/v1/consumer-groups/g/queues/s/seek", `{"toEnd":"yes"}`), http.StatusBadRequest,
		"toEnd must be true or false")
}

// Deleting a group removes its positions and leases; with its
// metadata (the default) its next read registers it afresh with that
// read's subscription; keeping the metadata, it starts over at its
// subscription point. A group's subscription time can be moved; it counts
// where the group has no position yet. Scoped to one queue, the others
// keep theirs.
func TestGroups_DeleteGroupAndSubscription(t *testing.T) {
	e := newEnv(t)
	e.push("d1", `1`)
	e.popEmpty("/api/v1/pop/queue/d1?consumerGroup=g&subscriptionMode=new&wait=false")
	e.push("d1", `2`)
	e.push("d2", `1`)
	assert.Equal(t, []string{"2"}, datas(t, e, "/api/v1/pop/queue/d1?consumerGroup=g&autoAck=true&wait=false"))
	assert.Equal(t, []string{"1"}, datas(t, e, "/api/v1/pop/queue/d2?consumerGroup=g&autoAck=true&wait=false"))
	held := e.pop("/api/v1/pop/queue/d1?consumerGroup=other")
	require.Len(t, held.Messages, 1)

	// Keeping the metadata: back to the subscription point (after 1).
	r := e.do(http.MethodDelete, "/api/v1/consumer-groups/g/queues/d1?deleteMetadata=false", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.JSONEq(t, `{"success":true,"consumerGroup":"g","queueName":"d1","deletedPartitions":1,"metadataDeleted":false}`, string(r.body))
	assert.Equal(t, []string{"2"}, datas(t, e, "/api/v1/pop/queue/d1?consumerGroup=g&autoAck=true&wait=false"))
	e.popEmpty("/api/v1/pop/queue/d2?consumerGroup=g&wait=false") // d2 kept its position

	// Moving the subscription earlier, then deleting (metadata kept): it
	// starts at the new time, so it reads 1 and 2.
	r = e.post("/api/v1/consumer-groups/g/subscription", `{"subscriptionTimestamp":"2000-01-01T00:00:00Z"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.JSONEq(t, `{"success":true,"consumerGroup":"g","newTimestamp":"2000-01-01T00:00:00Z","rowsUpdated":2}`, string(r.body))
	e.popEmpty("/api/v1/pop/queue/d1?consumerGroup=g&wait=false") // cursors did not move
	r = e.do(http.MethodDelete, "/api/v1/consumer-groups/g?deleteMetadata=false", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Contains(t, string(r.body), `"deletedPartitions":2`)
	assert.Equal(t, []string{"1", "2"}, datas(t, e, "/api/v1/pop/queue/d1?consumerGroup=g&batch=10&autoAck=true&wait=false"))

	// Deleting with the metadata: the next read's subscription decides.
	r = e.do(http.MethodDelete, "/api/v1/consumer-groups/g", "")
	require.Equal(t, http.StatusOK, r.status)
	assert.JSONEq(t, `{"success":true,"consumerGroup":"g","deletedPartitions":2,"metadataDeleted":true}`, string(r.body))
	e.popEmpty("/api/v1/pop/queue/d1?consumerGroup=g&subscriptionMode=new&wait=false")
	r = e.get("/api/v1/consumer-groups")
	assert.Contains(t, string(r.body), `"subscriptionMode":"new"`)

	// Another group's lease was untouched by all this.
	assert.True(t, e.ack(held.Messages[0], "completed", "").Success)
	// Nothing to delete is not an error.
	r = e.do(http.MethodDelete, "/api/v1/consumer-groups/nobody", "")
	assert.JSONEq(t, `{"success":true,"consumerGroup":"nobody","deletedPartitions":0,"metadataDeleted":true}`, string(r.body))
	assertError(t, e.post("/api/v1/consumer-groups/g/subscription", `{}`), http.StatusBadRequest, "Missing subscriptionTimestamp in request body")
	assertError(t, e.post("/api/v1/consumer-groups/g/subscription", `{"subscriptionTimestamp":5}`), http.StatusBadRequest,
		"subscriptionTimestamp must be an RFC 3339 time string")
	assertError(t, e.do(http.MethodDelete, "/api/v1/consumer-groups/g?deleteMetadata=maybe", ""), http.StatusBadRequest,
		"deleteMetadata must be true or false")
}

// Seek and group deletion racing a live WebSocket subscription
// of that group: the subscription keeps running, its deliveries under an
// ended lease are refused when acked and come again, and everything pushed
// is received at least once; nothing is lost.
func TestGroups_SeekAndDeleteUnderALiveSubscription(t *testing.T) {
	e := newEnv(t)
	require.Equal(t, http.StatusOK, e.post("/api/v1/configure", `{"queue":"live"}`).status)
	ws := e.dialWS(t)
	ws.subscribe(`{"type":"subscribe","id":1,"queue":"live","consumerGroup":"g","batch":10,"maxInFlight":10}`)
	seen := map[string]int{}
	var acks []message
	receive := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for seen[want] == 0 {
			require.True(t, time.Now().Before(deadline), "never received %s (seen %v)", want, seen)
			for _, m := range deliveredMessages(t, ws.next("deliver")) {
				seen[string(m.Data)]++
				acks = append(acks, m)
			}
		}
	}
	// One push: one partition is leased to one consumer of a group at a
	// time, so these come in one delivery and the next waits for its ack.
	e.push("live", `1`, `2`, `3`)
	receive("3")
	// Unacked: seek back to the beginning. The leases end; the old ack is
	// refused per item; 1–3 come again on the same subscription.
	r := e.post("/api/v1/consumer-groups/g/queues/live/seek", `{"timestamp":"2000-01-01T00:00:00Z"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	ws.send(ackFrame(acks, "completed"))
	res := ws.next("ack_result")
	assert.Contains(t, string(res["results"]), `"success":false`, "acks under the ended lease are refused")
	acks = nil
	seen = map[string]int{}
	receive("1")
	receive("3")
	ws.send(ackFrame(acks, "completed"))
	ws.next("ack_result")

	// Delete the group (metadata and all) while subscribed: new pushes
	// still reach the subscription (its group registered again).
	r = e.do(http.MethodDelete, "/api/v1/consumer-groups/g", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	e.push("live", `4`)
	receive("4")
	assert.LessOrEqual(t, seen["4"], 1)
}

// Roles as the reference server's for the group routes: reads
// read-only, seek and subscription read-write, deletes admin; a token
// with rights acts only on queues it may consume whole, and sees only
// those.
func TestGroups_RoutesRoles(t *testing.T) {
	e := newAuthEnv(t)
	ro := auth.SignToken(authSecret, "r", "read-only", time.Hour)
	rw := auth.SignToken(authSecret, "w", "read-write", time.Hour)
	admin := auth.SignToken(authSecret, "a", "admin", time.Hour)
	require.Equal(t, http.StatusCreated, e.doAuth(http.MethodPost, "/api/v1/push", rw, `{"items":[{"queue":"mail","partition":"bob","payload":1}]}`).status)
	require.Equal(t, http.StatusOK, e.doAuth(http.MethodGet, "/api/v1/pop/queue/mail?consumerGroup=g&autoAck=true", rw, "").status)
	for _, c := range []struct {
		method, path, body, token string
		want                      int
	}{
		{"GET", "/api/v1/consumer-groups", "", ro, 200},
		{"GET", "/api/v1/consumer-groups/lagging", "", ro, 200},
		{"GET", "/api/v1/consumer-groups/g", "", ro, 200},
		{"POST", "/api/v1/consumer-groups/g/queues/mail/seek", `{"toEnd":true}`, ro, 403},
		{"POST", "/api/v1/consumer-groups/g/queues/mail/seek", `{"toEnd":true}`, rw, 200},
		{"POST", "/api/v1/consumer-groups/g/queues/mail/partitions/bob/seek", ``, rw, 200},
		{"POST", "/api/v1/consumer-groups/g/subscription", `{"subscriptionTimestamp":"2020-01-01T00:00:00Z"}`, ro, 403},
		{"POST", "/api/v1/consumer-groups/g/subscription", `{"subscriptionTimestamp":"2020-01-01T00:00:00Z"}`, rw, 200},
		{"DELETE", "/api/v1/consumer-groups/g/queues/mail", "", rw, 403},
		{"DELETE", "/api/v1/consumer-groups/g", "", rw, 403},
		{"DELETE", "/api/v1/consumer-groups/g/queues/mail", "", admin, 200},
	} {
		r := e.doAuth(c.method, c.path, c.token, c.body)
		assert.Equal(t, c.want, r.status, "%s %s: %s", c.method, c.path, r)
	}

	// Alice's mailbox token: no whole queue, so no group listed, no seek
	// of the queue; her own partition she may seek.
	alice := mailbox(t, "alice")
	r := e.doAuth(http.MethodGet, "/api/v1/consumer-groups", alice, "")
	assert.JSONEq(t, `[]`, string(r.body))
	assert.Equal(t, http.StatusForbidden, e.doAuth(http.MethodPost, "/api/v1/consumer-groups/g/queues/mail/seek", alice, `{"toEnd":true}`).status)
	assert.Equal(t, http.StatusForbidden, e.doAuth(http.MethodPost, "/api/v1/consumer-groups/g/queues/mail/partitions/bob/seek", alice, ``).status)
	require.Equal(t, http.StatusCreated, e.doAuth(http.MethodPost, "/api/v1/push", alice,
		`{"items":[{"queue":"mail","partition":"alice","payload":2}]}`).status)
	r = e.doAuth(http.MethodPost, "/api/v1/consumer-groups/g/queues/mail/partitions/alice/seek", alice, ``)
	assert.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Contains(t, string(r.body), `"partitionName":"alice"`)
	assert.Equal(t, http.StatusForbidden, e.doAuth(http.MethodPost, "/api/v1/consumer-groups/g/subscription", alice,
		`{"subscriptionTimestamp":"2020-01-01T00:00:00Z"}`).status)
	assert.False(t, strings.Contains(string(e.doAuth(http.MethodGet, "/api/v1/consumer-groups/lagging?minLagSeconds=0", alice, "").body), "bob"))
}

// A seek back over a message deleted from the middle of a
// partition reads around it (the deleted offset counts as done), and the
// group is not left waiting for it.
func TestGroups_SeekOverADeletedMessage(t *testing.T) {
	e := newEnv(t)
	pushed := e.push("holes", `1`, `2`, `3`)
	assert.Equal(t, []string{"1", "2", "3"}, datas(t, e, "/api/v1/pop/queue/holes?consumerGroup=g&batch=10&autoAck=true&wait=false"))
	r := e.do(http.MethodDelete, "/api/v1/messages/"+pushed[1].PartitionID+"/"+pushed[1].TransactionID, "")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	r = e.post("/api/v1/consumer-groups/g/queues/holes/seek", `{"timestamp":"2000-01-01T00:00:00Z"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Equal(t, []string{"1", "3"}, datas(t, e, "/api/v1/pop/queue/holes?consumerGroup=g&batch=10&autoAck=true&wait=false"))
	e.push("holes", `4`)
	assert.Equal(t, []string{"4"}, datas(t, e, "/api/v1/pop/queue/holes?consumerGroup=g&batch=10&autoAck=true&wait=false"),
		"not stuck at the deleted offset")
}
