package gateway_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/gateway"
)

var authSecret = []byte("0123456789abcdef0123456789abcdef")

func newAuthEnv(t *testing.T) *env {
	return newEnv(t, func(c *gateway.Config) { c.Auth = &gateway.Auth{Secret: authSecret} })
}

// doAuth sends a request with a bearer token ("" sends none).
func (e *env) doAuth(method, path, token, body string) resp {
	e.t.Helper()
	req, err := http.NewRequestWithContext(ctxT(e.t), method, e.url+path, strings.NewReader(body))
	require.NoError(e.t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := e.client.Do(req)
	require.NoError(e.t, err)
	defer func() { _ = res.Body.Close() }()
	b, err := io.ReadAll(res.Body)
	require.NoError(e.t, err)
	return resp{status: res.StatusCode, header: res.Header, body: b}
}

func TestAuth_Tokens(t *testing.T) {
	t.Parallel()
	e := newAuthEnv(t)
	reader := gateway.SignToken(authSecret, "reader", "read-only", time.Hour)
	writer := gateway.SignToken(authSecret, "svc-orders", "read-write", time.Hour)
	admin := gateway.SignToken(authSecret, "ops", "admin", 0)
	push := `{"items":[{"queue":"authq","payload":1,"producerSub":"someone-else"}]}`

	// No token, a forged one, an expired one, alg none, no role: 401.
	forged := gateway.SignToken([]byte("another secret of enough length!"), "x", "admin", time.Hour)
	expired := gateway.SignToken(authSecret, "x", "admin", -time.Minute)
	parts := strings.Split(admin, ".")
	none := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none"}`)) + "." + parts[1] + "."
	noRole := gateway.SignToken(authSecret, "x", "superuser", time.Hour)
	for name, tok := range map[string]string{"missing": "", "forged": forged, "expired": expired, "none": none,
		"no role": noRole, "garbage": "a.b.c"} {
		r := e.doAuth(http.MethodPost, "/api/v1/push", tok, push)
		assert.Equal(t, http.StatusUnauthorized, r.status, "%s: %s", name, r)
		assert.Contains(t, r.header.Get("WWW-Authenticate"), "Bearer", name)
	}
	assert.Contains(t, e.doAuth(http.MethodPost, "/api/v1/push", expired, push).String(), "expired")

	// Roles, as the reference server's: read-only reads (the DLQ) and may
	// neither produce nor consume (a pop leases, an ack writes);
	// read-write pushes, pops, acks, extends and configures; admin also
	// deletes and reads internal state.
	assert.Equal(t, http.StatusForbidden, e.doAuth(http.MethodPost, "/api/v1/push", reader, push).status)
	for _, path := range []string{"/api/v1/pop/queue/authq?wait=false", "/api/v1/pop?namespace=x&wait=false"} {
		assert.Equal(t, http.StatusForbidden, e.doAuth(http.MethodGet, path, reader, "").status, path)
	}
	for _, path := range []string{"/api/v1/ack", "/api/v1/ack/batch", "/api/v1/lease/" + "00000000-0000-0000-0000-000000000000" + "/extend",
		"/api/v1/configure"} {
		assert.Equal(t, http.StatusForbidden, e.doAuth(http.MethodPost, path, reader, `{}`).status, path)
	}
	assert.Equal(t, http.StatusOK, e.doAuth(http.MethodGet, "/api/v1/dlq?queue=authq", reader, "").status)
	assert.Equal(t, http.StatusOK, e.doAuth(http.MethodPost, "/api/v1/configure", writer,
		`{"queue":"authq","options":{}}`).status, "read-write configures")
	assert.Equal(t, http.StatusForbidden, e.doAuth(http.MethodDelete, "/api/v1/resources/queues/authq", writer, "").status)
	assert.Equal(t, http.StatusForbidden, e.doAuth(http.MethodGet, "/internal/api/shared-state/stats", writer, "").status)
	assert.Equal(t, http.StatusOK, e.doAuth(http.MethodPost, "/api/v1/configure", admin,
		`{"queue":"authq","options":{}}`).status)

	// Push stamps the token's sub as producerSub, whatever the body says.
	assert.Equal(t, http.StatusCreated, e.doAuth(http.MethodPost, "/api/v1/push", writer, push).status)
	consumer := gateway.SignToken(authSecret, "consumer", "read-write", time.Hour)
	r := e.doAuth(http.MethodGet, "/api/v1/pop/queue/authq", consumer, "")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Contains(t, string(r.body), `"producerSub":"svc-orders"`)
	assert.NotContains(t, string(r.body), "someone-else")

	// The query parameter works too (EventSource cannot set headers).
	assert.Equal(t, http.StatusNoContent, e.doAuth(http.MethodGet, "/api/v1/pop/queue/authq?access_token="+consumer, "", "").status)

	// Probes stay open.
	assert.Equal(t, http.StatusOK, e.doAuth(http.MethodGet, "/health", "", "").status)
	assert.Equal(t, http.StatusOK, e.doAuth(http.MethodGet, "/metrics", "", "").status)
}

func TestAuth_SSE(t *testing.T) {
	t.Parallel()
	e := newAuthEnv(t)
	r := e.get("/api/v1/sse/queue/authsse")
	assert.Equal(t, http.StatusUnauthorized, r.status)
	reader := gateway.SignToken(authSecret, "reader", "read-only", time.Hour)
	c := e.openSSE(t, "/api/v1/sse/queue/authsse?access_token="+reader, nil)
	require.Equal(t, http.StatusForbidden, c.res.StatusCode, "a stream leases: read-write")
	_ = c.res.Body.Close()
	consumer := gateway.SignToken(authSecret, "browser", "read-write", time.Hour)
	c = e.openSSE(t, "/api/v1/sse/queue/authsse?access_token="+consumer, nil)
	require.Equal(t, http.StatusOK, c.res.StatusCode)
	writer := gateway.SignToken(authSecret, "w", "read-write", time.Hour)
	require.Equal(t, http.StatusCreated, e.doAuth(http.MethodPost, "/api/v1/push", writer,
		`{"items":[{"queue":"authsse","payload":1}]}`).status)
	m, _ := c.next()
	require.NotNil(t, m.ProducerSub)
	assert.Equal(t, "w", *m.ProducerSub)
}

func dialToken(t *testing.T, e *env, token string) (*websocket.Conn, error) {
	t.Helper()
	d := websocket.Dialer{Subprotocols: []string{gateway.WSSubprotocol}, HandshakeTimeout: 5 * time.Second}
	url := "ws" + strings.TrimPrefix(e.url, "http") + "/api/v1/ws"
	if token != "" {
		url += "?access_token=" + token
	}
	ws, res, err := d.DialContext(context.Background(), url, nil)
	if res != nil {
		_ = res.Body.Close()
	}
	if err == nil {
		t.Cleanup(func() { _ = ws.Close() })
	}
	return ws, err
}

// readClose reads until the server closes and returns the close error.
func readClose(t *testing.T, ws *websocket.Conn) error {
	t.Helper()
	require.NoError(t, ws.SetReadDeadline(time.Now().Add(5*time.Second)))
	for {
		if _, _, err := ws.ReadMessage(); err != nil {
			return err
		}
	}
}

func TestAuth_WebSocket(t *testing.T) {
	t.Parallel()
	e := newAuthEnv(t)
	// No token: the upgrade succeeds and closes with 4501, which a browser can read.
	ws, err := dialToken(t, e, "")
	require.NoError(t, err)
	err = readClose(t, ws)
	assert.True(t, websocket.IsCloseError(err, gateway.CloseUnauthorized), "%v", err)

	// read-only may connect, but neither push nor subscribe, ack or renew
	// (they lease or settle messages); read-write may.
	ws, err = dialToken(t, e, gateway.SignToken(authSecret, "r", "read-only", time.Hour))
	require.NoError(t, err)
	require.NoError(t, ws.SetReadDeadline(time.Now().Add(5*time.Second)))
	for i, frame := range []string{`{"type":"push","id":1,"items":[{"queue":"authws","payload":1}]}`,
		`{"type":"subscribe","id":2,"queue":"authws"}`, `{"type":"ack","id":3,"items":[]}`,
		`{"type":"renew","id":4,"leaseId":"00000000-0000-0000-0000-000000000000"}`} {
		require.NoError(t, ws.WriteMessage(websocket.TextMessage, []byte(frame)))
		_, data, err := ws.ReadMessage()
		require.NoError(t, err)
		assert.Contains(t, string(data), `"code":"forbidden"`, "frame %d", i)
	}
	ws, err = dialToken(t, e, gateway.SignToken(authSecret, "rw", "read-write", time.Hour))
	require.NoError(t, err)
	require.NoError(t, ws.SetReadDeadline(time.Now().Add(5*time.Second)))
	require.NoError(t, ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"subscribe","id":2,"queue":"authws"}`)))
	_, data, err := ws.ReadMessage()
	require.NoError(t, err)
	assert.Contains(t, string(data), `"subscribed"`)

	// A token that expires ends the connection with 4501 when it does.
	ws, err = dialToken(t, e, gateway.SignToken(authSecret, "r", "read-only", 1500*time.Millisecond))
	require.NoError(t, err)
	err = readClose(t, ws)
	assert.True(t, websocket.IsCloseError(err, gateway.CloseUnauthorized), "%v", err)
}

// A fresh token in an auth frame is checked against every follow of the
// connection, as against its subscriptions: a follow the new token no
// longer allows ends with its own forbidden error (its hub forgets it, so
// nothing more is delivered to it), the others carry on.
func TestAuth_FreshTokenEndsFollowsItNoLongerAllows(t *testing.T) {
	e := newAuthEnv(t)
	tok := func(consume ...string) string {
		return sign(t, jwa.HS256(), authSecret, "", map[string]any{"sub": "alice", "role": "read-write",
			"exp": time.Now().Add(time.Hour).Unix(), "herald": map[string]any{"consume": consume}})
	}
	ws, err := dialToken(t, e, tok("mail/alice", "news"))
	require.NoError(t, err)
	require.NoError(t, ws.SetReadDeadline(time.Now().Add(10*time.Second)))
	next := func(typ string) map[string]any {
		t.Helper()
		for {
			_, data, err := ws.ReadMessage()
			require.NoError(t, err, "waiting for %s", typ)
			var m map[string]any
			require.NoError(t, json.Unmarshal(data, &m))
			if m["type"] == typ {
				return m
			}
		}
	}
	send := func(frame string) { require.NoError(t, ws.WriteMessage(websocket.TextMessage, []byte(frame))) }
	send(`{"type":"follow","id":1,"queue":"news"}`)
	news := next("followed")["follow"]
	send(`{"type":"follow","id":2,"queue":"mail","partition":"alice"}`)
	mail := next("followed")["follow"]
	require.Eventually(t, func() bool { return e.srv.Followers()["news"] == 1 && e.srv.Followers()["mail"] == 1 },
		10*time.Second, 5*time.Millisecond)

	send(`{"type":"auth","id":3,"token":"` + tok("mail/alice") + `"}`)
	m := next("error")
	assert.Equal(t, "forbidden", m["code"])
	assert.Equal(t, news, m["follow"], "the news follow ends")
	next("auth_result")
	assert.Equal(t, 0, e.srv.Followers()["news"], "its hub forgot it")

	// The mail follow goes on; news is no longer delivered.
	admin := sign(t, jwa.HS256(), authSecret, "", map[string]any{"sub": "ops", "role": "admin",
		"exp": time.Now().Add(time.Hour).Unix()})
	require.Equal(t, http.StatusCreated, e.doAuth(http.MethodPost, "/api/v1/push", admin,
		`{"items":[{"queue":"news","payload":"n"}]}`).status)
	require.Equal(t, http.StatusCreated, e.doAuth(http.MethodPost, "/api/v1/push", mailbox(t, "alice"),
		`{"items":[{"queue":"mail","partition":"alice","payload":"m"}]}`).status)
	d := next("follow_deliver")
	assert.Equal(t, mail, d["follow"])
	send(`{"type":"unfollow","id":4,"follow":"` + news.(string) + `"}`)
	assert.Equal(t, "unknown_follow", next("error")["code"], "the ended follow is gone")
}
