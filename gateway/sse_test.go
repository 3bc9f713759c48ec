package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/gateway"
	"github.com/heraldmq/herald/internal/server"
	"github.com/heraldmq/herald/internal/server/servertest"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/queue/queuetest"
)

// sseEvent is one event (or comment, or bare retry:) read from a stream.
type sseEvent struct {
	event, id, data, comment string
	retry                    int
}

// lastEvent reads a raw SSE stream until it ends and returns its last
// whole event (event, data and retry: lines), the bytes read and the
// error that ended it.
func lastEvent(br *bufio.Reader) (last sseEvent, read int, err error) {
	var ev sseEvent
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return last, read, err
		}
		read += len(line)
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			last, ev = ev, sseEvent{}
		case strings.HasPrefix(line, "event: "):
			ev.event = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			ev.data = line[len("data: "):]
		case strings.HasPrefix(line, "retry: "):
			ev.retry, _ = strconv.Atoi(line[len("retry: "):])
		}
	}
}

type sseClient struct {
	t       *testing.T
	res     *http.Response
	events  chan sseEvent
	ended   chan struct{}
	cancel  context.CancelFunc
	pending []sseEvent
}

// openSSE reads a stream with a plain HTTP client, the way EventSource
// does: text/event-stream parsed line by line.
func (e *env) openSSE(t *testing.T, path string, header http.Header) *sseClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.url+path, nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "text/event-stream")
	for k, v := range header {
		req.Header[k] = v
	}
	res, err := e.client.Do(req) //nolint:bodyclose // closed by sseClient.close
	if err != nil {
		cancel()
		require.NoError(t, err)
	}
	c := &sseClient{t: t, res: res, events: make(chan sseEvent, 1000), ended: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(c.ended)
		sc := bufio.NewScanner(res.Body)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev != (sseEvent{}) {
					c.events <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, ":"):
				ev.comment = strings.TrimSpace(line[1:])
			case strings.HasPrefix(line, "event: "):
				ev.event = line[len("event: "):]
			case strings.HasPrefix(line, "id: "):
				ev.id = line[len("id: "):]
			case strings.HasPrefix(line, "data: "):
				ev.data += line[len("data: "):]
			case strings.HasPrefix(line, "retry: "):
				ev.retry, _ = strconv.Atoi(line[len("retry: "):])
			}
		}
	}()
	t.Cleanup(c.close)
	return c
}

func (c *sseClient) close() {
	c.cancel()
	_ = c.res.Body.Close()
	<-c.ended
}

// next returns the next event with event: message, keeping comments aside.
func (c *sseClient) next() (message, string) {
	c.t.Helper()
	return c.nextWithin(5 * time.Second)
}

// nextWithin is next with a ceiling of d.
func (c *sseClient) nextWithin(d time.Duration) (message, string) {
	c.t.Helper()
	for i, ev := range c.pending {
		if ev.event == "message" {
			c.pending = append(c.pending[:i], c.pending[i+1:]...)
			return c.decode(ev), ev.id
		}
	}
	deadline := time.After(d)
	for {
		select {
		case ev := <-c.events:
			if ev.event == "message" {
				return c.decode(ev), ev.id
			}
			c.pending = append(c.pending, ev)
		case <-c.ended:
			c.t.Fatal("stream ended waiting for a message")
		case <-deadline:
			c.t.Fatalf("no message event within %v", d)
		}
	}
}

func (c *sseClient) decode(ev sseEvent) message {
	c.t.Helper()
	var m message
	require.NoError(c.t, json.Unmarshal([]byte(ev.data), &m), ev.data)
	require.NotEmpty(c.t, ev.id, "every message event carries a resume token")
	return m
}

// nothing asserts that no message event arrives within d.
func (c *sseClient) nothing(d time.Duration) {
	c.t.Helper()
	for _, ev := range c.pending {
		require.NotEqual(c.t, "message", ev.event, "unexpected event %+v", ev)
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case ev := <-c.events:
			require.NotEqual(c.t, "message", ev.event, "unexpected event %+v", ev)
		case <-timer.C:
			return
		}
	}
}

