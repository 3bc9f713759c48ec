package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/gateway"
	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/queue/queuetest"
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
	return e.dialWSWith(t, nil)
}

// dialWSWith is dialWS with the upgrade's headers (Origin, Cookie).
func (e *env) dialWSWith(t *testing.T, hdr http.Header) *wsClient {
	t.Helper()
	d := websocket.Dialer{Subprotocols: []string{gateway.WSSubprotocol}, HandshakeTimeout: 5 * time.Second}
	ws, res, err := d.Dial("ws"+strings.TrimPrefix(e.url, "http")+"/api/v1/ws", hdr)
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
	// Its lease ended, or (handed by the push) follows the partition
	// still: either way nothing is left for anyone else.
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
	assert.Less(t, time.Since(killed), 10*time.Second, "given back at the kill, not at the lease's expiry (300 s)")
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
// dropping anything; when it reads again, delivery resumes. (It reads again
// well within SlowConsumerAfter: past it, it would be a slow consumer.)
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
	// It leases first (a busy machine may take a while to start), then
	// stops: the cursor stays put across a tick.
	require.Eventually(t, func() bool { return cursor() > 0 }, 20*time.Second, 10*time.Millisecond, "it leases")
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

// slowConsumerBound is how long after a slow consumer's messages were
// leased the tests allow before they are free again: 10 s, the bound the
// close must keep. The leases go SlowConsumerAfter (5 s) after the socket
// stopped taking bytes, before the close's grace; the rest covers the
// server's filling the socket buffers (8 MB of JSON to encode, slow under
// -race on a loaded machine: up to 2.8 s seen at load 25). Without the
// watch, a WebSocket's leases went at its 10 s write deadline, about this
// bound (the code, 1006, tells it apart); an SSE stream's 10 s later still.
const slowConsumerBound = 10 * time.Second

// partitionLease is the lease a partition of q holds in the default group,
// "" when none.
func (e *env) partitionLease(q, partition string) string {
	e.t.Helper()
	var lease *string
	err := e.store.Pool().QueryRow(ctxT(e.t), `SELECT c.lease_id::text FROM consumers c
		JOIN partitions p ON p.id = c.partition_id JOIN queues q ON q.id = p.queue_id
		WHERE q.name = $1 AND p.name = $2 AND c.consumer_group = '__QUEUE_MODE__'`, q, partition).Scan(&lease)
	if err != nil || lease == nil {
		return ""
	}
	return *lease
}

// slowConsumerLease waits for the lease the slow consumer takes of q's
// partition p1, before anyone else subscribes to it (a rescuer subscribed
// first could take p1 itself, and hold it).
func (e *env) slowConsumerLease(q string) (lease string, leased time.Time) {
	e.t.Helper()
	eventually(e.t, func() bool { lease = e.partitionLease(q, "p1"); return lease != "" }, "the slow consumer leased nothing")
	return lease, time.Now()
}

// slowConsumerReleased waits until that lease is given back (or taken by
// another) and returns how long after it was seen it went.
func (e *env) slowConsumerReleased(q, lease string, leased time.Time) time.Duration {
	e.t.Helper()
	require.Eventually(e.t, func() bool { return e.partitionLease(q, "p1") != lease }, 20*time.Second, 5*time.Millisecond,
		"the slow consumer's lease was not given back")
	return time.Since(leased)
}

// pushLarge pushes n messages of about 32 KiB each to one partition: 8 MB
// for n = 250, more than a loopback socket's buffers hold (4 MiB for the
// sender at most, here; the slow clients read into 256 KiB).
func (e *env) pushLarge(q, partition string, n int) {
	e.t.Helper()
	pad := strings.Repeat("x", 32<<10)
	for i := 0; i < n; i += 50 {
		items := make([]string, 0, 50)
		for j := i; j < min(i+50, n); j++ {
			items = append(items, fmt.Sprintf(`{"queue":%q,"partition":%q,"payload":{"n":%d,"pad":%q}}`, q, partition, j, pad))
		}
		e.pushItems("[" + strings.Join(items, ",") + "]")
	}
}

// smallReadBuffer dials with a 256 KiB socket receive buffer, so that a
// client that stops reading stops the server's writes soon (the default
// grows to 32 MiB here). Not much smaller: under a few loopback segments
// (64 KiB) the window opens only at the sender's probes, seconds apart,
// and a client reading again would not catch up.
func smallReadBuffer(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err == nil {
		err = c.(*net.TCPConn).SetReadBuffer(256 << 10)
	}
	return c, err
}

// deliveredWithin reads deliver frames for up to d until n messages came.
func (c *wsClient) deliveredWithin(d time.Duration, n int) []message {
	c.t.Helper()
	var ms []message
	deadline := time.After(d)
	for len(ms) < n {
		select {
		case f := <-c.frames:
			if string(f["type"]) == `"deliver"` {
				ms = append(ms, deliveredMessages(c.t, f)...)
			}
		case err := <-c.closed:
			c.t.Fatalf("connection ended waiting for deliveries: %v", err)
		case <-deadline:
			c.t.Fatalf("%d of %d messages delivered within %v", len(ms), n, d)
		}
	}
	return ms
}

// A client that stops reading while its deliveries fill the socket is a
// slow consumer: within the documented bound its leases are given back
// (another consumer gets the messages at once, no attempt counted, without
// waiting for the lease time) and it is closed with 4001, which reaches it
// once it reads again; a healthy subscriber of the same queue is served
// meanwhile.
func TestWS_SlowConsumerIsClosedWith4001AndItsLeasesReleased(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const q, n = "wsslowconsumer", 250
	e.pushLarge(q, "p1", n)

	d := websocket.Dialer{Subprotocols: []string{gateway.WSSubprotocol}, HandshakeTimeout: 5 * time.Second,
		NetDialContext: smallReadBuffer}
	slow, res, err := d.Dial("ws"+strings.TrimPrefix(e.url, "http")+"/api/v1/ws", nil)
	require.NoError(t, err)
	_ = res.Body.Close()
	t.Cleanup(func() { _ = slow.Close() })
	require.NoError(t, slow.WriteMessage(websocket.TextMessage,
		fmt.Appendf(nil, `{"type":"subscribe","id":1,"queue":%q,"partition":"p1","batch":%d,"maxInFlight":%d}`, q, n, n)))
	_, data, err := slow.ReadMessage()
	require.NoError(t, err)
	require.Contains(t, string(data), `"subscribed"`)
	stopped := time.Now() // it reads nothing more for now
	lease, leased := e.slowConsumerLease(q)

	healthy := e.dialWS(t)
	healthy.subscribe(fmt.Sprintf(`{"type":"subscribe","id":2,"queue":%q,"partition":"p2"}`, q))
	rescuer := e.dialWS(t)
	rescuer.subscribe(fmt.Sprintf(`{"type":"subscribe","id":3,"queue":%q,"partition":"p1","batch":%d,"maxInFlight":%d}`, q, n, n))

	e.pushItems(fmt.Sprintf(`[{"queue":%q,"partition":"p2","payload":"h"}]`, q))
	hm := healthy.deliveredWithin(5*time.Second, 1)
	servedAt := time.Since(stopped)
	assert.JSONEq(t, `"h"`, string(hm[0].Data))

	released := e.slowConsumerReleased(q, lease, leased)
	releasedAt := time.Since(stopped)
	// Reading again, the slow client finds what its socket held, then 4001.
	require.NoError(t, slow.SetReadDeadline(time.Now().Add(20*time.Second)))
	read := 0
	for {
		_, data, err := slow.ReadMessage()
		if err != nil {
			t.Logf("the slow client read %d bytes before: %v", read, err)
			var ce *websocket.CloseError
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, gateway.CloseSlowConsumer, ce.Code)
			break
		}
		read += len(data)
	}

	t.Logf("healthy subscriber served after %v; slow consumer's lease given back %v after it was taken, %v after the client stopped reading",
		servedAt, released, releasedAt)
	assert.Less(t, servedAt, releasedAt, "the healthy subscriber did not wait for the slow one")
	assert.Less(t, released, slowConsumerBound, "leases released within the bound")
	// A ceiling, not a bound: 8 MB of messages, encoded under -race on a
	// busy machine, can take more than 10 s.
	ms := rescuer.deliveredWithin(60*time.Second, n)
	for i, m := range ms {
		require.Equal(t, 0, m.RetryCount, "message %d: a release counts no attempt", i)
	}
}

