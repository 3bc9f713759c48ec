package gateway_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/gateway"
)

type wsClient struct {
	t       *testing.T
	ws      *websocket.Conn
	frames  chan map[string]json.RawMessage
	closed  chan error                   // the read error that ended the connection
	pending []map[string]json.RawMessage // frames read while waiting for another type
}

// dialWS connects; one goroutine reads every frame into a channel (a read
// deadline would break a gorilla connection for good).
func (e *env) dialWS(t *testing.T) *wsClient {
	t.Helper()
	d := websocket.Dialer{Subprotocols: []string{gateway.WSSubprotocol}, HandshakeTimeout: 5 * time.Second}
	ws, res, err := d.Dial("ws"+strings.TrimPrefix(e.url, "http")+"/api/v1/ws", nil)
	require.NoError(t, err)
	_ = res.Body.Close()
	assert.Equal(t, gateway.WSSubprotocol, ws.Subprotocol())
	c := &wsClient{t: t, ws: ws, frames: make(chan map[string]json.RawMessage, 100), closed: make(chan error, 1)}
	go func() {
		for {
			_, data, err := ws.ReadMessage()
			if err != nil {
				c.closed <- err
				return
			}
			var f map[string]json.RawMessage
			if json.Unmarshal(data, &f) == nil {
				c.frames <- f
			}
		}
	}()
	t.Cleanup(func() { _ = ws.Close() })
	return c
}

func (c *wsClient) send(frame string) {
	c.t.Helper()
	require.NoError(c.t, c.ws.WriteMessage(websocket.TextMessage, []byte(frame)))
}

// next returns the next frame of the given type, failing after 5 s. Frames
// of other types are kept, in order, for later calls: the server may send a
// delivery before the ack_result that made room for it.
func (c *wsClient) next(typ string) map[string]json.RawMessage {
	c.t.Helper()
	want := `"` + typ + `"`
	for i, f := range c.pending {
		if string(f["type"]) == want {
			c.pending = append(c.pending[:i], c.pending[i+1:]...)
			return f
		}
	}
	deadline := time.After(5 * time.Second)
	for {
		select {
		case f := <-c.frames:
			if string(f["type"]) == want {
				return f
			}
			c.pending = append(c.pending, f)
		case err := <-c.closed:
			c.t.Fatalf("connection ended waiting for a %s frame: %v", typ, err)
		case <-deadline:
			c.t.Fatalf("no %s frame within 5 s", typ)
		}
	}
}

// nothing asserts no frame arrives within d.
func (c *wsClient) nothing(d time.Duration) {
	c.t.Helper()
	require.Empty(c.t, c.pending)
	select {
	case f := <-c.frames:
		c.t.Fatalf("unexpected frame: %v", f)
	case <-time.After(d):
	}
}

// closeCode waits for the connection to end and returns its close error.
func (c *wsClient) closeErr() error {
	c.t.Helper()
	for {
		select {
		case <-c.frames:
		case err := <-c.closed:
			return err
		case <-time.After(5 * time.Second):
			c.t.Fatal("connection did not close")
			return nil
		}
	}
}

func (c *wsClient) subscribe(frame string) string {
	c.t.Helper()
	c.send(frame)
	var sub string
	require.NoError(c.t, json.Unmarshal(c.next("subscribed")["sub"], &sub))
	return sub
}

func deliveredMessages(t *testing.T, f map[string]json.RawMessage) []message {
	t.Helper()
	var ms []message
	require.NoError(t, json.Unmarshal(f["messages"], &ms))
	return ms
}

func ackFrame(ms []message, status string) string {
	items := make([]string, len(ms))
	for i, m := range ms {
		items[i] = fmt.Sprintf(`{"transactionId":%q,"partitionId":%q,"leaseId":%q,"status":%q}`, m.TransactionID, m.PartitionID, m.LeaseID, status)
	}
	return `{"type":"ack","id":"a","items":[` + strings.Join(items, ",") + `]}`
}