// waitEnd reads until the server ends the stream and returns the events
// that were not messages.
func (c *sseClient) waitEnd() []sseEvent {
	c.t.Helper()
	out := c.pending
	deadline := time.After(5 * time.Second)
	for {
		select {
		case ev := <-c.events:
			out = append(out, ev)
		case <-c.ended:
			for {
				select {
				case ev := <-c.events:
					out = append(out, ev)
				default:
					return out
				}
			}
		case <-deadline:
			c.t.Fatal("stream did not end")
		}
	}
}

func payloads(n, from int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = strconv.Itoa(from + i)
	}
	return out
}

func TestSSE_StreamShape(t *testing.T) {
	e := newEnv(t)
	c := e.openSSE(t, "/api/v1/sse/queue/sse-shape", nil)
	require.Equal(t, http.StatusOK, c.res.StatusCode)
	assert.Equal(t, "text/event-stream", c.res.Header.Get("Content-Type"))
	assert.Equal(t, "no-cache", c.res.Header.Get("Cache-Control"))
	assert.Equal(t, "no", c.res.Header.Get("X-Accel-Buffering"))
	assert.Equal(t, "*", c.res.Header.Get("Access-Control-Allow-Origin"))

	e.push("sse-shape", `{"n":1}`, `"two"`, `3`)
	var ids []string
	for i, want := range []string{`{"n":1}`, `"two"`, `3`} {
		m, id := c.next()
		assert.JSONEq(t, want, string(m.Data), "message %d", i)
		assert.Equal(t, "sse-shape", m.Queue)
		assert.Equal(t, "__QUEUE_MODE__", m.ConsumerGroup)
		assert.NotEmpty(t, m.LeaseID)
		assert.NotEmpty(t, m.TransactionID)
		ids = append(ids, id)
	}
	assert.NotEqual(t, ids[0], ids[2], "the token moves with every event")
	// The first thing written is a retry: with jitter, then a comment.
	first := c.pending[0]
	assert.GreaterOrEqual(t, first.retry, 1000)
	assert.LessOrEqual(t, first.retry, 3000)
	assert.Equal(t, "connected", first.comment)
}

func TestSSE_Heartbeat(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.SSEHeartbeat = 50 * time.Millisecond })
	c := e.openSSE(t, "/api/v1/sse/queue/sse-hb", nil)
	beats := 0
	deadline := time.After(5 * time.Second)
	for beats < 3 {
		select {
		case ev := <-c.events:
			if ev.comment == "heartbeat" {
				beats++
			}
		case <-deadline:
			t.Fatalf("%d heartbeats within 5 s", beats)
		}
	}
}

// pushTo pushes payloads to one partition of a queue.
func (e *env) pushTo(q, partition string, payloads ...string) {
	e.t.Helper()
	items := make([]string, len(payloads))
	for i, p := range payloads {
		items[i] = fmt.Sprintf(`{"queue":%q,"partition":%q,"payload":%s}`, q, partition, p)
	}
	e.pushItems("[" + strings.Join(items, ",") + "]")
}

// maxInFlight holds the stream until acks (posted to this instance, or to
// another: found by the stream's lease check) give the credit back.
func TestSSE_MaxInFlightAndAcks(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	e, _ := newInstance(t, dsn, "notify")
	other, _ := newInstance(t, dsn, "notify")
	c := e.openSSE(t, "/api/v1/sse/queue/sse-credit?maxInFlight=2&batch=1", nil)
	for i := 1; i <= 5; i++ {
		e.pushTo("sse-credit", "p"+strconv.Itoa(i), strconv.Itoa(i))
	}
	m1, _ := c.next()
	m2, _ := c.next()
	c.nothing(300 * time.Millisecond)

	// An ack here gives the credit back at once.
	require.True(t, e.ack(m1, "completed", "").Success)
	c.next()
	c.nothing(100 * time.Millisecond)

	// An ack on another instance: the stream finds it in the database.
	require.True(t, other.ack(m2, "completed", "").Success)
	c.next()
}

