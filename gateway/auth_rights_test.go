package gateway_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/auth/authtest"
	"github.com/heraldmq/herald/gateway"
)

// mailbox mints a token for user whose rights are their own mailbox
// partition of the queue mail (consume and produce), as a browser of that
// user would hold.
func mailbox(t *testing.T, user string) string {
	return authtest.Sign(t, jwa.HS256(), authSecret, "", map[string]any{"sub": user, "role": "read-write",
		"exp":    time.Now().Add(time.Hour).Unix(),
		"herald": map[string]any{"consume": []string{"mail/" + user}, "produce": []string{"mail/" + user}}})
}

// User A's token against user B's partition, on every transport
// that reads or writes a partition: refused (403, or a forbidden error
// frame for that subscription alone), and A's own traffic unaffected.
func TestRights_TenantIsolation(t *testing.T) {
	e := newAuthEnv(t)
	alice, bob := mailbox(t, "alice"), mailbox(t, "bob")
	push := func(tok, partition string) int {
		return e.doAuth(http.MethodPost, "/api/v1/push", tok,
			`{"items":[{"queue":"mail","partition":"`+partition+`","payload":{"to":"`+partition+`"}}]}`).status
	}
	require.Equal(t, http.StatusCreated, push(bob, "bob"), "bob writes his mailbox")
	require.Equal(t, http.StatusCreated, push(alice, "alice"))

	// Producing into another's mailbox, directly or in a transaction.
	assert.Equal(t, http.StatusForbidden, push(alice, "bob"))
	assert.Equal(t, http.StatusForbidden, e.doAuth(http.MethodPost, "/api/v1/push", alice,
		`{"items":[{"queue":"mail","partition":"alice","payload":1},{"queue":"mail","partition":"bob","payload":2}]}`).status,
		"one item refused refuses the request")
	assert.Equal(t, http.StatusForbidden, e.doAuth(http.MethodPost, "/api/v1/transaction", alice,
		`{"operations":[{"type":"push","items":[{"queue":"mail","partition":"bob","payload":1}]}]}`).status)

	// Pops: another's partition, the whole queue, by namespace.
	for _, path := range []string{"/api/v1/pop/queue/mail/partition/bob?wait=false", "/api/v1/pop/queue/mail?wait=false",
		"/api/v1/pop?namespace=mail&wait=false", "/api/v1/pop?wait=false&task=x"} {
		r := e.doAuth(http.MethodGet, path, alice, "")
		assert.Equal(t, http.StatusForbidden, r.status, "%s: %s", path, r)
	}
	// SSE: another's partition, the whole queue.
	for _, path := range []string{"/api/v1/sse/queue/mail/partition/bob?access_token=" + alice,
		"/api/v1/sse/queue/mail?access_token=" + alice} {
		c := e.openSSE(t, path, nil)
		assert.Equal(t, http.StatusForbidden, c.res.StatusCode, path)
	}

	// WebSocket: the refused subscription gets its error, the connection
	// and the allowed subscription carry on.
	ws, err := dialToken(t, e, alice)
	require.NoError(t, err)
	send := func(frame string) {
		require.NoError(t, ws.WriteMessage(websocket.TextMessage, []byte(frame)))
	}
	read := func() map[string]any {
		require.NoError(t, ws.SetReadDeadline(time.Now().Add(5*time.Second)))
		_, data, err := ws.ReadMessage()
		require.NoError(t, err)
		var m map[string]any
		require.NoError(t, json.Unmarshal(data, &m))
		return m
	}
	send(`{"type":"subscribe","id":1,"queue":"mail","partition":"bob","autoAck":true}`)
	m := read()
	assert.Equal(t, "error", m["type"])
	assert.Equal(t, "forbidden", m["code"])
	send(`{"type":"subscribe","id":2,"queue":"mail","autoAck":true}`)
	m = read()
	assert.Equal(t, "forbidden", m["code"], "the whole queue")
	send(`{"type":"push","id":3,"items":[{"queue":"mail","partition":"bob","payload":1}]}`)
	m = read()
	assert.Equal(t, "forbidden", m["code"])
	send(`{"type":"subscribe","id":4,"queue":"mail","partition":"alice","autoAck":true}`)
	m = read()
	require.Equal(t, "subscribed", m["type"], "%v", m)
	for m["type"] != "deliver" {
		m = read()
	}
	b, _ := json.Marshal(m)
	assert.Contains(t, string(b), `"to":"alice"`)
	assert.NotContains(t, string(b), `"to":"bob"`)

	// Bob's message is still his: nothing of alice's attempts touched it.
	r := e.doAuth(http.MethodGet, "/api/v1/pop/queue/mail/partition/bob?wait=false", bob, "")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Contains(t, string(r.body), `"to":"bob"`)

	// Bob's lease, learned out of band by alice: she can neither ack nor
	// extend it, over any path, and is answered as for ids that name
	// nothing (TestRights_RefusalsDoNotRevealAnotherTenantsObjects); bob
	// still can.
	var popped struct {
		Messages []struct{ TransactionID, PartitionID, LeaseID string }
	}
	require.NoError(t, json.Unmarshal(r.body, &popped))
	require.Len(t, popped.Messages, 1)
	bm := popped.Messages[0]
	ack := `{"transactionId":"` + bm.TransactionID + `","partitionId":"` + bm.PartitionID + `","leaseId":"` + bm.LeaseID + `"}`
	for name, call := range map[string][3]string{
		"ack":        {"/api/v1/ack", ack, `"error":"Message not found"`},
		"ack batch":  {"/api/v1/ack/batch", `{"acknowledgments":[` + ack + `]}`, `"error":"Message not found"`},
		"extend":     {"/api/v1/lease/" + bm.LeaseID + "/extend", `{"seconds":60}`, `"error":"Lease not found"`},
		"tx ack":     {"/api/v1/transaction", `{"operations":[{"type":"ack",` + ack[1:] + `]}`, `"error":"ACK operation failed: Message not found"`},
		"failed ack": {"/api/v1/ack", ack[:len(ack)-1] + `,"status":"failed"}`, `"error":"Message not found"`},
	} {
		r := e.doAuth(http.MethodPost, call[0], alice, call[1])
		assert.Equal(t, http.StatusOK, r.status, "%s: %s", name, r)
		assert.Contains(t, string(r.body), call[2], name)
		assert.Contains(t, string(r.body), `"success":false`, name)
	}
	send(`{"type":"ack","id":5,"items":[` + ack + `]}`)
	m = read()
	assert.Equal(t, "ack_result", m["type"], "WebSocket ack: %v", m)
	assert.Contains(t, fmt.Sprint(m["results"]), gateway.ErrTextNotHeld, "WebSocket ack: %v", m)
	send(`{"type":"renew","id":6,"leaseId":"` + bm.LeaseID + `","seconds":60}`)
	m = read()
	assert.Equal(t, "renew_result", m["type"], "WebSocket renew: %v", m)
	assert.Contains(t, fmt.Sprint(m["result"]), "Lease not found", "WebSocket renew: %v", m)
	// The dead-letter queue: another's partition, the whole queue, every queue.
	for _, path := range []string{"/api/v1/dlq?queue=mail&partition=bob", "/api/v1/dlq?queue=mail", "/api/v1/dlq"} {
		assert.Equal(t, http.StatusForbidden, e.doAuth(http.MethodGet, path, alice, "").status, path)
	}
	assert.Equal(t, http.StatusOK, e.doAuth(http.MethodGet, "/api/v1/dlq?queue=mail&partition=alice", alice, "").status)
	r = e.doAuth(http.MethodPost, "/api/v1/ack", bob, ack)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Contains(t, string(r.body), `"success":true`, "bob's lease was untouched: he acks it")

	// A token without the claim: the role alone decides, as before.
	admin := auth.SignToken(authSecret, "ops", "admin", time.Hour)
	assert.Equal(t, http.StatusCreated, push(admin, "bob"))
	// A malformed claim grants nothing: 401.
	bad := authtest.Sign(t, jwa.HS256(), authSecret, "", map[string]any{"sub": "x", "role": "admin",
		"herald": map[string]any{"consume": "everything"}})
	assert.Equal(t, http.StatusUnauthorized, push(bad, "bob"))
}

