package gateway_test

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/gateway"
)

// The connection cap counts every transport together: at the cap a new
// connection's request is answered at once and the connection closed (SSE
// 200 with retry:, a WebSocket upgrade, a push and a long-poll 503 with
// Retry-After), /health and /metrics are still answered, the streams and
// the keep-alive connection already open carry on, a WebSocket that
// closes gives its place back, and each refusal is counted.
func TestConnections_PastTheCapAreAnsweredAndOpenOnesCarryOn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *gateway.Config) { c.MaxConnections = 3 })
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	t.Cleanup(fresh.CloseIdleConnections)
	kept := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second} // one connection, kept alive
	t.Cleanup(kept.CloseIdleConnections)
	send := func(c *http.Client, method, path, body string, header http.Header) resp {
		t.Helper()
		req, err := http.NewRequest(method, e.url+path, strings.NewReader(body))
		require.NoError(t, err)
		for k, v := range header {
			req.Header[k] = v
		}
		res, err := c.Do(req)
		require.NoError(t, err)
		defer func() { _ = res.Body.Close() }()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return resp{status: res.StatusCode, header: res.Header, body: b}
	}
	push := `{"items":[{"queue":"cap","payload":{"n":1}}]}`
	open := func() int { n, _ := e.srv.Connections(); return n }

	// Three connections: a WebSocket, an SSE stream, a keep-alive one.
	ws := e.dialWS(t)
	ws.subscribe(`{"type":"subscribe","queue":"cap","consumerGroup":"ws"}`)
	sse := e.openSSE(t, "/api/v1/sse/queue/cap?consumerGroup=sse", nil)
	require.Equal(t, http.StatusOK, sse.res.StatusCode)
	require.Equal(t, http.StatusOK, send(kept, http.MethodGet, "/health", "", nil).status)
	eventually(t, func() bool { return open() == 3 }, "three connections admitted")

	// Past the cap.
	h := send(fresh, http.MethodGet, "/health", "", nil)
	require.Equal(t, http.StatusOK, h.status, "%s", h)
	var health struct {
		Connections, MaxConnections int
		Status                      string
	}
	require.NoError(t, json.Unmarshal(h.body, &health))
	assert.Equal(t, 3, health.Connections)
	assert.Equal(t, 3, health.MaxConnections)
	assert.Equal(t, "healthy", health.Status)

	r := send(fresh, http.MethodGet, "/api/v1/sse/queue/cap?consumerGroup=late", "", http.Header{"Accept": {"text/event-stream"}})
	assert.Equal(t, http.StatusOK, r.status, "EventSource gives up on any other status")
	assert.Regexp(t, `^retry: \d+\n\n$`, string(r.body))
	d := websocket.Dialer{Subprotocols: []string{gateway.WSSubprotocol}, HandshakeTimeout: 5 * time.Second}
	wsURL := "ws" + strings.TrimPrefix(e.url, "http") + "/api/v1/ws"
	_, res, err := d.Dial(wsURL, nil)
	require.Error(t, err)
	require.NotNil(t, res)
	_ = res.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, res.StatusCode, "refused before the upgrade")
	assert.Equal(t, "5", res.Header.Get("Retry-After"))
	for _, r := range []resp{
		send(fresh, http.MethodPost, "/api/v1/push", push, http.Header{"Content-Type": {"application/json"}}),
		send(fresh, http.MethodGet, "/api/v1/pop/queue/cap?wait=true&timeout=5000", "", nil),
	} {
		assertError(t, r, http.StatusServiceUnavailable, "too many connections; retry later or elsewhere")
		assert.Equal(t, "5", r.header.Get("Retry-After"))
	}
	assert.Equal(t, 3, open(), "refused connections are closed, admitted ones untouched")

	// The open ones carry on: a push on the kept connection reaches both
	// streams.
	r = send(kept, http.MethodPost, "/api/v1/push", push, http.Header{"Content-Type": {"application/json"}})
	require.Equal(t, http.StatusCreated, r.status, "%s", r)
	ws.next("deliver")
	m, _ := sse.next()
	assert.JSONEq(t, `{"n":1}`, string(m.Data))

	_, samples := scrape(t, e)
	refused := samples["herald_connections_refused_total"]
	assert.Equal(t, 4.0, refused[`reason="limit"`], "SSE, WebSocket, push, long-poll")
	assert.Zero(t, refused[`reason="overflow"`])
	assert.Equal(t, "3", e.metric("herald_connections_max"))

	// A WebSocket that closes gives its place back.
	require.NoError(t, ws.ws.Close())
	eventually(t, func() bool { return open() == 2 }, "the closed WebSocket's place is free")
	again, res, err := d.Dial(wsURL, nil)
	require.NoError(t, err)
	_ = res.Body.Close()
	_ = again.Close()
}

// Past the cap, a connection is held only to be answered, a few at a time:
// with every refusal slot taken by a client that sends nothing, the next
// connection is closed unanswered (a network error, which an EventSource
// retries) and counted as overflow.
func TestConnections_PastTheRefusalSlotsAreClosedUnanswered(t *testing.T) {
	t.Parallel()
	var reg *prometheus.Registry
	e := newEnv(t, func(c *gateway.Config) { c.MaxConnections, reg = 1, c.Registry })
	addr := strings.TrimPrefix(e.url, "http://")
	dial := func() net.Conn {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	dial() // admitted, silent
	for range 64 {
		dial() // past the cap, silent: each holds a refusal slot
	}
	c := dial()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	n, err := c.Read(make([]byte, 1))
	assert.Zero(t, n)
	assert.ErrorIs(t, err, io.EOF, "closed unanswered, at once (not at the read deadline)")
	assert.Equal(t, 1.0, refusedCount(t, reg, "overflow"))
	assert.Zero(t, refusedCount(t, reg, "limit"), "nothing was answered: the silent ones sent no request")
}

// refusedCount reads herald_connections_refused_total{reason} from reg.
func refusedCount(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() != "herald_connections_refused_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no herald_connections_refused_total{reason=%q}", reason)
	return 0
}
