package gateway_test

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
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

// leased is one message a consumer holds: what an ack names.
type leased struct {
	TransactionID string `json:"transactionId"`
	PartitionID   string `json:"partitionId"`
	LeaseID       string `json:"leaseId"`
}

// waitingFor waits (10 s at most) until the poller holds more intentions
// than before: a long-poll sent meanwhile is waiting.
func waitingFor(t *testing.T, e *env, before int) {
	t.Helper()
	require.Eventually(t, func() bool { return e.p.Intentions() > before }, 10*time.Second, 5*time.Millisecond,
		"the long-poll waits")
}

func (l leased) ack(extra string) string {
	return `{"transactionId":"` + l.TransactionID + `","partitionId":"` + l.PartitionID + `","leaseId":"` +
		l.LeaseID + `"` + extra + `}`
}

// Acks and lease extensions name leases the bearer's own
// deliveries hold. Two read-write tokens with no rights claim (the role
// alone lets both read the queue): bob's lease, learned by alice out of
// band, delivered to him over every path a delivery takes (a pop, a
// long-poll the poller answers, a WebSocket subscription), is refused to
// her on every path that acts on a lease — ack, batch ack, failed ack,
// extension, transaction ack and required lease, WebSocket renew — with
// 403 and nothing changed; bob (and an admin) still act on it.
func TestLease_OfAnotherSubjectIsRefused(t *testing.T) {
	e := newAuthEnv(t)
	alice := auth.SignToken(authSecret, "alice", "read-write", time.Hour)
	bob := auth.SignToken(authSecret, "bob", "read-write", time.Hour)
	admin := auth.SignToken(authSecret, "ops", "admin", time.Hour)
	push := func(q string) {
		t.Helper()
		r := e.doAuth(http.MethodPost, "/api/v1/push", bob, `{"items":[{"queue":"`+q+`","payload":{"q":"`+q+`"}}]}`)
		require.Equal(t, http.StatusCreated, r.status, "%s", r)
	}
	popped := func(r resp) leased {
		t.Helper()
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		var out struct{ Messages []leased }
		require.NoError(t, json.Unmarshal(r.body, &out))
		require.Len(t, out.Messages, 1)
		require.NotEmpty(t, out.Messages[0].LeaseID)
		return out.Messages[0]
	}

	deliveries := map[string]func() leased{
		"pop": func() leased {
			push("by-pop")
			return popped(e.doAuth(http.MethodGet, "/api/v1/pop/queue/by-pop?wait=false", bob, ""))
		},
		"long-poll": func() leased {
			got := make(chan resp, 1)
			before := e.p.Intentions()
			go func() { got <- e.doAuth(http.MethodGet, "/api/v1/pop/queue/by-poll?wait=true&timeout=10000", bob, "") }()
			waitingFor(t, e, before) // the poller answers it
			push("by-poll")
			return popped(<-got)
		},
		"websocket": func() leased {
			ws, err := dialToken(t, e, bob)
			require.NoError(t, err)
			t.Cleanup(func() { _ = ws.Close() })
			require.NoError(t, ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"subscribe","id":1,"queue":"by-ws"}`)))
			push("by-ws")
			for {
				require.NoError(t, ws.SetReadDeadline(time.Now().Add(10*time.Second)))
				_, data, err := ws.ReadMessage()
				require.NoError(t, err)
				var f struct {
					Type     string
					Messages []leased
				}
				require.NoError(t, json.Unmarshal(data, &f))
				if f.Type == "deliver" {
					require.Len(t, f.Messages, 1)
					return f.Messages[0]
				}
			}
		},
	}

	aliceWS, err := dialToken(t, e, alice)
	require.NoError(t, err)
	defer func() { _ = aliceWS.Close() }()
	for path, deliver := range deliveries {
		m := deliver()
		refused := map[string][2]string{
			"ack":        {"/api/v1/ack", m.ack("")},
			"failed ack": {"/api/v1/ack", m.ack(`,"status":"failed"`)},
			"dlq ack":    {"/api/v1/ack", m.ack(`,"status":"dlq"`)},
			"ack batch":  {"/api/v1/ack/batch", `{"acknowledgments":[` + m.ack("") + `]}`},
			"extend":     {"/api/v1/lease/" + m.LeaseID + "/extend", `{"seconds":60}`},
			"tx ack":     {"/api/v1/transaction", `{"operations":[{"type":"ack",` + m.ack("")[1:] + `]}`},
			"tx required lease": {"/api/v1/transaction", `{"operations":[{"type":"ack","transactionId":"` +
				m.TransactionID + `","partitionId":"` + m.PartitionID + `"}],"requiredLeases":["` + m.LeaseID + `"]}`},
		}
		for name, call := range refused {
			r := e.doAuth(http.MethodPost, call[0], alice, call[1])
			assert.Equal(t, http.StatusForbidden, r.status, "%s, delivered by %s: %s", name, path, r)
		}
		require.NoError(t, aliceWS.WriteMessage(websocket.TextMessage,
			[]byte(`{"type":"renew","id":7,"leaseId":"`+m.LeaseID+`","seconds":60}`)))
		require.NoError(t, aliceWS.SetReadDeadline(time.Now().Add(5*time.Second)))
		_, data, err := aliceWS.ReadMessage()
		require.NoError(t, err)
		assert.Contains(t, string(data), `"forbidden"`, "WebSocket renew of a lease delivered by %s", path)

		// Nothing alice tried changed the lease: bob extends and acks it.
		r := e.doAuth(http.MethodPost, "/api/v1/lease/"+m.LeaseID+"/extend", bob, `{"seconds":60}`)
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		assert.Contains(t, string(r.body), `"success":true`)
		acker := bob
		if path == "pop" {
			acker = admin // an admin acts on any lease
		}
		r = e.doAuth(http.MethodPost, "/api/v1/ack", acker, m.ack(""))
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		assert.Contains(t, string(r.body), `"success":true`, "delivered by %s", path)
		assert.NotContains(t, string(r.body), `"dlq":true`, "alice's dlq ack did nothing")
	}

	// A late ack, naming no lease, after bob's lease expired: still his.
	push("late")
	m := popped(e.doAuth(http.MethodGet, "/api/v1/pop/queue/late?wait=false", bob, ""))
	_, err = e.store.Pool().Exec(ctxT(t), `UPDATE consumers SET lease_expires_at = now() - interval '1 second' WHERE lease_id = $1`, m.LeaseID)
	require.NoError(t, err)
	noLease := `{"transactionId":"` + m.TransactionID + `","partitionId":"` + m.PartitionID + `"}`
	r := e.doAuth(http.MethodPost, "/api/v1/ack", alice, noLease)
	assert.Equal(t, http.StatusForbidden, r.status, "%s", r)
	assert.Contains(t, string(r.body), queue.ErrTextForeign)
	r = e.doAuth(http.MethodPost, "/api/v1/ack", bob, noLease)
	assert.Equal(t, http.StatusOK, r.status)
	assert.Contains(t, string(r.body), `"success":true`, "%s", r)

	// A batch mixing alice's own delivery and bob's: hers is applied, his
	// refused item by item (200, as other per-item refusals).
	push("mixed")
	push("mixed")
	hers := popped(e.doAuth(http.MethodGet, "/api/v1/pop/queue/mixed?wait=false", alice, ""))
	_, err = e.store.Pool().Exec(ctxT(t), `UPDATE consumers SET lease_expires_at = now() - interval '1 second' WHERE lease_id = $1`, hers.LeaseID)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, e.doAuth(http.MethodPost, "/api/v1/ack", alice,
		`{"transactionId":"`+hers.TransactionID+`","partitionId":"`+hers.PartitionID+`"}`).status)
	his := popped(e.doAuth(http.MethodGet, "/api/v1/pop/queue/mixed?wait=false", bob, ""))
	r = e.doAuth(http.MethodPost, "/api/v1/ack/batch", alice, `{"acknowledgments":[`+his.ack("")+`]}`)
	assert.Equal(t, http.StatusForbidden, r.status)
	var results []struct {
		Success bool
		Error   *string
	}
	require.NoError(t, json.Unmarshal(r.body, &results))
	require.Len(t, results, 1)
	assert.False(t, results[0].Success)
}

// An SSE resume token is bound to the subject that earned it,
// with role-only tokens too (no rights claim narrows the partitions): bob's
// token on alice's stream of the same queue is refused, terminally (403),
// and acks nothing; bob resumes with it.
func TestSSE_ResumeTokenIsBoundToItsSubject(t *testing.T) {
	e := newAuthEnv(t)
	alice := auth.SignToken(authSecret, "alice", "read-write", time.Hour)
	bob := auth.SignToken(authSecret, "bob", "read-write", time.Hour)
	for _, p := range []string{"1", "2"} {
		require.Equal(t, http.StatusCreated, e.doAuth(http.MethodPost, "/api/v1/push", bob,
			`{"items":[{"queue":"feed","payload":`+p+`}]}`).status)
	}
	c := e.openSSE(t, "/api/v1/sse/queue/feed?batch=2&access_token="+url.QueryEscape(bob), nil)
	require.Equal(t, http.StatusOK, c.res.StatusCode)
	_, token := c.next()
	c.close()
	require.NotEmpty(t, token)

	stolen := e.openSSE(t, "/api/v1/sse/queue/feed?access_token="+alice+"&lastEventId="+token, nil)
	assert.Equal(t, http.StatusForbidden, stolen.res.StatusCode)
	_ = stolen.res.Body.Close()

	c2 := e.openSSE(t, "/api/v1/sse/queue/feed?batch=2&access_token="+bob+"&lastEventId="+token, nil)
	require.Equal(t, http.StatusOK, c2.res.StatusCode)
	m, _ := c2.next()
	assert.JSONEq(t, "2", string(m.Data), "message 1 was acked by bob's resume, not alice's")
	c2.close()
}

// A pop by namespace (HTTP, long-poll) serves only the
// queues of the namespace the token may consume whole; a token that may
// consume no whole queue is refused. Pattern characters are literal: the
// "." of "acme.a" does not match the "-" of "acme-a".
func TestPop_NamespaceServesPermittedQueuesOnly(t *testing.T) {
	e := newAuthEnv(t)
	admin := auth.SignToken(authSecret, "ops", "admin", time.Hour)
	require.Equal(t, http.StatusOK, e.doAuth(http.MethodPost, "/api/v1/configure", admin,
		`{"queue":"acme-a","namespace":"acme"}`).status)
	push := func(q, part string) {
		t.Helper()
		r := e.doAuth(http.MethodPost, "/api/v1/push", admin,
			`{"items":[{"queue":"`+q+`","partition":"`+part+`","payload":{"q":"`+q+`"}}]}`)
		require.Equal(t, http.StatusCreated, r.status, "%s", r)
	}
	for _, q := range []string{"acme.a", "acme.b", "acme.c", "acme-a"} {
		push(q, "p1")
		push(q, "p2")
	}
	alice := authtest.Sign(t, jwa.HS256(), authSecret, "", map[string]any{"sub": "alice", "role": "read-write",
		"exp": time.Now().Add(time.Hour).Unix(), "herald": map[string]any{
			"consume": []string{"acme.a", "acme.b/*", "acme.c/p1"}, "namespaces": []string{"acme"}}})
	queuesOf := func(body []byte) []string {
		var out struct{ Messages []struct{ Queue string } }
		require.NoError(t, json.Unmarshal(body, &out))
		var qs []string
		for _, m := range out.Messages {
			qs = append(qs, m.Queue)
		}
		return qs
	}
	served := map[string]int{}
	for {
		r := e.doAuth(http.MethodGet, "/api/v1/pop?namespace=acme&batch=10&partitions=10&autoAck=true&wait=false", alice, "")
		if r.status == http.StatusNoContent {
			break
		}
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		for _, q := range queuesOf(r.body) {
			served[q]++
		}
	}
	assert.Equal(t, map[string]int{"acme.a": 2, "acme.b": 2}, served)

	// Long-poll: waiting when a forbidden queue and a permitted one get a
	// message, it answers with the permitted one's.
	got := make(chan resp, 1)
	before := e.p.Intentions()
	go func() {
		got <- e.doAuth(http.MethodGet, "/api/v1/pop?namespace=acme&batch=10&autoAck=true&wait=true&timeout=10000", alice, "")
	}()
	waitingFor(t, e, before)
	push("acme.c", "p1")
	push("acme-a", "p1")
	push("acme.b", "p3")
	r := <-got
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Equal(t, []string{"acme.b"}, queuesOf(r.body))

	// Only partitions, no whole queue: nothing to serve by namespace.
	narrow := authtest.Sign(t, jwa.HS256(), authSecret, "", map[string]any{"sub": "bob", "role": "read-write",
		"herald": map[string]any{"consume": []string{"acme.c/p1"}, "namespaces": []string{"acme"}}})
	r = e.doAuth(http.MethodGet, "/api/v1/pop?namespace=acme&wait=false", narrow, "")
	assert.Equal(t, http.StatusForbidden, r.status, "%s", r)

	// Every ASCII punctuation character in a pattern is literal: no
	// malformed expression (500), nothing served.
	odd := authtest.Sign(t, jwa.HS256(), authSecret, "", map[string]any{"sub": "eve", "role": "read-write",
		"herald": map[string]any{"consume": []string{"acme" + `!"#$%&'()+,-.:;<=>?@[\]^_{|}~` + "`", "(", "\\", "[*"},
			"namespaces": []string{"acme"}}})
	r = e.doAuth(http.MethodGet, "/api/v1/pop?namespace=acme&wait=false", odd, "")
	assert.Equal(t, http.StatusNoContent, r.status, "%s", r)
}

// A partition id in upper case names the same
// partition (the store reads it in any case), so the rights check must
// read it so too: another tenant's message is refused whatever the
// spelling. And a token below admin without sub may not act on leases
// delivered to a subject.
func TestRights_HoldForAnySpellingAndWithoutSub(t *testing.T) {
	e := newAuthEnv(t)
	alice, bob := mailbox(t, "alice"), mailbox(t, "bob")
	require.Equal(t, http.StatusCreated, e.doAuth(http.MethodPost, "/api/v1/push", bob,
		`{"items":[{"queue":"mail","partition":"bob","payload":1}]}`).status)
	r := e.doAuth(http.MethodGet, "/api/v1/pop/queue/mail/partition/bob?wait=false", bob, "")
	require.Equal(t, http.StatusOK, r.status)
	var popped struct{ Messages []leased }
	require.NoError(t, json.Unmarshal(r.body, &popped))
	m := popped.Messages[0]
	upper := m
	upper.PartitionID = strings.ToUpper(m.PartitionID)
	// Refused as ids of nothing are (TestRights_RefusalsDoNotRevealAnotherTenantsObjects).
	for name, call := range map[string][4]string{
		"ack":         {http.MethodPost, "/api/v1/ack", upper.ack(""), `"error":"Message not found"`},
		"trace read":  {http.MethodGet, "/api/v1/traces/" + upper.PartitionID + "/" + m.TransactionID, "", `{"traces":[]}`},
		"trace write": {http.MethodPost, "/api/v1/traces", `{"transactionId":"` + m.TransactionID + `","partitionId":"` + upper.PartitionID + `","data":{}}`, `{"error":"Message not found"}`},
		"message":     {http.MethodGet, "/api/v1/messages/" + upper.PartitionID + "/" + m.TransactionID, "", `{"error":"Message not found"}`},
	} {
		r := e.doAuth(call[0], call[1], alice, call[2])
		assert.Contains(t, string(r.body), call[3], "%s: %s", name, r)
		assert.NotContains(t, string(r.body), "bob", "%s: %s", name, r)
	}

	anonymous := auth.SignToken(authSecret, "", "read-write", time.Hour)
	r = e.doAuth(http.MethodPost, "/api/v1/lease/"+m.LeaseID+"/extend", anonymous, `{"seconds":60}`)
	assert.Equal(t, http.StatusForbidden, r.status, "a token without sub: %s", r)
	r = e.doAuth(http.MethodPost, "/api/v1/ack", anonymous, m.ack(""))
	assert.Equal(t, http.StatusForbidden, r.status, "%s", r)
	assert.True(t, strings.Contains(string(e.doAuth(http.MethodPost, "/api/v1/ack", bob, m.ack("")).body), `"success":true`))
}

// A stream resumed with another subject's chain (its origin, learned out
// of band, in a token naming no lease) joins no chain of that subject's:
// what the subject's closed stream keeps for its page's resume waits for
// it, and the subject's own resume with the same token takes it at once.
func TestSSE_ResumeChainOfAnotherSubjectReleasesNothing(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) {
		c.Auth = &auth.Auth{Secret: authSecret}
		c.SSEResumeGrace = time.Hour
	})
	alice := auth.SignToken(authSecret, "alice", "read-write", time.Hour)
	bob := auth.SignToken(authSecret, "bob", "read-write", time.Hour)
	for _, p := range []string{"1", "2"} {
		require.Equal(t, http.StatusCreated, e.doAuth(http.MethodPost, "/api/v1/push", bob,
			`{"items":[{"queue":"chain","payload":`+p+`}]}`).status)
	}
	c := e.openSSE(t, "/api/v1/sse/queue/chain?batch=2&access_token="+bob, nil)
	require.Equal(t, http.StatusOK, c.res.StatusCode)
	_, _ = c.next()
	_, token := c.next()
	c.close() // both kept for bob's page's resume
	raw, err := base64.RawURLEncoding.DecodeString(token)
	require.NoError(t, err)
	require.Greater(t, len(raw), 17)
	originOnly := base64.RawURLEncoding.EncodeToString(raw[:17]) // version and origin: no lease named

	stolen := e.openSSE(t, "/api/v1/sse/queue/chain?batch=2&access_token="+alice+"&lastEventId="+originOnly, nil)
	require.Equal(t, http.StatusOK, stolen.res.StatusCode)
	stolen.nothing(time.Second)
	stolen.close()

	own := e.openSSE(t, "/api/v1/sse/queue/chain?batch=2&access_token="+bob+"&lastEventId="+originOnly, nil)
	require.Equal(t, http.StatusOK, own.res.StatusCode)
	m, _ := own.next()
	assert.JSONEq(t, "1", string(m.Data), "bob's page is back: what his closed stream kept comes at once")
	own.close()
}