// The browser reconnects with Last-Event-ID to a second instance: what it
// received before the token is acknowledged, the rest comes again, in
// order per partition, and nothing twice.
func TestSSE_ResumeOnSecondInstance(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	a, _ := newInstance(t, dsn, "notify", func(c *server.Config) { c.SSEResumeGrace = 200 * time.Millisecond })
	b, _ := newInstance(t, dsn, "notify")
	a.post("/api/v1/configure", `{"queue":"sse-resume","options":{"leaseTime":300}}`)
	a.pushTo("sse-resume", "a", payloads(6, 1)...)
	a.pushTo("sse-resume", "b", payloads(6, 101)...)

	seen := map[string]int{}
	last := map[string]int{}
	record := func(m message) {
		n, err := strconv.Atoi(string(m.Data))
		require.NoError(t, err)
		seen[string(m.Data)]++
		require.Greater(t, n, last[m.Partition], "order within partition %s", m.Partition)
		last[m.Partition] = n
	}
	// Two leases of 4 (one per partition) are in flight; the browser
	// receives 6 events before it loses the connection.
	c := a.openSSE(t, "/api/v1/sse/queue/sse-resume?batch=4&maxInFlight=10", nil)
	var token string
	for range 6 {
		m, id := c.next()
		record(m)
		token = id
	}
	c.close()

	c2 := b.openSSE(t, "/api/v1/sse/queue/sse-resume?batch=4&maxInFlight=10", http.Header{"Last-Event-Id": {token}})
	for len(seen) < 12 {
		// A condition, not a timing: a generous ceiling (5 s failed once
		// at load 14).
		m, _ := c2.nextWithin(30 * time.Second)
		record(m)
		require.True(t, b.ack(m, "completed", "").Success)
	}
	// A's grace period ends: its release must not repeat anything.
	c2.nothing(600 * time.Millisecond)
	for k, n := range seen {
		assert.Equal(t, 1, n, "message %s delivered %d times", k, n)
	}
	b.popEmpty("/api/v1/pop/queue/sse-resume")
}

// The lastEventId query does the same for a first connect (a page that kept
// the token itself).
func TestSSE_ResumeByQuery(t *testing.T) {
	e := newEnv(t)
	e.post("/api/v1/configure", `{"queue":"sse-q","options":{"leaseTime":300}}`)
	e.push("sse-q", payloads(4, 1)...)
	c := e.openSSE(t, "/api/v1/sse/queue/sse-q?batch=4", nil)
	var token string
	for i := 1; i <= 2; i++ {
		_, token = c.next()
	}
	c.close()
	c2 := e.openSSE(t, "/api/v1/sse/queue/sse-q?batch=4&lastEventId="+token, nil)
	m, _ := c2.next()
	assert.JSONEq(t, "3", string(m.Data))
}

// A stream that closes keeps its leases for the grace period, then gives
// them back: another consumer gets them long before the lease time.
func TestSSE_ClosedStreamReleasesAfterGrace(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.SSEResumeGrace = 100 * time.Millisecond })
	e.post("/api/v1/configure", `{"queue":"sse-grace","options":{"leaseTime":300}}`)
	e.push("sse-grace", `1`)
	c := e.openSSE(t, "/api/v1/sse/queue/sse-grace", nil)
	c.next()
	c.close()
	start := time.Now()
	r := e.get("/api/v1/pop/queue/sse-grace?wait=true&timeout=5000")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Less(t, time.Since(start), 3*time.Second)
}