func TestWS_SubscribePushDeliverAck(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.dialWS(t)
	sub := c.subscribe(`{"type":"subscribe","id":1,"queue":"wsq","batch":5}`)
	e.push("wsq", `{"n":1}`, `{"n":2}`)
	f := c.next("deliver")
	assert.Equal(t, `"`+sub+`"`, string(f["sub"]))
	ms := deliveredMessages(t, f)
	require.Len(t, ms, 2)
	assert.JSONEq(t, `{"n":1}`, string(ms[0].Data))
	c.send(ackFrame(ms, "completed"))
	var results []ackResult
	require.NoError(t, json.Unmarshal(c.next("ack_result")["results"], &results))
	require.Len(t, results, 2)
	assert.True(t, results[0].Success && results[1].Success)
	assert.True(t, results[1].LeaseReleased)
	e.popEmpty("/api/v1/pop/queue/wsq?wait=false")

	// Push over the socket, and ping.
	c.send(`{"type":"push","id":"p","items":[{"queue":"wsq","payload":{"n":3}}]}`)
	c.next("push_result")
	assert.JSONEq(t, `{"n":3}`, string(deliveredMessages(t, c.next("deliver"))[0].Data))
	c.send(`{"type":"ping","id":7}`)
	assert.Equal(t, "7", string(c.next("pong")["id"]))
}