// upgradeStatus tries a WebSocket upgrade with hdr and returns the HTTP
// status: 101 when it was upgraded (the connection is closed at once).
func (e *env) upgradeStatus(t *testing.T, hdr http.Header) int {
	t.Helper()
	d := websocket.Dialer{Subprotocols: []string{gateway.WSSubprotocol}, HandshakeTimeout: 5 * time.Second}
	ws, res, err := d.Dial("ws"+strings.TrimPrefix(e.url, "http")+"/api/v1/ws", hdr)
	if err == nil {
		_ = ws.Close()
	}
	require.NotNil(t, res, "no answer to the upgrade: %v", err)
	_ = res.Body.Close()
	return res.StatusCode
}

// A page of another origin cannot open a WebSocket unless listed: by
// default only the server's own origin (scheme, host and port) may.
func TestWS_ForeignOriginIsRefusedByDefault(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	host := strings.TrimPrefix(e.url, "http://")
	for _, origin := range []string{"https://evil.example", "http://evil.example", "null",
		"http://127.0.0.1:1", // another port of the same host: same site, another origin
		"https://" + host,    // the same host and port, over another scheme
		"http://" + host + ".evil.example", "http://evil.example/" + host} {
		assert.Equal(t, http.StatusForbidden, e.upgradeStatus(t, http.Header{"Origin": {origin}}), "Origin %s", origin)
	}
	assert.Equal(t, http.StatusSwitchingProtocols, e.upgradeStatus(t, http.Header{"Origin": {e.url}}), "the server's own page")
	assert.Equal(t, http.StatusSwitchingProtocols, e.upgradeStatus(t, http.Header{"Origin": {strings.ToUpper(e.url)}}),
		"origins compare without regard to case")
	assert.Equal(t, http.StatusSwitchingProtocols, e.upgradeStatus(t, nil), "a client that is not a browser sends no Origin")
	// Behind a proxy that ends TLS: its X-Forwarded-Proto says the page's scheme.
	assert.Equal(t, http.StatusSwitchingProtocols, e.upgradeStatus(t, http.Header{"Origin": {"https://" + host},
		"X-Forwarded-Proto": {"https"}}), "https through a proxy")
	assert.Equal(t, http.StatusForbidden, e.upgradeStatus(t, http.Header{"Origin": {e.url},
		"X-Forwarded-Proto": {"https"}}), "an http page through an https proxy")
}

