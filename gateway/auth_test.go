package gateway_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
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
)

var authSecret = authtest.Secret

func newAuthEnv(t *testing.T) *env {
	return newEnv(t, func(c *gateway.Config) { c.Auth = &auth.Auth{Secret: authSecret} })
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
	reader := auth.SignToken(authSecret, "reader", "read-only", time.Hour)
	writer := auth.SignToken(authSecret, "svc-orders", "read-write", time.Hour)
	admin := auth.SignToken(authSecret, "ops", "admin", 0)
	push := `{"items":[{"queue":"authq","payload":1,"producerSub":"someone-else"}]}`

	// No token, a forged one, an expired one, alg none, no role: 401.
	forged := auth.SignToken([]byte("another secret of enough length!"), "x", "admin", time.Hour)
	expired := auth.SignToken(authSecret, "x", "admin", -time.Minute)
	parts := strings.Split(admin, ".")
	none := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none"}`)) + "." + parts[1] + "."
	noRole := auth.SignToken(authSecret, "x", "superuser", time.Hour)
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
	consumer := auth.SignToken(authSecret, "consumer", "read-write", time.Hour)
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
	reader := auth.SignToken(authSecret, "reader", "read-only", time.Hour)
	c := e.openSSE(t, "/api/v1/sse/queue/authsse?access_token="+reader, nil)
	require.Equal(t, http.StatusForbidden, c.res.StatusCode, "a stream leases: read-write")
	_ = c.res.Body.Close()
	consumer := auth.SignToken(authSecret, "browser", "read-write", time.Hour)
	c = e.openSSE(t, "/api/v1/sse/queue/authsse?access_token="+consumer, nil)
	require.Equal(t, http.StatusOK, c.res.StatusCode)
	writer := auth.SignToken(authSecret, "w", "read-write", time.Hour)
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
	ws, err = dialToken(t, e, auth.SignToken(authSecret, "r", "read-only", time.Hour))
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
	ws, err = dialToken(t, e, auth.SignToken(authSecret, "rw", "read-write", time.Hour))
	require.NoError(t, err)
	require.NoError(t, ws.SetReadDeadline(time.Now().Add(5*time.Second)))
	require.NoError(t, ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"subscribe","id":2,"queue":"authws"}`)))
	_, data, err := ws.ReadMessage()
	require.NoError(t, err)
	assert.Contains(t, string(data), `"subscribed"`)

	// A token that expires ends the connection with 4501 when it does.
	ws, err = dialToken(t, e, auth.SignToken(authSecret, "r", "read-only", 1500*time.Millisecond))
	require.NoError(t, err)
	err = readClose(t, ws)
	assert.True(t, websocket.IsCloseError(err, gateway.CloseUnauthorized), "%v", err)
}

// The cookie rule: what a request authenticated by the cookie alone (no
// Authorization header, no access_token) may do. Each header set below is
// what a browser sends from a page that is not the server's own, holding
// nothing but the user's cookie.

const cookieName = "herald_token"

func newCookieEnv(t *testing.T, cfg ...func(*gateway.Config)) *env {
	withAuth := func(c *gateway.Config) { c.Auth = &auth.Auth{Secret: authSecret, Cookie: cookieName} }
	return newEnv(t, append([]func(*gateway.Config){withAuth}, cfg...)...)
}

// doCookie sends a request whose only credential is token in the cookie,
// with the browser's headers hdr.
func (e *env) doCookie(method, path, token, body string, hdr http.Header) resp {
	e.t.Helper()
	req, err := http.NewRequestWithContext(ctxT(e.t), method, e.url+path, strings.NewReader(body))
	require.NoError(e.t, err)
	if token != "" {
		req.Header.Set("Cookie", cookieName+"="+token)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	res, err := e.client.Do(req)
	require.NoError(e.t, err)
	defer func() { _ = res.Body.Close() }()
	b, err := io.ReadAll(res.Body)
	require.NoError(e.t, err)
	return resp{status: res.StatusCode, header: res.Header, body: b}
}

// foreignPages are the headers of requests a page of another origin makes:
// a form (text/plain POST, or GET), an <img>, a fetch or EventSource with
// credentials, over plain http (no Sec-Fetch-*: browsers send them only to
// trustworthy origins) and over https.
var foreignPages = map[string]http.Header{
	"a cross-site form over http":        {"Origin": {"http://evil.example"}, "Content-Type": {"text/plain"}},
	"a cross-site form over https":       {"Origin": {"https://evil.example"}, "Sec-Fetch-Site": {"cross-site"}, "Content-Type": {"text/plain"}},
	"another port of the same host":      {"Origin": {"http://127.0.0.1:1"}, "Sec-Fetch-Site": {"same-site"}},
	"a sandboxed frame":                  {"Origin": {"null"}, "Sec-Fetch-Site": {"cross-site"}},
	"an <img> over https":                {"Sec-Fetch-Site": {"cross-site"}, "Sec-Fetch-Mode": {"no-cors"}},
	"an <img> or a link over plain http": {},
}

// assertCookieRefused checks a 403 that names what the request lacks.
func assertCookieRefused(t *testing.T, r resp, what string) {
	t.Helper()
	assert.Equal(t, http.StatusForbidden, r.status, "%s: %s", what, r)
	assert.Contains(t, string(r.body), "cookie refused", "%s: the refusal says why", what)
}

func TestAuth_CookieAloneCannotPush(t *testing.T) {
	t.Parallel()
	e := newCookieEnv(t)
	user := auth.SignToken(authSecret, "user", "read-write", time.Hour)
	for name, hdr := range foreignPages {
		r := e.doCookie(http.MethodPost, "/api/v1/push", user, `{"items":[{"queue":"csrf-push","payload":1}]}`, hdr)
		assertCookieRefused(t, r, name)
		if hdr.Get("Origin") == "" && hdr.Get("Sec-Fetch-Site") == "" {
			assert.Contains(t, string(r.body), "X-Herald-CSRF", "%s: the refusal names the header it lacks", name)
		} else {
			assert.Contains(t, string(r.body), "another", "%s: the refusal names the other origin or site", name)
		}
	}
	r := e.doAuth(http.MethodGet, "/api/v1/pop/queue/csrf-push?wait=false", user, "")
	assert.Equal(t, http.StatusNoContent, r.status, "nothing was pushed: %s", r)
	assert.NotEqual(t, "0", e.metric(`herald_auth_failures_total{reason="cross_site"}`), "refusals are counted")
}

func TestAuth_CookieAloneCannotAck(t *testing.T) {
	t.Parallel()
	e := newCookieEnv(t)
	user := auth.SignToken(authSecret, "user", "read-write", time.Hour)
	require.Equal(t, http.StatusCreated, e.doAuth(http.MethodPost, "/api/v1/push", user, `{"items":[{"queue":"csrf-ack","payload":1}]}`).status)
	r := e.doAuth(http.MethodGet, "/api/v1/pop/queue/csrf-ack?wait=false", user, "")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	var p popResult
	require.NoError(t, json.Unmarshal(r.body, &p))
	require.Len(t, p.Messages, 1)
	m := p.Messages[0]
	one := fmt.Sprintf(`{"transactionId":%q,"partitionId":%q,"leaseId":%q,"status":"completed"}`, m.TransactionID, m.PartitionID, m.LeaseID)
	for name, hdr := range foreignPages {
		assertCookieRefused(t, e.doCookie(http.MethodPost, "/api/v1/ack", user, one, hdr), name+": ack")
		assertCookieRefused(t, e.doCookie(http.MethodPost, "/api/v1/ack/batch", user, `{"acknowledgments":[`+one+`]}`, hdr), name+": ack/batch")
	}
	// The message is still leased, unacknowledged: the user's own ack settles it now.
	r = e.doAuth(http.MethodPost, "/api/v1/ack", user, one)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Contains(t, string(r.body), `"success":true`, "the refused acks did not settle it: %s", r)
}

// pushedAs pushes one message with a bearer token.
func (e *env) pushedAs(token, q string) {
	e.t.Helper()
	r := e.doAuth(http.MethodPost, "/api/v1/push", token, fmt.Sprintf(`{"items":[{"queue":%q,"payload":1}]}`, q))
	require.Equal(e.t, http.StatusCreated, r.status, "%s", r)
}

// stillThere checks that q's message was neither leased nor consumed.
func (e *env) stillThere(token, q string) {
	e.t.Helper()
	r := e.doAuth(http.MethodGet, "/api/v1/pop/queue/"+q+"?wait=false", token, "")
	assert.Equal(e.t, http.StatusOK, r.status, "the message is still there to pop: %s", r)
}

func TestAuth_CookieAloneCannotPop(t *testing.T) {
	t.Parallel()
	e := newCookieEnv(t)
	user := auth.SignToken(authSecret, "user", "read-write", time.Hour)
	e.pushedAs(user, "csrf-pop")
	for name, hdr := range foreignPages {
		for _, path := range []string{"/api/v1/pop/queue/csrf-pop?wait=false", "/api/v1/pop/queue/csrf-pop/partition/Default?wait=false",
			"/api/v1/pop?wait=false"} {
			assertCookieRefused(t, e.doCookie(http.MethodGet, path, user, "", hdr), name+": "+path)
		}
	}
	e.stillThere(user, "csrf-pop")
}

func TestAuth_CookieAloneCannotPopWithAutoAck(t *testing.T) {
	t.Parallel()
	e := newCookieEnv(t)
	user := auth.SignToken(authSecret, "user", "read-write", time.Hour)
	e.pushedAs(user, "csrf-autoack")
	for name, hdr := range foreignPages {
		assertCookieRefused(t, e.doCookie(http.MethodGet, "/api/v1/pop/queue/csrf-autoack?wait=false&autoAck=true", user, "", hdr), name)
	}
	e.stillThere(user, "csrf-autoack")
}

func TestAuth_CookieAloneCannotRunATransaction(t *testing.T) {
	t.Parallel()
	e := newCookieEnv(t)
	user := auth.SignToken(authSecret, "user", "read-write", time.Hour)
	for name, hdr := range foreignPages {
		assertCookieRefused(t, e.doCookie(http.MethodPost, "/api/v1/transaction", user,
			`{"operations":[{"type":"push","items":[{"queue":"csrf-tx","payload":1}]}]}`, hdr), name)
	}
	r := e.doAuth(http.MethodGet, "/api/v1/pop/queue/csrf-tx?wait=false", user, "")
	assert.Equal(t, http.StatusNoContent, r.status, "nothing was pushed: %s", r)
}

// Every other route that changes something: configure, lease extension,
// deletes, DLQ replay and purge, seeks, maintenance, traces.
func TestAuth_CookieAloneCannotAdminister(t *testing.T) {
	t.Parallel()
	e := newCookieEnv(t)
	admin := auth.SignToken(authSecret, "ops", "admin", time.Hour)
	e.pushedAs(admin, "csrf-admin")
	lease := "00000000-0000-0000-0000-000000000001"
	routes := []struct{ method, path, body string }{
		{"POST", "/api/v1/configure", `{"queue":"csrf-admin","options":{"leaseTime":1}}`},
		{"POST", "/api/v1/lease/" + lease + "/extend", `{"seconds":60}`},
		{"DELETE", "/api/v1/resources/queues/csrf-admin", ""},
		{"POST", "/api/v1/dlq/replay", `{"queue":"csrf-admin"}`},
		{"POST", "/api/v1/dlq/purge", `{"queue":"csrf-admin"}`},
		{"DELETE", "/api/v1/consumer-groups/g", ""},
		{"DELETE", "/api/v1/consumer-groups/g/queues/csrf-admin", ""},
		{"POST", "/api/v1/consumer-groups/g/subscription", `{"subscriptionTimestamp":"2020-01-01T00:00:00Z"}`},
		{"POST", "/api/v1/consumer-groups/g/queues/csrf-admin/seek", `{"toEnd":true}`},
		{"POST", "/api/v1/consumer-groups/g/queues/csrf-admin/partitions/Default/seek", `{}`},
		{"POST", "/api/v1/system/maintenance", `{"enabled":true}`},
		{"POST", "/api/v1/system/maintenance/pop", `{"enabled":true}`},
		{"POST", "/api/v1/traces", `{"transactionId":"t","partitionId":"` + lease + `","data":{}}`},
		{"DELETE", "/api/v1/messages/" + lease + "/t", ""},
	}
	for name, hdr := range foreignPages {
		for _, rt := range routes {
			assertCookieRefused(t, e.doCookie(rt.method, rt.path, admin, rt.body, hdr), name+": "+rt.method+" "+rt.path)
		}
	}
	e.stillThere(admin, "csrf-admin") // not deleted, pops not switched off
	r := e.doAuth(http.MethodGet, "/api/v1/system/maintenance", admin, "")
	assert.Contains(t, string(r.body), `"maintenanceMode":false,"popMaintenanceMode":false`, "maintenance is still off: %s", r)
}

func TestAuth_CookieAloneCannotOpenAStreamFromAnotherOrigin(t *testing.T) {
	t.Parallel()
	e := newCookieEnv(t)
	user := auth.SignToken(authSecret, "user", "read-write", time.Hour)
	e.pushedAs(user, "csrf-sse")
	pages := map[string]http.Header{
		"a cross-origin EventSource with credentials": {"Origin": {"http://evil.example"}},
		"a cross-origin EventSource over https":       {"Origin": {"https://evil.example"}, "Sec-Fetch-Site": {"cross-site"}},
		"another port of the same host":               {"Origin": {"http://127.0.0.1:1"}, "Sec-Fetch-Site": {"same-site"}},
		"an <img> over https":                         {"Sec-Fetch-Site": {"cross-site"}, "Accept": {"image/*"}},
		"a link over plain http":                      {"Accept": {"text/html"}},
	}
	for name, hdr := range pages {
		// A plain request: an SSE client's reader would race this one for
		// the refusal's body. An EventSource asks for text/event-stream.
		h := hdr.Clone()
		if h.Get("Accept") == "" {
			h.Set("Accept", "text/event-stream")
		}
		assertCookieRefused(t, e.doCookie(http.MethodGet, "/api/v1/sse/queue/csrf-sse?autoAck=true", user, "", h), name)
	}
	e.stillThere(user, "csrf-sse") // not consumed by an autoAck stream
}

// A follow leases and writes nothing: the cookie alone opens it from the
// server's own pages whatever the Accept (a long-poll is a fetch, not an
// EventSource), and never from another origin or site.
func TestAuth_CookieAloneFollowsOnlyFromAnAllowedOrigin(t *testing.T) {
	t.Parallel()
	e := newCookieEnv(t)
	user := auth.SignToken(authSecret, "user", "read-write", time.Hour)
	e.pushedAs(user, "csrf-follow")
	const poll = "/api/v1/follow/queue/csrf-follow?from=beginning&wait=true&timeout=20000" // waits past an open transaction of another test (the barrier)
	for name, hdr := range map[string]http.Header{"no headers": nil, "own origin": {"Origin": {e.url}},
		"same-origin": {"Sec-Fetch-Site": {"same-origin"}}} {
		r := e.doCookie(http.MethodGet, poll, user, "", hdr)
		assert.Equal(t, http.StatusOK, r.status, "%s: a follow long-poll of the server's page: %s", name, r)
		assert.Contains(t, string(r.body), `"eventId"`, "%s: it reads the message", name)
	}
	for name, hdr := range map[string]http.Header{"a cross-origin fetch": {"Origin": {"http://evil.example"}},
		"another port of the same host": {"Origin": {"http://127.0.0.1:1"}, "Sec-Fetch-Site": {"same-site"}},
		"an <img> over https":           {"Sec-Fetch-Site": {"cross-site"}}} {
		assertCookieRefused(t, e.doCookie(http.MethodGet, poll, user, "", hdr), name)
	}
}

// The server's own pages keep the cookie: an EventSource (no Origin on a
// same-origin GET), reads, and changes that carry X-Herald-CSRF (or come
// with Sec-Fetch-Site: same-origin); the same requests without are refused.
func TestAuth_CookieServesTheServersOwnPages(t *testing.T) {
	t.Parallel()
	e := newCookieEnv(t)
	user := auth.SignToken(authSecret, "user", "read-write", time.Hour)
	own := http.Header{"Origin": {e.url}}
	for name, hdr := range map[string]http.Header{"plain http": nil, "trustworthy": {"Sec-Fetch-Site": {"same-origin"}}} {
		c := e.openSSE(t, "/api/v1/sse/queue/csrf-own", withCookie(hdr, user))
		require.Equal(t, http.StatusOK, c.res.StatusCode, "%s: an EventSource of the server's page", name)
		c.close()
	}
	for name, hdr := range map[string]http.Header{"no headers": nil, "own origin": own, "same-origin": {"Sec-Fetch-Site": {"same-origin"}},
		"typed in the address bar": {"Sec-Fetch-Site": {"none"}}} {
		r := e.doCookie(http.MethodGet, "/api/v1/resources/queues", user, "", hdr)
		assert.Equal(t, http.StatusOK, r.status, "%s: a read: %s", name, r)
	}
	for name, hdr := range foreignPages {
		if len(hdr) == 0 {
			continue // a read with no headers is the server's own page's over plain http (above)
		}
		assertCookieRefused(t, e.doCookie(http.MethodGet, "/api/v1/resources/queues", user, "", hdr), name+": a read")
	}
	// A change: refused without the header, honoured with it.
	push := `{"items":[{"queue":"csrf-own","payload":1}]}`
	assertCookieRefused(t, e.doCookie(http.MethodPost, "/api/v1/push", user, push, own), "a push without the header")
	r := e.doCookie(http.MethodPost, "/api/v1/push", user, push, http.Header{"Origin": {e.url}, "X-Herald-Csrf": {"1"}})
	assert.Equal(t, http.StatusCreated, r.status, "%s", r)
	r = e.doCookie(http.MethodPost, "/api/v1/push", user, push, http.Header{"X-Herald-Csrf": {"1"}})
	assert.Equal(t, http.StatusCreated, r.status, "no Origin (a non-browser client) with the header: %s", r)
	r = e.doCookie(http.MethodPost, "/api/v1/push", user, push, http.Header{"Origin": {e.url}, "Sec-Fetch-Site": {"same-origin"}})
	assert.Equal(t, http.StatusCreated, r.status, "Sec-Fetch-Site: same-origin: %s", r)
	r = e.doCookie(http.MethodGet, "/api/v1/pop/queue/csrf-own?wait=false&autoAck=true", user, "", http.Header{"X-Herald-Csrf": {"1"}})
	assert.Equal(t, http.StatusOK, r.status, "a pop with the header: %s", r)
	// The header does not make a foreign origin the server's.
	assertCookieRefused(t, e.doCookie(http.MethodPost, "/api/v1/push", user, push,
		http.Header{"Origin": {"https://evil.example"}, "X-Herald-Csrf": {"1"}}), "a foreign origin with the header")
}

// Only the cookie is ambient: a token in the Authorization header or in
// access_token was given to the page on purpose, and works from any origin.
func TestAuth_OnlyTheCookieDependsOnTheOrigin(t *testing.T) {
	t.Parallel()
	e := newCookieEnv(t)
	user := auth.SignToken(authSecret, "user", "read-write", time.Hour)
	push := `{"items":[{"queue":"csrf-bearer","payload":1}]}`
	foreign := http.Header{"Origin": {"https://evil.example"}, "Sec-Fetch-Site": {"cross-site"}, "Content-Type": {"application/json"}}
	assertCookieRefused(t, e.doCookie(http.MethodPost, "/api/v1/push", user, push, foreign), "the cookie")
	bearer := foreign.Clone()
	bearer.Set("Authorization", "Bearer "+user)
	r := e.doCookie(http.MethodPost, "/api/v1/push", "", push, bearer)
	assert.Equal(t, http.StatusCreated, r.status, "the header: %s", r)
	r = e.doCookie(http.MethodPost, "/api/v1/push?access_token="+user, "", push, foreign)
	assert.Equal(t, http.StatusCreated, r.status, "the query: %s", r)
	r = e.doCookie(http.MethodGet, "/api/v1/pop/queue/csrf-bearer?wait=false&autoAck=true", "", "", bearer)
	assert.Equal(t, http.StatusOK, r.status, "a pop with the header: %s", r)
	c := e.openSSE(t, "/api/v1/sse/queue/csrf-bearer?access_token="+user, foreign)
	assert.Equal(t, http.StatusOK, c.res.StatusCode, "a cross-origin EventSource with access_token")
	c.close()
}

func withCookie(hdr http.Header, token string) http.Header {
	out := hdr.Clone()
	if out == nil {
		out = http.Header{}
	}
	out.Set("Cookie", cookieName+"="+token)
	return out
}

// A fresh token in an auth frame is checked against every follow of the
// connection, as against its subscriptions: a follow the new token no
// longer allows ends with its own forbidden error (its hub forgets it, so
// nothing more is delivered to it), the others carry on.
func TestAuth_FreshTokenEndsFollowsItNoLongerAllows(t *testing.T) {
	e := newAuthEnv(t)
	tok := func(consume ...string) string {
		return authtest.Sign(t, jwa.HS256(), authSecret, "", map[string]any{"sub": "alice", "role": "read-write",
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
	admin := authtest.Sign(t, jwa.HS256(), authSecret, "", map[string]any{"sub": "ops", "role": "admin",
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