// A browser that reopens its stream (the SDK does, to send a fresh token)
// may close it just after the server wrote a message the page never saw:
// the new stream resumes with the id of an earlier event. What the closed
// streams of that browser wrote after it comes to the new stream at once,
// not after the resume grace; so too through a stream that the page got
// nothing from (its resume names the first stream's events).
func TestSSE_ResumeGetsAtOnceWhatTheClosedStreamWroteAfterItsToken(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.SSEResumeGrace = time.Hour })
	e.post("/api/v1/configure", `{"queue":"sse-reopen","options":{"leaseTime":300}}`)
	const path = "/api/v1/sse/queue/sse-reopen?consumerGroup=g"
	e.push("sse-reopen", `1`)
	a := e.openSSE(t, path, nil)
	m, token := a.next()
	require.JSONEq(t, "1", string(m.Data))
	require.True(t, e.ack(m, "completed", "").Success)
	e.push("sse-reopen", `2`)
	m, _ = a.next() // written; the page closes the stream before it sees it
	require.JSONEq(t, "2", string(m.Data))
	a.close()

	b := e.openSSE(t, path+"&lastEventId="+token, nil)
	// A ceiling, far under the grace of an hour.
	m, _ = b.nextWithin(10 * time.Second)
	require.JSONEq(t, "2", string(m.Data), "the reopened stream gets what the closed one wrote after its token")
	b.close() // again before the page saw it

	c := e.openSSE(t, path+"&lastEventId="+token, nil)
	m, _ = c.nextWithin(10 * time.Second)
	require.JSONEq(t, "2", string(m.Data), "and so through a stream it got nothing from")
	require.True(t, e.ack(m, "completed", "").Success)
	c.nothing(300 * time.Millisecond)
	e.popEmpty("/api/v1/pop/queue/sse-reopen?consumerGroup=g")
}

// Another browser's resume does not take what a closed stream keeps for
// its own browser's resume: those leases wait for their grace.
func TestSSE_ResumeLeavesAnotherStreamsLeasesToTheirGrace(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.SSEResumeGrace = time.Hour })
	e.post("/api/v1/configure", `{"queue":"sse-other","options":{"leaseTime":300}}`)
	const path = "/api/v1/sse/queue/sse-other?consumerGroup=g"
	e.push("sse-other", `1`)
	first := e.openSSE(t, path, nil)
	m, token := first.next()
	require.True(t, e.ack(m, "completed", "").Success)
	first.close()

	e.push("sse-other", `2`)
	other := e.openSSE(t, path, nil) // another browser, which gets 2 and goes away
	m, _ = other.next()
	require.JSONEq(t, "2", string(m.Data))
	other.close()

	resumed := e.openSSE(t, path+"&lastEventId="+token, nil)
	resumed.nothing(time.Second)
	e.popEmpty("/api/v1/pop/queue/sse-other?consumerGroup=g")
}

func TestSSE_AutoAck(t *testing.T) {
	e := newEnv(t)
	c := e.openSSE(t, "/api/v1/sse/queue/sse-auto?autoAck=true", nil)
	e.push("sse-auto", payloads(3, 1)...)
	var token string
	for i := 1; i <= 3; i++ {
		m, id := c.next()
		assert.JSONEq(t, strconv.Itoa(i), string(m.Data))
		assert.Empty(t, m.LeaseID)
		token = id
	}
	e.popEmpty("/api/v1/pop/queue/sse-auto")
	c.close()
	c2 := e.openSSE(t, "/api/v1/sse/queue/sse-auto?autoAck=true", http.Header{"Last-Event-Id": {token}})
	c2.nothing(200 * time.Millisecond)
	e.push("sse-auto", `4`)
	m, _ := c2.next()
	assert.JSONEq(t, "4", string(m.Data))
}