// AllowedOrigins widens the same-origin default: the listed origins and the
// server's own may connect, no other.
func TestWS_AllowedOriginsWidenTheDefault(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *gateway.Config) { c.AllowedOrigins = []string{"https://app.example", "http://localhost:3000"} })
	for _, origin := range []string{"https://app.example", "http://localhost:3000", e.url} {
		assert.Equal(t, http.StatusSwitchingProtocols, e.upgradeStatus(t, http.Header{"Origin": {origin}}), "Origin %s", origin)
	}
	for _, origin := range []string{"https://evil.example", "http://app.example", "http://localhost:3001"} {
		assert.Equal(t, http.StatusForbidden, e.upgradeStatus(t, http.Header{"Origin": {origin}}), "Origin %s", origin)
	}
}

func TestWS_AllowedOriginsMustBeOrigins(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"*", "app.example", "https://app.example/path", "ftp://app.example", "https://", "https://app.example?x=1"} {
		_, err := gateway.New(gateway.Config{Store: &queue.Store{}, Poller: &poller.Poller{}, AllowedOrigins: []string{bad}})
		require.Error(t, err, "%q", bad)
		assert.Contains(t, err.Error(), "AllowedOrigins", "%q: the error names the field", bad)
	}
}

// With the token in a cookie, a page of another origin holding only the
// cookie can neither open a WebSocket (to read or push as the user) nor
// reach the user's messages; the server's own page still can.
func TestWS_CookieAloneFromAForeignOriginIsRefused(t *testing.T) {
	t.Parallel()
	e := newCookieEnv(t)
	user := auth.SignToken(authSecret, "user", "read-write", time.Hour)
	cookie := cookieName + "=" + user
	for _, origin := range []string{"https://evil.example", "http://127.0.0.1:1"} {
		assert.Equal(t, http.StatusForbidden, e.upgradeStatus(t, http.Header{"Origin": {origin}, "Cookie": {cookie}}), "Origin %s", origin)
	}
	c := e.dialWSWith(t, http.Header{"Origin": {e.url}, "Cookie": {cookie}})
	c.send(`{"type":"push","id":1,"items":[{"queue":"csrf-ws","payload":1}]}`)
	c.next("push_result")
	c.send(`{"type":"subscribe","id":2,"queue":"csrf-ws"}`)
	c.next("deliver")
}