// syncBuffer is a log destination safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Tokens never reach the logs, whether sent as a header or in the
// query string (EventSource, browser WebSockets), accepted or refused, at
// the debug level where every request is logged.
func TestAuth_TokensNeverLogged(t *testing.T) {
	var logs syncBuffer
	e := newEnv(t, func(c *gateway.Config) {
		c.Auth = &auth.Auth{Secret: authSecret}
		c.Logger = zerolog.New(&logs).Level(zerolog.DebugLevel)
	})
	alice := mailbox(t, "alice")
	expired := auth.SignToken(authSecret, "x", "admin", -time.Hour)
	forged := auth.SignToken([]byte("not the server's secret, but long"), "x", "admin", time.Hour)
	for _, tok := range []string{alice, expired, forged} {
		e.doAuth(http.MethodPost, "/api/v1/push", tok, `{"items":[{"queue":"mail","partition":"alice","payload":1}]}`)
		e.doAuth(http.MethodGet, "/api/v1/pop/queue/mail/partition/alice?wait=false&access_token="+tok, "", "")
		e.doAuth(http.MethodGet, "/api/v1/pop/queue/mail/partition/bob?wait=false&access_token="+tok, "", "")
		c := e.openSSE(t, "/api/v1/sse/queue/mail/partition/bob?access_token="+tok, nil)
		_ = c.res.Body.Close()
		if ws, err := dialToken(t, e, tok); err == nil {
			_ = ws.Close()
		}
	}
	out := logs.String()
	require.Contains(t, out, "/api/v1/pop/queue/mail/partition/alice", "requests are logged at debug")
	for _, tok := range []string{alice, expired, forged} {
		sig := tok[strings.LastIndex(tok, ".")+1:]
		assert.NotContains(t, out, sig, "a token's signature in the logs")
		assert.NotContains(t, out, "access_token", "a query string in the logs")
	}
}