// A subscription's SSE stream outlives its write timeout: the deadline
// moves on with the writes (once less than half of it is left), so a
// stream open longer than the timeout, busy or idle between heartbeats,
// still gets its messages.
func TestSSE_KeepsDeliveringPastItsWriteTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	t.Cleanup(gateway.SetSSEWriteTimeout(timeout))
	deadline := gateway.LatestStreamDeadline(t)
	e := newEnv(t)
	c := e.openSSE(t, "/api/v1/sse/queue/sse-wt?autoAck=true", nil)
	opened := time.Now()
	for i := 0; time.Since(opened) < 4*timeout; i++ {
		e.push("sse-wt", strconv.Itoa(i))
		m, _ := c.next()
		assert.JSONEq(t, strconv.Itoa(i), string(m.Data), "message %d, %v after the stream opened", i, time.Since(opened))
	}
	idlePastDeadline(t, deadline)
	e.push("sse-wt", `"late"`)
	m, _ := c.next()
	assert.JSONEq(t, `"late"`, string(m.Data))
}

// Overloaded or draining: 200 with retry: and close, never a status that
// makes EventSource give up.
func TestSSE_OverloadAndDrain(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.MaxSSEConnections = 1 })
	c := e.openSSE(t, "/api/v1/sse/queue/sse-over", nil)
	c.nothing(50 * time.Millisecond)

	over := e.openSSE(t, "/api/v1/sse/queue/sse-over", nil)
	require.Equal(t, http.StatusOK, over.res.StatusCode)
	evs := over.waitEnd()
	require.Len(t, evs, 1)
	assert.GreaterOrEqual(t, evs[0].retry, 1000)

	e.srv.Drain()
	evs = c.waitEnd()
	require.NotEmpty(t, evs)
	assert.Positive(t, evs[len(evs)-1].retry, "the last thing a draining stream writes is retry:")

	late := e.openSSE(t, "/api/v1/sse/queue/sse-over", nil)
	require.Equal(t, http.StatusOK, late.res.StatusCode)
	require.Positive(t, late.waitEnd()[0].retry)
}

func TestSSE_BadRequests(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct{ path, msg string }{
		{"/api/v1/sse/queue/sse-bad?lastEventId=nope", "Last-Event-ID is not a resume token of this server"},
		{"/api/v1/sse/queue/sse-bad?maxInFlight=-1", "maxInFlight must be an integer of at least 1"},
		{"/api/v1/sse/queue/sse-bad?autoAck=maybe", "autoAck must be true or false"},
		{"/api/v1/sse/queue/" + strings.Repeat("x", 300), ""},
	} {
		r := e.get(tc.path)
		assert.Equal(t, http.StatusBadRequest, r.status, "%s: %s", tc.path, r)
		if tc.msg != "" {
			assertError(t, r, http.StatusBadRequest, tc.msg)
		}
	}
	// A token for another partition's lease that is not held changes nothing.
	e.push("sse-bad", `1`)
	tok := []byte{1}
	tok = append(tok, bytes.Repeat([]byte{0x11}, 16)...) // a partition
	tok = append(tok, bytes.Repeat([]byte{0x22}, 16)...) // a lease
	tok = append(tok, 5)                                 // through offset 5
	c := e.openSSE(t, "/api/v1/sse/queue/sse-bad?lastEventId="+base64.RawURLEncoding.EncodeToString(tok), nil)
	m, _ := c.next()
	assert.JSONEq(t, "1", string(m.Data))
}

// Two groups on SSE both receive every message.
func TestSSE_ConsumerGroups(t *testing.T) {
	e := newEnv(t)
	g1 := e.openSSE(t, "/api/v1/sse/queue/sse-groups?consumerGroup=g1&autoAck=true", nil)
	g2 := e.openSSE(t, "/api/v1/sse/queue/sse-groups?consumerGroup=g2&autoAck=true", nil)
	e.push("sse-groups", payloads(5, 1)...)
	for _, c := range []*sseClient{g1, g2} {
		for i := 1; i <= 5; i++ {
			m, _ := c.next()
			assert.JSONEq(t, strconv.Itoa(i), string(m.Data))
		}
	}
}