// An ack whose COMMIT landed but whose answer was lost ended its lease
// all the same: the rest of the partition goes to the subscriber within
// seconds (the poller is woken for the ack's partition once the database
// answers), not at the next sweep (slowed to a minute here). Over a
// WebSocket the ack's credit coming back makes the poller look as well;
// the ack here goes over HTTP, where only the wake does.
func TestWS_AckWhoseAnswerIsLostWakesItsPartition(t *testing.T) {
	t.Parallel()
	proxy, dsn := pgtest.NewProxy(t, pgtest.DSN(t))
	// Statements sent with their text each time (as behind PgBouncer), so
	// that the proxy sees the COMMIT in the ack's write batch rather than
	// in a prepare of it.
	dsn += map[bool]string{true: "&", false: "?"}[strings.Contains(dsn, "?")] + "default_query_exec_mode=exec"
	e := newEnvOn(t, queuetest.NewStoreDSN(t, dsn), func(c *poller.Config) { c.SweepMin, c.SweepMax = time.Minute, time.Minute })
	e.push("wslost", `{"i":1}`, `{"i":2}`)
	c := e.dialWS(t)
	c.subscribe(`{"type":"subscribe","queue":"wslost","batch":1,"maxInFlight":2}`)
	first := c.deliveredWithin(5*time.Second, 1)
	require.JSONEq(t, `{"i":1}`, string(first[0].Data))

	// Acked over HTTP: the stream's credit is not given back by a failed
	// ack, so nothing but the ack's own wake makes the poller look.
	cut := proxy.CutAnswer("COMMIT") // the ack's write batch: it commits, its answer is dropped
	start := time.Now()
	m := first[0]
	r := e.post("/api/v1/ack", fmt.Sprintf(`{"transactionId":%q,"partitionId":%q,"leaseId":%q,"status":"completed"}`,
		m.TransactionID, m.PartitionID, m.LeaseID))
	assert.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r)
	select {
	case <-cut:
	case <-time.After(10 * time.Second):
		t.Fatal("the ack's COMMIT never ran")
	}
	next := c.deliveredWithin(5*time.Second, 1)
	t.Logf("lost ack answer → next delivery: %v", time.Since(start))
	assert.JSONEq(t, `{"i":2}`, string(next[0].Data))
	assert.Zero(t, next[0].RetryCount)
}

// A subscription holding a partition gets the partition's next pushes
// before it acks the earlier ones: each push extends the lease it holds
// (one lease, as many deliveries), which keeps following the partition
// once all it holds is acked: nothing is left for anyone else to pop.
func TestWS_SubscriptionGetsNextPushesBeforeAckingEarlierOnes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.dialWS(t)
	c.subscribe(`{"type":"subscribe","queue":"wsext","batch":5,"maxInFlight":10}`)
	var got []message
	for i := 1; i <= 3; i++ {
		e.push("wsext", fmt.Sprintf(`{"n":%d}`, i))
		got = append(got, deliveredMessages(t, c.next("deliver"))...)
	}
	require.Len(t, got, 3)
	for i, m := range got {
		assert.JSONEq(t, fmt.Sprintf(`{"n":%d}`, i+1), string(m.Data))
		assert.Equal(t, got[0].LeaseID, m.LeaseID, "message %d under the lease the subscription holds", i+1)
	}
	c.send(ackFrame(got, "completed"))
	var results []ackResult
	require.NoError(t, json.Unmarshal(c.next("ack_result")["results"], &results))
	require.Len(t, results, 3)
	for i, r := range results {
		assert.True(t, r.Success, "item %d", i)
	}
	assert.False(t, results[2].LeaseReleased, "the lease follows the partition")
	e.popEmpty("/api/v1/pop/queue/wsext?wait=false")
}

// A subscription nacks each of its deliveries on its own (a handler that
// fails on each): the first nack gives the lease back, and with it the
// messages delivered under it since; the nack of one of those is answered
// with success, not refused, and each comes again once, in order.
func TestWS_NackOfAMessageAnEarlierNackGaveBackSucceeds(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.dialWS(t)
	c.subscribe(`{"type":"subscribe","queue":"wsnack","batch":5,"maxInFlight":10}`)
	e.push("wsnack", `{"n":1}`)
	first := deliveredMessages(t, c.next("deliver"))
	e.push("wsnack", `{"n":2}`)
	second := deliveredMessages(t, c.next("deliver"))
	require.Equal(t, first[0].LeaseID, second[0].LeaseID, "one lease extended over both")

	for _, ms := range [][]message{first, second} {
		c.send(ackFrame(ms, "failed"))
		var results []ackResult
		require.NoError(t, json.Unmarshal(c.next("ack_result")["results"], &results))
		require.Len(t, results, 1)
		assert.True(t, results[0].Success, "nack of %s: %v", ms[0].Data, results[0].Error)
	}
	var again []message
	for len(again) < 2 {
		again = append(again, deliveredMessages(t, c.next("deliver"))...)
	}
	require.Len(t, again, 2)
	assert.JSONEq(t, `{"n":1}`, string(again[0].Data))
	assert.JSONEq(t, `{"n":2}`, string(again[1].Data))
	assert.Equal(t, 1, again[0].RetryCount, "the nack that gave the lease back counted an attempt")
	c.send(ackFrame(again, "completed"))
	var results []ackResult
	require.NoError(t, json.Unmarshal(c.next("ack_result")["results"], &results))
	require.Len(t, results, 2)
	assert.True(t, results[0].Success && results[1].Success, "%v", results)
	e.popEmpty("/api/v1/pop/queue/wsnack?wait=false")
}