// An SSE resume token acks what it covers; another user's token,
// learned out of band, acks nothing, while its owner resumes with it.
func TestSSE_ResumeTokenOfAnotherSubjectAcksNothing(t *testing.T) {
	e := newAuthEnv(t)
	alice, bob := mailbox(t, "alice"), mailbox(t, "bob")
	for i := range 3 {
		require.Equal(t, http.StatusCreated, e.doAuth(http.MethodPost, "/api/v1/push", bob,
			`{"items":[{"queue":"mail","partition":"bob","payload":`+strconv.Itoa(i+1)+`}]}`).status)
	}
	c := e.openSSE(t, "/api/v1/sse/queue/mail/partition/bob?batch=3&access_token="+bob, nil)
	require.Equal(t, http.StatusOK, c.res.StatusCode)
	var token string
	_, token = c.next()
	c.close()
	require.NotEmpty(t, token)

	// On alice's stream bob's token is a token of nothing: the stream opens
	// as with an unknown token, and nothing of bob's is acked.
	stolen := e.openSSE(t, "/api/v1/sse/queue/mail/partition/alice?access_token="+alice+"&lastEventId="+token, nil)
	assert.Equal(t, http.StatusOK, stolen.res.StatusCode, "bob's resume token on alice's stream")
	stolen.close()

	// Bob resumes: message 1 was acked by his token, 2 and 3 come again.
	c2 := e.openSSE(t, "/api/v1/sse/queue/mail/partition/bob?batch=3&access_token="+bob+"&lastEventId="+token, nil)
	require.Equal(t, http.StatusOK, c2.res.StatusCode)
	m, _ := c2.next()
	assert.JSONEq(t, "2", string(m.Data))
}

