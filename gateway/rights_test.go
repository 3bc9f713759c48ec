package gateway_test

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/auth/authtest"
	"github.com/heraldmq/herald/gateway"
	"github.com/heraldmq/herald/queue"
)

// randomUUID is a version 4 UUID in lower case: an id that names nothing.
func randomUUID(t *testing.T) string {
	var b [16]byte
	_, err := rand.Read(b[:])
	require.NoError(t, err)
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// randomResumeToken is an SSE resume token of the documented layout
// (version 1, then partition id, lease id, offset) over random ids.
func randomResumeToken(t *testing.T) string {
	b := make([]byte, 1+32+1)
	_, err := rand.Read(b)
	require.NoError(t, err)
	b[0], b[33] = 1, 1
	return base64.RawURLEncoding.EncodeToString(b)
}

// statements counts the statements the store sends while f runs, by
// operation (queue.QueryStats): what a request costs in round trips. The
// poller's (a stream a case opens is served) are left out.
func statements(t *testing.T, e *env, f func()) map[string]uint64 {
	t.Helper()
	qs := e.store.QueryStats()
	require.NotNil(t, qs)
	before := qs.Snapshot()
	f()
	out := map[string]uint64{}
	for op, n := range qs.Snapshot() {
		if op == "preflight" || strings.HasPrefix(op, "pop_") {
			continue // the poller's, for the streams a case opens
		}
		if d := n - before[op]; d > 0 {
			out[op] = d
		}
	}
	return out
}

// tenantObjects are what bob, a tenant alice's rights do not cover, has
// made: a message and its live lease, a consumer group, a dead letter, a
// trace name, an SSE resume token, and a queue of his own.
type tenantObjects struct {
	partitionID, transactionID, leaseID string
	group, dlqID, traceName, resume     string
	queue, partition                    string
}

func makeBobsObjects(t *testing.T, e *env, bob, admin string) tenantObjects {
	t.Helper()
	o := tenantObjects{group: "readers-of-b", traceName: "trace-of-b", queue: "bob-private", partition: "bob"}
	for i := range 3 {
		require.Equal(t, http.StatusCreated, e.doAuth(http.MethodPost, "/api/v1/push", bob,
			fmt.Sprintf(`{"items":[{"queue":"mail","partition":"bob","payload":%d}]}`, i)).status)
	}
	r := e.doAuth(http.MethodGet, "/api/v1/pop/queue/mail/partition/bob?wait=false", bob, "")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	var popped struct{ Messages []leased }
	require.NoError(t, json.Unmarshal(r.body, &popped))
	require.Len(t, popped.Messages, 1)
	m := popped.Messages[0]
	o.partitionID, o.transactionID, o.leaseID = m.PartitionID, m.TransactionID, m.LeaseID

	r = e.doAuth(http.MethodGet, "/api/v1/pop/queue/mail/partition/bob?wait=false&consumerGroup=bob-dlq", bob, "")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	require.NoError(t, json.Unmarshal(r.body, &popped))
	d := popped.Messages[0]
	r = e.doAuth(http.MethodPost, "/api/v1/ack", bob, `{"transactionId":"`+d.TransactionID+`","partitionId":"`+
		d.PartitionID+`","leaseId":"`+d.LeaseID+`","consumerGroup":"bob-dlq","status":"dlq"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	r = e.doAuth(http.MethodGet, "/api/v1/dlq?queue=mail&partition=bob", bob, "")
	var dlq struct{ Messages []struct{ DLQID string } }
	require.NoError(t, json.Unmarshal(r.body, &dlq))
	require.Len(t, dlq.Messages, 1, "%s", r)
	o.dlqID = dlq.Messages[0].DLQID

	r = e.doAuth(http.MethodPost, "/api/v1/traces", bob, `{"transactionId":"`+o.transactionID+`","partitionId":"`+
		o.partitionID+`","data":{"step":1},"traceNames":["`+o.traceName+`"]}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r)

	c := e.openSSE(t, "/api/v1/sse/queue/mail/partition/bob?consumerGroup=bob-sse&access_token="+bob, nil)
	require.Equal(t, http.StatusOK, c.res.StatusCode)
	_, o.resume = c.next()
	c.close()
	require.NotEmpty(t, o.resume)

	require.Equal(t, http.StatusCreated, e.doAuth(http.MethodPost, "/api/v1/push", admin,
		`{"items":[{"queue":"`+o.queue+`","partition":"bob","payload":1}]}`).status)
	// A group that reads only bob's queue.
	r = e.doAuth(http.MethodGet, "/api/v1/pop/queue/"+o.queue+"?wait=false&autoAck=true&consumerGroup="+o.group, admin, "")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	return o
}

// A token's rights are the boundary between tenants. For every route that
// takes an id or a name, what alice is answered for bob's object (beyond
// her rights) must be what she is answered for one that does not exist:
// the same status, the same body but for the id she sent, and the same
// statements sent to the database (a refusal that skips a round trip, or
// answers from a cache, times apart from a miss).
func TestRights_RefusalsDoNotRevealAnotherTenantsObjects(t *testing.T) {
	// Bob's stream keeps its lease for his resume while the cases run: no
	// release by its timer among the statements counted.
	e := newEnv(t, func(c *gateway.Config) { c.Auth, c.SSEResumeGrace = &auth.Auth{Secret: authSecret}, time.Hour })
	alice, bob := mailbox(t, "alice"), mailbox(t, "bob")
	aliceAdmin := authtest.Sign(t, jwa.HS256(), authSecret, "", map[string]any{"sub": "alice", "role": "admin",
		"exp": time.Now().Add(time.Hour).Unix(), "herald": map[string]any{"consume": []string{"mail/alice"},
			"produce": []string{"mail/alice"}}})
	admin := auth.SignToken(authSecret, "ops", "admin", time.Hour)
	require.Equal(t, http.StatusCreated, e.doAuth(http.MethodPost, "/api/v1/push", alice,
		`{"items":[{"queue":"mail","partition":"alice","payload":"hers"}]}`).status)
	bobs := makeBobsObjects(t, e, bob, admin)
	// The group alice's streams below use, registered now: its registration
	// (the poller's, in the background) is not among the statements counted.
	c := e.openSSE(t, "/api/v1/sse/queue/mail/partition/alice?consumerGroup=alice-new&subscriptionMode=new&access_token="+alice, nil)
	require.Equal(t, http.StatusOK, c.res.StatusCode)
	eventually(t, func() bool {
		return e.doAuth(http.MethodGet, "/api/v1/consumer-groups/alice-new", alice, "").status == http.StatusOK
	}, "alice's group registered")
	c.close()
	none := tenantObjects{partitionID: randomUUID(t), transactionID: bobs.transactionID, leaseID: randomUUID(t),
		group: "nobody-reads", dlqID: "987654321", traceName: "no-such-trace", resume: randomResumeToken(t),
		queue: "no-such-queue", partition: "nobody"}

	// echo replaces, in an answer about o, the ids of o by those of bob's
	// objects: what is left must be the same.
	echo := func(body string, o tenantObjects) string {
		for _, p := range [][2]string{{o.partitionID, bobs.partitionID}, {o.leaseID, bobs.leaseID},
			{o.group, bobs.group}, {o.dlqID, bobs.dlqID}, {o.traceName, bobs.traceName}, {o.queue, bobs.queue},
			{"/" + o.partition, "/" + bobs.partition}} {
			body = strings.ReplaceAll(body, p[0], p[1])
		}
		return body
	}
	// withoutTxID drops a transaction's own id (new on every call).
	withoutTxID := func(body string) string {
		var m map[string]json.RawMessage
		if json.Unmarshal([]byte(body), &m) != nil {
			return body
		}
		delete(m, "transactionId")
		b, _ := json.Marshal(m)
		return string(b)
	}
	type call struct {
		token, method, path, body string
		sse                       bool // a stream: status and type compared, not the body
	}
	cases := []struct {
		name  string
		call  func(o tenantObjects) call
		clean func(string) string
	}{
		{"consumer group", func(o tenantObjects) call {
			return call{alice, http.MethodGet, "/api/v1/consumer-groups/" + o.group, "", false}
		}, nil},
		{"ack with lease", func(o tenantObjects) call {
			return call{alice, http.MethodPost, "/api/v1/ack", `{"transactionId":"` + o.transactionID + `","partitionId":"` +
				o.partitionID + `","leaseId":"` + o.leaseID + `"}`, false}
		}, nil},
		{"ack without lease", func(o tenantObjects) call {
			return call{alice, http.MethodPost, "/api/v1/ack", `{"transactionId":"` + o.transactionID + `","partitionId":"` +
				o.partitionID + `","status":"failed"}`, false}
		}, nil},
		{"ack batch", func(o tenantObjects) call {
			return call{alice, http.MethodPost, "/api/v1/ack/batch", `{"acknowledgments":[{"transactionId":"` +
				o.transactionID + `","partitionId":"` + o.partitionID + `","leaseId":"` + o.leaseID + `"}]}`, false}
		}, nil},
		{"lease extend", func(o tenantObjects) call {
			return call{alice, http.MethodPost, "/api/v1/lease/" + o.leaseID + "/extend", `{"seconds":60}`, false}
		}, nil},
		{"transaction ack", func(o tenantObjects) call {
			return call{alice, http.MethodPost, "/api/v1/transaction", `{"operations":[{"type":"ack","transactionId":"` +
				o.transactionID + `","partitionId":"` + o.partitionID + `","leaseId":"` + o.leaseID + `"}]}`, false}
		}, withoutTxID},
		{"transaction requiredLeases", func(o tenantObjects) call {
			return call{alice, http.MethodPost, "/api/v1/transaction", `{"operations":[{"type":"push","items":[` +
				`{"queue":"mail","partition":"alice","payload":1}]}],"requiredLeases":["` + o.leaseID + `"]}`, false}
		}, withoutTxID},
		{"message read", func(o tenantObjects) call {
			return call{alice, http.MethodGet, "/api/v1/messages/" + o.partitionID + "/" + o.transactionID, "", false}
		}, nil},
		{"message delete", func(o tenantObjects) call {
			return call{alice, http.MethodDelete, "/api/v1/messages/" + o.partitionID + "/" + o.transactionID, "", false}
		}, nil},
		{"message traces", func(o tenantObjects) call {
			return call{alice, http.MethodGet, "/api/v1/traces/" + o.partitionID + "/" + o.transactionID, "", false}
		}, nil},
		{"record trace", func(o tenantObjects) call {
			return call{alice, http.MethodPost, "/api/v1/traces", `{"transactionId":"` + o.transactionID +
				`","partitionId":"` + o.partitionID + `","data":{}}`, false}
		}, nil},
		{"traces by name", func(o tenantObjects) call {
			return call{alice, http.MethodGet, "/api/v1/traces/by-name/" + o.traceName, "", false}
		}, nil},
		{"dead letter", func(o tenantObjects) call {
			return call{alice, http.MethodGet, "/api/v1/dlq/" + o.dlqID, "", false}
		}, nil},
		{"dead letter replay", func(o tenantObjects) call {
			return call{aliceAdmin, http.MethodPost, "/api/v1/dlq/replay", `{"ids":["` + o.dlqID + `"]}`, false}
		}, nil},
		{"dead letters by partition name", func(o tenantObjects) call {
			return call{alice, http.MethodGet, "/api/v1/dlq?queue=mail&partition=" + o.partition, "", false}
		}, nil},
		{"resume token", func(o tenantObjects) call {
			return call{alice, http.MethodGet, "/api/v1/sse/queue/mail/partition/alice?consumerGroup=alice-new&subscriptionMode=new&lastEventId=" + o.resume, "", true}
		}, nil},
		{"pop by partition name", func(o tenantObjects) call {
			return call{alice, http.MethodGet, "/api/v1/pop/queue/mail/partition/" + o.partition + "?wait=false", "", false}
		}, nil},
		{"pop by queue name", func(o tenantObjects) call {
			return call{alice, http.MethodGet, "/api/v1/pop/queue/" + o.queue + "?wait=false", "", false}
		}, nil},
		{"stream by queue name", func(o tenantObjects) call {
			return call{alice, http.MethodGet, "/api/v1/sse/queue/" + o.queue + "/partition/bob", "", true}
		}, nil},
		{"queue resource", func(o tenantObjects) call {
			return call{alice, http.MethodGet, "/api/v1/resources/queues/" + o.queue, "", false}
		}, nil},
		{"queue partitions", func(o tenantObjects) call {
			return call{alice, http.MethodGet, "/api/v1/resources/partitions?queue=" + o.queue, "", false}
		}, nil},
		{"queue status", func(o tenantObjects) call {
			return call{alice, http.MethodGet, "/api/v1/status/queues/" + o.queue, "", false}
		}, nil},
		{"queue status messages", func(o tenantObjects) call {
			return call{alice, http.MethodGet, "/api/v1/status/queues/" + o.queue + "/messages", "", false}
		}, nil},
		{"messages by queue name", func(o tenantObjects) call {
			return call{alice, http.MethodGet, "/api/v1/messages?queue=" + o.queue, "", false}
		}, nil},
		{"messages by partition name", func(o tenantObjects) call {
			return call{alice, http.MethodGet, "/api/v1/messages?queue=mail&partition=" + o.partition, "", false}
		}, nil},
		{"dead letters by queue name", func(o tenantObjects) call {
			return call{alice, http.MethodGet, "/api/v1/dlq?queue=" + o.queue, "", false}
		}, nil},
		{"group seek", func(o tenantObjects) call {
			return call{alice, http.MethodPost, "/api/v1/consumer-groups/" + o.group + "/queues/" + o.queue + "/seek",
				`{"toEnd":true}`, false}
		}, nil},
		{"group seek partition", func(o tenantObjects) call {
			return call{alice, http.MethodPost, "/api/v1/consumer-groups/" + o.group + "/queues/mail/partitions/" +
				o.partition + "/seek", "", false}
		}, nil},
		{"group delete on a queue", func(o tenantObjects) call {
			return call{aliceAdmin, http.MethodDelete, "/api/v1/consumer-groups/" + o.group + "/queues/" + o.queue, "", false}
		}, nil},
		{"configure", func(o tenantObjects) call {
			return call{alice, http.MethodPost, "/api/v1/configure", `{"queue":"` + o.queue + `"}`, false}
		}, nil},
		{"push", func(o tenantObjects) call {
			return call{alice, http.MethodPost, "/api/v1/push", `{"items":[{"queue":"` + o.queue + `","payload":1}]}`, false}
		}, nil},
		{"follow by queue name", func(o tenantObjects) call {
			return call{alice, http.MethodGet, "/api/v1/follow/queue/" + o.queue, "", true}
		}, nil},
		{"follow by partition name", func(o tenantObjects) call {
			return call{alice, http.MethodGet, "/api/v1/follow/queue/mail/partition/" + o.partition, "", true}
		}, nil},
		{"follow long-poll by partition name", func(o tenantObjects) call {
			return call{alice, http.MethodGet, "/api/v1/follow/queue/mail/partition/" + o.partition + "?wait=false", "", false}
		}, nil},
		{"follow position in another partition", func(o tenantObjects) call {
			return call{alice, http.MethodGet, "/api/v1/follow/queue/mail/partition/alice?wait=false&after=" +
				queue.EncodeFollowID("mail", queue.FollowPos{XID: 5, PartitionID: o.partitionID, Offset: 1}), "", false}
		}, nil},
		{"follow SSE position in another partition", func(o tenantObjects) call {
			return call{alice, http.MethodGet, "/api/v1/follow/queue/mail/partition/alice?lastEventId=" +
				queue.EncodeFollowID("mail", queue.FollowPos{XID: 5, PartitionID: o.partitionID, Offset: 1}), "", true}
		}, nil},
		// Last: if it were allowed, it would take bob's dead letter away.
		{"dead letter purge", func(o tenantObjects) call {
			return call{aliceAdmin, http.MethodPost, "/api/v1/dlq/purge", `{"ids":["` + o.dlqID + `"]}`, false}
		}, nil},
	}
	send := func(c call) (status int, contentType, body string) {
		if c.sse {
			sc := e.openSSE(t, c.path+sep(c.path)+"access_token="+c.token, nil)
			defer sc.close()
			return sc.res.StatusCode, sc.res.Header.Get("Content-Type"), ""
		}
		r := e.doAuth(c.method, c.path, c.token, c.body)
		return r.status, r.header.Get("Content-Type"), string(r.body)
	}
	for _, tc := range cases {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			var aStatus, bStatus int
			var aType, bType, aBody, bBody string
			// Unknown first, then bob's, then unknown again: what a first
			// look at an id costs (a cache) is on both sides.
			_ = statements(t, e, func() { _, _, _ = send(tc.call(none)) })
			bStmts := statements(t, e, func() { bStatus, bType, bBody = send(tc.call(none)) })
			asked := tc.call(bobs)
			aStmts := statements(t, e, func() { aStatus, aType, aBody = send(asked) })
			if tc.clean != nil {
				aBody, bBody = tc.clean(aBody), tc.clean(bBody)
			}
			assert.Equal(t, bStatus, aStatus, "status: bob's %s, none %s", aBody, bBody)
			assert.Equal(t, bType, aType, "content type")
			assert.Equal(t, echo(bBody, none), aBody, "body")
			assert.Equal(t, sortedOps(bStmts), sortedOps(aStmts), "statements sent to the database")
			if !strings.Contains(asked.path+asked.body, "bob") {
				assert.NotContains(t, aBody, "bob", "the answer names nothing of bob's")
			}
		})
	}

	// WebSocket frames: alice's connection, bob's ids and none.
	ws, err := dialToken(t, e, alice)
	require.NoError(t, err)
	exchange := func(frame string) string {
		require.NoError(t, ws.WriteMessage(websocket.TextMessage, []byte(frame)))
		require.NoError(t, ws.SetReadDeadline(time.Now().Add(5*time.Second)))
		_, data, err := ws.ReadMessage()
		require.NoError(t, err)
		return string(data)
	}
	for name, frame := range map[string]func(o tenantObjects) string{
		"ws ack": func(o tenantObjects) string {
			return `{"type":"ack","id":1,"items":[{"transactionId":"` + o.transactionID + `","partitionId":"` +
				o.partitionID + `","leaseId":"` + o.leaseID + `"}]}`
		},
		"ws renew": func(o tenantObjects) string {
			return `{"type":"renew","id":2,"leaseId":"` + o.leaseID + `","seconds":60}`
		},
		"ws subscribe by partition name": func(o tenantObjects) string {
			return `{"type":"subscribe","id":3,"queue":"mail","partition":"` + o.partition + `","autoAck":true}`
		},
		"ws subscribe by queue name": func(o tenantObjects) string {
			return `{"type":"subscribe","id":4,"queue":"` + o.queue + `","autoAck":true}`
		},
		"ws follow by partition name": func(o tenantObjects) string {
			return `{"type":"follow","id":5,"queue":"mail","partition":"` + o.partition + `"}`
		},
		"ws follow by queue name": func(o tenantObjects) string {
			return `{"type":"follow","id":6,"queue":"` + o.queue + `"}`
		},
	} {
		var aFrame, bFrame string
		_ = exchange(frame(none))
		bStmts := statements(t, e, func() { bFrame = exchange(frame(none)) })
		aStmts := statements(t, e, func() { aFrame = exchange(frame(bobs)) })
		assert.Equal(t, echo(bFrame, none), aFrame, "%s: frame", name)
		assert.Equal(t, sortedOps(bStmts), sortedOps(aStmts), "%s: statements sent to the database", name)
		if !strings.Contains(frame(bobs), "bob") {
			assert.NotContains(t, aFrame, "bob", "%s: the answer names nothing of bob's", name)
		}
	}

	// Nothing of bob's was touched: his lease is live and his, his dead
	// letter still there.
	r := e.doAuth(http.MethodPost, "/api/v1/lease/"+bobs.leaseID+"/extend", bob, `{"seconds":60}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Contains(t, string(r.body), `"success":true`)
	assert.Equal(t, http.StatusOK, e.doAuth(http.MethodGet, "/api/v1/dlq/"+bobs.dlqID, bob, "").status)
	r = e.doAuth(http.MethodGet, "/api/v1/messages/"+bobs.partitionID+"/"+bobs.transactionID, bob, "")
	assert.Equal(t, http.StatusOK, r.status, "%s", r)
}

func sep(path string) string {
	if strings.Contains(path, "?") {
		return "&"
	}
	return "?"
}

// sortedOps lists statement counts by operation, in a stable order.
func sortedOps(m map[string]uint64) []string {
	out := make([]string, 0, len(m))
	for op, n := range m {
		out = append(out, fmt.Sprintf("%s×%d", op, n))
	}
	sort.Strings(out)
	return out
}

// docs/api.md: partition and lease ids are read in any case. Every other
// route that takes one answers its owner for the upper-case spelling as
// for the lower-case one (TestBrowse_MessageReadsPartitionIdInAnyCase has
// the message routes).
func TestRights_OwnIdsAreReadInAnyCase(t *testing.T) {
	e := newAuthEnv(t)
	bob := mailbox(t, "bob")
	require.Equal(t, http.StatusCreated, e.doAuth(http.MethodPost, "/api/v1/push", bob,
		`{"items":[{"queue":"mail","partition":"bob","payload":1}]}`).status)
	r := e.doAuth(http.MethodGet, "/api/v1/pop/queue/mail/partition/bob?wait=false", bob, "")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	var popped struct{ Messages []leased }
	require.NoError(t, json.Unmarshal(r.body, &popped))
	m := popped.Messages[0]
	up := leased{TransactionID: m.TransactionID, PartitionID: strings.ToUpper(m.PartitionID), LeaseID: strings.ToUpper(m.LeaseID)}

	r = e.doAuth(http.MethodPost, "/api/v1/traces", bob, `{"transactionId":"`+m.TransactionID+`","partitionId":"`+
		up.PartitionID+`","data":{"step":1}}`)
	assert.Equal(t, http.StatusCreated, r.status, "record a trace: %s", r)
	r = e.doAuth(http.MethodGet, "/api/v1/traces/"+up.PartitionID+"/"+m.TransactionID, bob, "")
	assert.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Contains(t, string(r.body), `"step":1`, "read the traces")
	r = e.doAuth(http.MethodPost, "/api/v1/lease/"+up.LeaseID+"/extend", bob, `{"seconds":60}`)
	assert.Contains(t, string(r.body), `"success":true`, "extend: %s", r)

	ws, err := dialToken(t, e, bob)
	require.NoError(t, err)
	require.NoError(t, ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"renew","id":1,"leaseId":"`+up.LeaseID+`","seconds":60}`)))
	require.NoError(t, ws.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, frame, err := ws.ReadMessage()
	require.NoError(t, err)
	assert.Contains(t, string(frame), `"success":true`, "WebSocket renew: %s", frame)

	r = e.doAuth(http.MethodPost, "/api/v1/transaction", bob, `{"operations":[{"type":"push","items":[`+
		`{"queue":"mail","partition":"bob","payload":2}]}],"requiredLeases":["`+up.LeaseID+`"]}`)
	assert.Contains(t, string(r.body), `"success":true`, "requiredLeases: %s", r)
	r = e.doAuth(http.MethodPost, "/api/v1/ack", bob, up.ack(""))
	assert.Contains(t, string(r.body), `"success":true`, "ack: %s", r)
}