func TestWS_MaxInFlightAndNack(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.post("/api/v1/configure", `{"queue":"wsflow","options":{"retryLimit":1}}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	c := e.dialWS(t)
	c.subscribe(`{"type":"subscribe","queue":"wsflow","batch":1,"maxInFlight":2}`)
	e.pushItems(`[{"queue":"wsflow","partition":"a","payload":1},{"queue":"wsflow","partition":"b","payload":2},` +
		`{"queue":"wsflow","partition":"c","payload":3}]`)
	first := deliveredMessages(t, c.next("deliver"))
	second := deliveredMessages(t, c.next("deliver"))
	c.nothing(300 * time.Millisecond) // maxInFlight 2: the third waits for an ack
	c.send(ackFrame(first, "completed"))
	c.next("ack_result")
	third := deliveredMessages(t, c.next("deliver"))
	assert.NotEqual(t, first[0].PartitionID, third[0].PartitionID)

	// A nack redelivers; past the retry limit it is dead-lettered.
	c.send(ackFrame(second, "failed"))
	c.next("ack_result")
	again := deliveredMessages(t, c.next("deliver"))
	assert.Equal(t, second[0].ID, again[0].ID)
	assert.Equal(t, 1, again[0].RetryCount)
	c.send(ackFrame(again, "failed"))
	var res []ackResult
	require.NoError(t, json.Unmarshal(c.next("ack_result")["results"], &res))
	assert.True(t, res[0].DLQ)
}

// A connection that dies mid-batch gives its leases back at once: another
// subscriber gets the unacked messages well before the lease time (300 s).
func TestWS_KilledConnectionReleasesLeases(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c1 := e.dialWS(t)
	c1.subscribe(`{"type":"subscribe","queue":"wskill","batch":10}`)
	e.push("wskill", `{"n":1}`, `{"n":2}`)
	require.Len(t, deliveredMessages(t, c1.next("deliver")), 2)
	c2 := e.dialWS(t)
	c2.subscribe(`{"type":"subscribe","queue":"wskill","batch":10}`)
	c2.nothing(100 * time.Millisecond) // leased to c1
	killed := time.Now()
	_ = c1.ws.UnderlyingConn().Close() // no close frame: the connection just dies
	ms := deliveredMessages(t, c2.next("deliver"))
	t.Logf("redelivered %v after the kill", time.Since(killed))
	assert.Len(t, ms, 2)
	assert.Less(t, time.Since(killed), 100*time.Millisecond)
	assert.Equal(t, 0, ms[0].RetryCount, "a release is not a failed attempt")
}

// Bad frames get an error frame; the connection and its other
// subscriptions carry on.
func TestWS_BadFrames(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.dialWS(t)
	c.subscribe(`{"type":"subscribe","queue":"wsbad"}`)
	for _, frame := range []string{`{not json`, `[1,2]`, `{"type":"fly"}`, `{"type":"subscribe","id":2}`,
		`{"type":"ack","items":[{"transactionId":"x"}]}`, `{"type":"push","items":[{"queue":5}]}`,
		`{"type":"unsubscribe","sub":"nope"}`, `{"type":"subscribe","queue":"q","consumerGroup":"g","subscriptionFrom":"yesterday"}`} {
		c.send(frame)
		f := c.next("error")
		assert.NotEmpty(t, string(f["code"]), frame)
		assert.NotEmpty(t, string(f["message"]), frame)
	}
	require.NoError(t, c.ws.WriteMessage(websocket.BinaryMessage, []byte{1, 2, 3}))
	c.next("error")
	e.push("wsbad", `{"still":"here"}`)
	assert.JSONEq(t, `{"still":"here"}`, string(deliveredMessages(t, c.next("deliver"))[0].Data))

	// An oversized frame closes with 1009.
	big := `{"type":"ping","pad":"` + strings.Repeat("x", gateway.WSReadLimitDefault) + `"}`
	_ = c.ws.WriteMessage(websocket.TextMessage, []byte(big))
	err := c.closeErr()
	assert.True(t, websocket.IsCloseError(err, websocket.CloseMessageTooBig), "%v", err)
}

// Drain closes sockets with a code that says "reconnect", and releases.
func TestWS_DrainClosesWithReconnectCode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.dialWS(t)
	c.subscribe(`{"type":"subscribe","queue":"wsdrain"}`)
	e.push("wsdrain", `1`)
	c.next("deliver")
	e.srv.Drain()
	err := c.closeErr()
	assert.True(t, websocket.IsCloseError(err, gateway.CloseShuttingDown), "%v", err)
	// Its lease is released as the connection ends (the lease time is 300 s).
	eventually(t, func() bool {
		return e.get("/api/v1/pop/queue/wsdrain?wait=false").status == http.StatusOK
	}, "the drained connection's lease was not released")
}

// A WebSocket upgrade that arrives while the instance drains (on a
// connection accepted before its listener closed) is refused 503 with
// Retry-After, not accepted only to be closed.
func TestWS_UpgradeWhileDrainingIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.Drain()
	url := "ws" + strings.TrimPrefix(e.url, "http") + "/api/v1/ws"
	ws, res, err := (&websocket.Dialer{Subprotocols: []string{gateway.WSSubprotocol}, HandshakeTimeout: 5 * time.Second}).Dial(url, nil)
	if ws != nil {
		_ = ws.Close()
	}
	require.Error(t, err, "the upgrade is refused")
	require.NotNil(t, res)
	_ = res.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, res.StatusCode)
	assert.NotEmpty(t, res.Header.Get("Retry-After"))
}

func TestWS_OriginAndConnectionLimits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *gateway.Config) {
		c.AllowedOrigins = []string{"https://app.example"}
		c.MaxWSConnections = 1
	})
	url := "ws" + strings.TrimPrefix(e.url, "http") + "/api/v1/ws"
	d := websocket.Dialer{Subprotocols: []string{gateway.WSSubprotocol}, HandshakeTimeout: 5 * time.Second}
	_, res, err := d.Dial(url, http.Header{"Origin": {"https://evil.example"}})
	require.Error(t, err)
	assert.Equal(t, http.StatusForbidden, res.StatusCode)
	_ = res.Body.Close()

	ok, res, err := d.Dial(url, http.Header{"Origin": {"https://app.example"}})
	require.NoError(t, err)
	_ = res.Body.Close()
	defer func() { _ = ok.Close() }()
	eventually(t, func() bool {
		_, res, err := d.Dial(url, nil)
		if err == nil {
			return false
		}
		defer func() { _ = res.Body.Close() }()
		return res.StatusCode == http.StatusServiceUnavailable
	}, "a second connection over the limit is refused")
}

func TestWS_SubscriptionLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.dialWS(t)
	for i := range gateway.WSMaxSubscriptions {
		c.subscribe(fmt.Sprintf(`{"type":"subscribe","queue":"lim-%d"}`, i))
	}
	c.send(`{"type":"subscribe","queue":"one-more"}`)
	assert.Equal(t, `"too_many_subscriptions"`, string(c.next("error")["code"]))
	c.send(`{"type":"ping"}`)
	c.next("pong")
}

// Two consumer groups each receive every message.
func TestWS_TwoGroups(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.dialWS(t)
	c.subscribe(`{"type":"subscribe","queue":"wsgroups","consumerGroup":"a","autoAck":true}`)
	c.subscribe(`{"type":"subscribe","queue":"wsgroups","consumerGroup":"b","autoAck":true}`)
	e.push("wsgroups", `1`, `2`, `3`)
	got := map[string][]string{}
	for len(got["a"])+len(got["b"]) < 6 {
		for _, m := range deliveredMessages(t, c.next("deliver")) {
			got[m.ConsumerGroup] = append(got[m.ConsumerGroup], string(m.Data))
		}
	}
	assert.Equal(t, []string{"1", "2", "3"}, got["a"])
	assert.Equal(t, []string{"1", "2", "3"}, got["b"])
}

// A consumer that reconnects gets the unacked messages again first, then
// the rest, in push order.
func TestWS_OrderAcrossReconnect(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.push("wsorder", payloads(6, 1)...)
	c := e.dialWS(t)
	c.subscribe(`{"type":"subscribe","queue":"wsorder","batch":3}`)
	first := deliveredMessages(t, c.next("deliver"))
	require.Len(t, first, 3)
	c.send(ackFrame(first[:1], "completed")) // 1 done; 2 and 3 were in hand when the connection dropped
	c.next("ack_result")
	_ = c.ws.Close()

	c2 := e.dialWS(t)
	c2.subscribe(`{"type":"subscribe","queue":"wsorder","batch":2}`)
	var order []string
	for len(order) < 5 {
		ms := deliveredMessages(t, c2.next("deliver"))
		for _, m := range ms {
			order = append(order, string(m.Data))
		}
		c2.send(ackFrame(ms, "completed"))
		c2.next("ack_result")
	}
	assert.Equal(t, []string{"2", "3", "4", "5", "6"}, order)
}

// A client that does not read: once its write queue is long, Herald leases
// nothing more to it (messages stay in the queue for others) instead of
// dropping anything; when it reads again, delivery resumes.
func TestWS_SlowReaderHoldsCredit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	url := "ws" + strings.TrimPrefix(e.url, "http") + "/api/v1/ws"
	d := websocket.Dialer{Subprotocols: []string{gateway.WSSubprotocol}}
	ws, res, err := d.Dial(url, nil)
	require.NoError(t, err)
	_ = res.Body.Close()
	defer func() { _ = ws.Close() }()
	const n = 300
	pad := strings.Repeat("x", 64<<10) // 19 MB in all: more than the socket buffers hold
	for i := 0; i < n; i += 10 {
		items := make([]string, 10)
		for j := range items {
			items[j] = fmt.Sprintf(`{"queue":"wsslow","payload":{"n":%d,"pad":%q}}`, i+j, pad)
		}
		e.pushItems("[" + strings.Join(items, ",") + "]")
	}
	start := time.Now()
	require.NoError(t, ws.WriteMessage(websocket.TextMessage,
		[]byte(`{"type":"subscribe","queue":"wsslow","batch":1,"autoAck":true,"maxInFlight":1}`)))
	// The server stops leasing: the group's cursor stops short of the end
	// while the client does not read, and the connection is not dropped.
	cursor := func() int {
		var c int
		require.NoError(t, e.store.Pool().QueryRow(ctxT(t), `SELECT coalesce(max(cursor), 0) FROM consumers`).Scan(&c))
		return c
	}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	last := -1
	for c := cursor(); c != last; c = cursor() {
		last = c
		<-tick.C
	}
	t.Logf("held at %d of %d after %v", last, n, time.Since(start))
	assert.Positive(t, last)
	assert.Less(t, last, n, "nothing more leased while the client does not read")

	// Reading again: every message arrives, once, in order.
	next := 0
	for next < n {
		_, data, err := ws.ReadMessage()
		require.NoError(t, err, "the slow reader was not disconnected")
		var f struct {
			Messages []struct {
				Data struct {
					N int `json:"n"`
				} `json:"data"`
			} `json:"messages"`
		}
		require.NoError(t, json.Unmarshal(data, &f))
		for _, m := range f.Messages {
			require.Equal(t, next, m.Data.N)
			next++
		}
	}
}

// Drain stops leasing at once and closes connections within the window.
func TestWS_DrainWindow(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *gateway.Config) { c.DrainWindow = 400 * time.Millisecond })
	var cs []*wsClient
	for range 4 {
		c := e.dialWS(t)
		c.subscribe(`{"type":"subscribe","queue":"wswindow"}`)
		cs = append(cs, c)
	}
	start := time.Now()
	e.srv.Drain()
	e.push("wswindow", `1`)
	for _, c := range cs {
		select {
		case f := <-c.frames:
			t.Fatalf("a draining connection got %v", f) // nothing is leased while draining
		case err := <-c.closed:
			assert.True(t, websocket.IsCloseError(err, gateway.CloseShuttingDown), "%v", err)
		case <-time.After(5 * time.Second):
			t.Fatal("not closed")
		}
	}
	assert.Less(t, time.Since(start), 2*time.Second)
	e.pop("/api/v1/pop/queue/wswindow") // still there for another instance
}

// Renew over the socket extends the lease; acks take every status.
func TestWS_RenewAndAckStatuses(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.dialWS(t)
	c.subscribe(`{"type":"subscribe","queue":"wsstat","batch":1,"maxInFlight":1}`)
	e.push("wsstat", `1`, `2`)
	m := deliveredMessages(t, c.next("deliver"))[0]
	c.send(fmt.Sprintf(`{"type":"renew","id":"r","leaseId":%q,"seconds":600}`, m.LeaseID))
	var renew struct {
		Success   bool    `json:"success"`
		ExpiresAt *string `json:"expiresAt"`
	}
	require.NoError(t, json.Unmarshal(c.next("renew_result")["result"], &renew))
	assert.True(t, renew.Success)
	require.NotNil(t, renew.ExpiresAt)
	exp, err := time.Parse(time.RFC3339, *renew.ExpiresAt)
	require.NoError(t, err)
	assert.Greater(t, time.Until(exp), 500*time.Second)

	// retry: delivered again, no attempt counted.
	c.send(ackFrame([]message{m}, "retry"))
	c.next("ack_result")
	again := deliveredMessages(t, c.next("deliver"))[0]
	assert.Equal(t, m.ID, again.ID)
	assert.Equal(t, 0, again.RetryCount)
	// dlq: dead-lettered at once; the next message follows.
	c.send(ackFrame([]message{again}, "dlq"))
	var res []ackResult
	require.NoError(t, json.Unmarshal(c.next("ack_result")["results"], &res))
	assert.True(t, res[0].DLQ)
	next := deliveredMessages(t, c.next("deliver"))[0]
	assert.JSONEq(t, "2", string(next.Data))
	// success is a synonym of completed.
	c.send(ackFrame([]message{next}, "success"))
	require.NoError(t, json.Unmarshal(c.next("ack_result")["results"], &res))
	assert.True(t, res[0].Success)
	e.popEmpty("/api/v1/pop/queue/wsstat")
}