// A WebSocket takes a fresh token in an auth frame before exp:
// rights are checked again (a subscription the new token no longer allows
// ends with its own error, the others carry on) and the connection lives
// past the old exp; a token of another subject, or an invalid one, changes
// nothing.
func TestWS_AuthFrameRenewsTheToken(t *testing.T) {
	e := newAuthEnv(t)
	tok := func(ttl time.Duration, consume ...string) string {
		return authtest.Sign(t, jwa.HS256(), authSecret, "", map[string]any{"sub": "alice", "role": "read-write",
			"exp": time.Now().Add(ttl).Unix(), "herald": map[string]any{"consume": consume}})
	}
	firstExp := time.Now().Add(2 * time.Second)
	ws, err := dialToken(t, e, tok(2*time.Second, "mail/alice", "news"))
	require.NoError(t, err)
	frames := make(chan map[string]any, 100)
	closed := make(chan error, 1)
	go func() {
		for {
			_, data, err := ws.ReadMessage()
			if err != nil {
				closed <- err
				return
			}
			var m map[string]any
			if json.Unmarshal(data, &m) == nil {
				frames <- m
			}
		}
	}()
	next := func(typ string) map[string]any {
		t.Helper()
		for {
			select {
			case m := <-frames:
				if m["type"] == typ {
					return m
				}
			case err := <-closed:
				t.Fatalf("closed waiting for %s: %v", typ, err)
			case <-time.After(5 * time.Second):
				t.Fatalf("no %s frame", typ)
			}
		}
	}
	send := func(frame string) { require.NoError(t, ws.WriteMessage(websocket.TextMessage, []byte(frame))) }
	send(`{"type":"subscribe","id":1,"queue":"news","autoAck":true}`)
	news := next("subscribed")["sub"]
	send(`{"type":"subscribe","id":2,"queue":"mail","partition":"alice","autoAck":true}`)
	mail := next("subscribed")["sub"]

	send(`{"type":"auth","id":3,"token":"` + tok(time.Hour, "mail/alice") + `"}`)
	m := next("error")
	assert.Equal(t, "forbidden", m["code"])
	assert.Equal(t, news, m["sub"], "the news subscription ends")
	res := next("auth_result")
	assert.NotNil(t, res["expiresAt"])

	send(`{"type":"auth","id":4,"token":"` + mailbox(t, "bob") + `"}`)
	assert.Equal(t, "forbidden", next("error")["code"], "another subject")
	send(`{"type":"auth","id":5,"token":"garbage"}`)
	assert.Equal(t, "unauthorized", next("error")["code"])

	// Past the first token's exp: still open, the mail subscription served.
	select { // the old expiry, had it stayed armed, would have closed it
	case err := <-closed:
		t.Fatalf("closed at the first token's exp: %v", err)
	case <-time.After(time.Until(firstExp.Add(500 * time.Millisecond))):
	}
	require.Equal(t, http.StatusCreated, e.doAuth(http.MethodPost, "/api/v1/push", mailbox(t, "alice"),
		`{"items":[{"queue":"mail","partition":"alice","payload":"after"}]}`).status)
	d := next("deliver")
	assert.Equal(t, mail, d["sub"])
	send(`{"type":"ping","id":6}`)
	next("pong")
}

// An EventSource cannot set headers; besides ?access_token= the
// configured cookie carries the token (and only that cookie).
func TestAuth_TokenInACookie(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.Auth = &auth.Auth{Secret: authSecret, Cookie: "herald_token"} })
	alice := mailbox(t, "alice")
	c := e.openSSE(t, "/api/v1/sse/queue/mail/partition/alice", http.Header{"Cookie": {"herald_token=" + alice}})
	assert.Equal(t, http.StatusOK, c.res.StatusCode)
	c.close()
	c = e.openSSE(t, "/api/v1/sse/queue/mail/partition/bob", http.Header{"Cookie": {"herald_token=" + alice}})
	assert.Equal(t, http.StatusForbidden, c.res.StatusCode, "the cookie's rights apply")
	_ = c.res.Body.Close()
	c = e.openSSE(t, "/api/v1/sse/queue/mail/partition/alice", http.Header{"Cookie": {"other=" + alice}})
	assert.Equal(t, http.StatusUnauthorized, c.res.StatusCode, "another cookie carries nothing")
	_ = c.res.Body.Close()
}