// Shutdown: Drain ends the stream with retry:, and Close gives back at once
// the leases it kept for a resume (the grace period is 10 s).
func TestSSE_ShutdownReleasesLeases(t *testing.T) {
	e := newEnv(t)
	e.post("/api/v1/configure", `{"queue":"sse-shut","options":{"leaseTime":300}}`)
	e.push("sse-shut", `1`)
	c := e.openSSE(t, "/api/v1/sse/queue/sse-shut", nil)
	c.next()
	e.srv.Drain()
	c.waitEnd()
	e.popEmpty("/api/v1/pop/queue/sse-shut") // still held for a resume
	e.srv.WaitStreams(ctxT(t))
	assert.Zero(t, e.srv.Streams())
	e.srv.Close()
	m := e.pop("/api/v1/pop/queue/sse-shut")
	assert.JSONEq(t, "1", string(m.Messages[0].Data))
}

// An encrypted queue's payloads reach WebSocket and SSE consumers in
// clear, and long-polls too.
func TestEncryptedQueue_AllTransports(t *testing.T) {
	base := queuetest.NewStore(t)
	store, err := queue.New(queue.Config{Pool: base.Pool(), EncryptionKey: bytes.Repeat([]byte{3}, 32)})
	require.NoError(t, err)
	e := newEnvOn(t, store, nil)
	r := e.post("/api/v1/configure", `{"queue":"enc","options":{"encryptionEnabled":true}}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	const secret = `{"pin":"1234"}`

	ws := e.dialWS(t)
	ws.subscribe(`{"type":"subscribe","id":"s","queue":"enc","consumerGroup":"ws","autoAck":true}`)
	sse := e.openSSE(t, "/api/v1/sse/queue/enc?consumerGroup=sse&autoAck=true", nil)
	e.push("enc", secret)

	got := deliveredMessages(t, ws.next("deliver"))
	require.Len(t, got, 1)
	assert.JSONEq(t, secret, string(got[0].Data), "WebSocket")
	m, _ := sse.next()
	assert.JSONEq(t, secret, string(m.Data), "SSE")
	pop := e.pop("/api/v1/pop/queue/enc?consumerGroup=lp&wait=true&timeout=5000&autoAck=true")
	require.Len(t, pop.Messages, 1)
	assert.JSONEq(t, secret, string(pop.Messages[0].Data), "long-poll")

	var stored string
	require.NoError(t, store.Pool().QueryRow(ctxT(t), `SELECT payload::text FROM messages`).Scan(&stored))
	assert.NotContains(t, stored, "1234")
}

// A stream whose client stops reading while its events fill the socket is
// a slow consumer: within the documented bound its leases are given back
// at once (not kept for a resume: another consumer gets the messages, no
// attempt counted), and the stream ends with event: disconnect
// {"code":4001} and a retry:, which reach the client once it reads again;
// a healthy stream of the same queue is served meanwhile.
func TestSSE_SlowConsumerGetsDisconnectEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const q, n = "sseslowconsumer", 250
	e.pushLarge(q, "p1", n)

	host := strings.TrimPrefix(e.url, "http://")
	conn, err := smallReadBuffer(ctxT(t), "tcp", host)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	_, err = fmt.Fprintf(conn, "GET /api/v1/sse/queue/%s/partition/p1?batch=%d&maxInFlight=%d HTTP/1.1\r\nHost: %s\r\nAccept: text/event-stream\r\n\r\n",
		q, n, n, host)
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(20*time.Second)))
	br := bufio.NewReader(conn)
	status, err := br.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "HTTP/1.1 200 OK\r\n", status)
	for { // the head, then the first retry: and ": connected"
		line, err := br.ReadString('\n')
		require.NoError(t, err)
		if line == ": connected\n" {
			break
		}
	}
	stopped := time.Now() // it reads nothing more for now
	lease, leased := e.slowConsumerLease(q)

	healthy := e.openSSE(t, "/api/v1/sse/queue/"+q+"/partition/p2", nil)
	rescuer := e.dialWS(t)
	rescuer.subscribe(fmt.Sprintf(`{"type":"subscribe","id":3,"queue":%q,"partition":"p1","batch":%d,"maxInFlight":%d}`, q, n, n))

	e.pushItems(fmt.Sprintf(`[{"queue":%q,"partition":"p2","payload":"h"}]`, q))
	hm, _ := healthy.next()
	servedAt := time.Since(stopped)
	assert.JSONEq(t, `"h"`, string(hm.Data))

	released := e.slowConsumerReleased(q, lease, leased)
	releasedAt := time.Since(stopped)

	// Reading again, the slow client finds what its socket held, then the
	// last event: disconnect with 4001, and a retry: so EventSource comes
	// back. Events are read whole; a data line is 32 KiB.
	last, read, err := lastEvent(br)
	t.Logf("the slow client read %d bytes before: %v", read, err)
	assert.Equal(t, "disconnect", last.event, "the last event")
	assert.JSONEq(t, `{"code":4001,"reason":"client reads too slowly"}`, last.data)
	assert.Positive(t, last.retry, "a retry: with it: EventSource comes back")

	t.Logf("healthy stream served after %v; slow consumer's lease given back %v after it was taken, %v after the client stopped reading",
		servedAt, released, releasedAt)
	assert.Less(t, servedAt, releasedAt, "the healthy stream did not wait for the slow one")
	assert.Less(t, released, slowConsumerBound, "leases released within the bound, not kept for a resume")
	ms := rescuer.deliveredWithin(10*time.Second, n)
	for i, m := range ms {
		require.Equal(t, 0, m.RetryCount, "message %d: a release counts no attempt", i)
	}
}

// A message older than its queue's ttl reaches no transport: a WebSocket
// subscription, an SSE stream, a long-poll and a plain pop each get the
// young message pushed after it, and never the expired one.
func TestTTL_ExpiredMessageReachesNoTransport(t *testing.T) {
	e := newEnv(t)
	r := e.post("/api/v1/configure", `{"queue":"ttlq","options":{"ttl":60}}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	e.push("ttlq", `{"n":"old"}`, `{"n":"young"}`)
	e.exec(`UPDATE messages SET created_at = created_at - interval '2 minutes' WHERE seq = 1`)
	const young = `{"n":"young"}`

	ws := e.dialWS(t)
	ws.subscribe(`{"type":"subscribe","id":"s","queue":"ttlq","consumerGroup":"ws","autoAck":true}`)
	got := deliveredMessages(t, ws.next("deliver"))
	require.Len(t, got, 1)
	assert.JSONEq(t, young, string(got[0].Data), "WebSocket")
	sse := e.openSSE(t, "/api/v1/sse/queue/ttlq?consumerGroup=sse&autoAck=true", nil)
	m, _ := sse.next()
	assert.JSONEq(t, young, string(m.Data), "SSE")
	lp := e.pop("/api/v1/pop/queue/ttlq?consumerGroup=lp&wait=true&timeout=5000&batch=10&autoAck=true")
	require.Len(t, lp.Messages, 1)
	assert.JSONEq(t, young, string(lp.Messages[0].Data), "long-poll")
	p := e.pop("/api/v1/pop/queue/ttlq?consumerGroup=hp&wait=false&batch=10")
	require.Len(t, p.Messages, 1)
	assert.JSONEq(t, young, string(p.Messages[0].Data), "pop")

	_, series := scrape(t, e)
	assert.Equal(t, 4.0, series["herald_messages_expired_total"][`queue="ttlq"`], "each transport's skip is counted")
	r = e.get("/api/v1/dlq?queue=ttlq")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.JSONEq(t, `0`, string(object(t, r.body)["total"]), "expiry keeps no dead letter")
}
