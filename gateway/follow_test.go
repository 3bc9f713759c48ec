package gateway_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/gateway"
	"github.com/heraldmq/herald/internal/server/servertest"
)

// followMsg is a followed message as every transport gives it.
type followMsg struct {
	message
	Offset  int64  `json:"offset"`
	EventID string `json:"eventId"`
}

// nextFollow returns the next message event of an SSE follow.
func (c *sseClient) nextFollow() followMsg {
	c.t.Helper()
	for i, ev := range c.pending {
		if ev.event == "message" {
			c.pending = append(c.pending[:i], c.pending[i+1:]...)
			return c.decodeFollow(ev)
		}
	}
	deadline := time.After(10 * time.Second)
	for {
		select {
		case ev := <-c.events:
			if ev.event == "message" {
				return c.decodeFollow(ev)
			}
			c.pending = append(c.pending, ev)
		case <-c.ended:
			c.t.Fatal("stream ended waiting for a message")
		case <-deadline:
			c.t.Fatal("no message event within 10 s")
		}
	}
}

func (c *sseClient) decodeFollow(ev sseEvent) followMsg {
	c.t.Helper()
	var m followMsg
	require.NoError(c.t, json.Unmarshal([]byte(ev.data), &m), ev.data)
	require.NotEmpty(c.t, ev.id, "every message event names its position")
	require.Equal(c.t, ev.id, m.EventID, "the data's eventId is the event's id")
	return m
}

// Every follower of a queue gets every message, in one order (each
// partition's offsets in order), with the same ids; the message JSON is
// the subscription's (no group, no lease).
func TestFollow_SSEDeliversEveryMessageToEveryFollowerInOrder(t *testing.T) {
	e := newEnv(t)
	var cs []*sseClient
	for range 3 {
		c := e.openSSE(t, "/api/v1/follow/queue/fa", nil)
		require.Equal(t, http.StatusOK, c.res.StatusCode)
		assert.Equal(t, "text/event-stream", c.res.Header.Get("Content-Type"))
		cs = append(cs, c)
	}
	waitFollowers(t, e, "fa", 3)
	for i := range 12 {
		e.pushItems(fmt.Sprintf(`[{"queue":"fa","partition":"p%d","payload":%d}]`, i%3, i))
	}
	var first []string
	for k, c := range cs {
		var ids []string
		last := map[string]int64{}
		for range 12 {
			m := c.nextFollow()
			assert.Equal(t, "fa", m.Queue)
			assert.Empty(t, m.LeaseID)
			assert.Greater(t, m.Offset, last[m.Partition], "partition order")
			last[m.Partition] = m.Offset
			ids = append(ids, m.EventID)
		}
		if k == 0 {
			first = ids
		} else {
			assert.Equal(t, first, ids, "every follower sees one order")
		}
	}
}

// A burst (a push of many messages, then pushes while those are still
// being written) reaches every follower whole: the hub hands several
// messages at once and a stream writes what waits in one write. Every
// follower gets every message once, each partition's offsets in
// order, in one order for all, each event with its exact id: a resume
// after the 100th gets exactly the 50 after it.
func TestFollow_SSEBurstsAreWrittenTogetherInOrderWithExactIDs(t *testing.T) {
	e := newEnv(t)
	const n, total = 6, 150
	var cs []*sseClient
	for range n {
		cs = append(cs, e.openSSE(t, "/api/v1/follow/queue/fc", nil))
	}
	waitFollowers(t, e, "fc", n)
	items := make([]string, total)
	for i := range items {
		items[i] = fmt.Sprintf(`{"queue":"fc","partition":"p%d","payload":%d}`, i%3, i)
	}
	e.pushItems("[" + strings.Join(items[:100], ",") + "]")
	for i := 100; i < total; i += 10 {
		e.pushItems("[" + strings.Join(items[i:i+10], ",") + "]")
	}
	var first []string
	for k, c := range cs {
		last := map[string]int64{}
		var ids []string
		for i := range total {
			m := c.nextFollow()
			require.Equal(t, last[m.Partition]+1, m.Offset, "follower %d, message %d: %s's offsets each once, in order", k, i, m.Partition)
			last[m.Partition] = m.Offset
			var v int
			require.NoError(t, json.Unmarshal(m.Data, &v))
			require.Equal(t, fmt.Sprintf("p%d", v%3), m.Partition, "payload %d", v)
			ids = append(ids, m.EventID)
		}
		c.nothing(100 * time.Millisecond)
		if k == 0 {
			first = ids
			continue
		}
		require.Equal(t, first, ids, "follower %d: one order, the same ids", k)
	}
	require.Len(t, first, total)
	r := e.openSSE(t, "/api/v1/follow/queue/fc", http.Header{"Last-Event-Id": {first[99]}})
	for i := 100; i < total; i++ {
		assert.Equal(t, first[i], r.nextFollow().EventID, "resumed after the 100th: message %d", i)
	}
	r.nothing(100 * time.Millisecond)
}

// A follow stream outlives its write timeout: every write moves the
// deadline on, the hub's non-blocking writes included, so a stream that
// has been open longer than the timeout still gets its messages.
func TestFollow_SSEKeepsDeliveringPastItsWriteTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	t.Cleanup(gateway.SetSSEWriteTimeout(timeout))
	deadline := gateway.LatestStreamDeadline(t)
	e := newEnv(t)
	c := e.openSSE(t, "/api/v1/follow/queue/fw", nil)
	require.Equal(t, http.StatusOK, c.res.StatusCode)
	waitFollowers(t, e, "fw", 1)
	opened := time.Now()
	for i := 0; time.Since(opened) < 4*timeout; i++ {
		e.pushItems(fmt.Sprintf(`[{"queue":"fw","payload":%d}]`, i))
		m := c.nextFollow()
		assert.JSONEq(t, fmt.Sprint(i), string(m.Data), "message %d, %v after the stream opened", i, time.Since(opened))
	}
	idlePastDeadline(t, deadline)
	e.pushItems(`[{"queue":"fw","payload":"late"}]`)
	m := c.nextFollow()
	assert.JSONEq(t, `"late"`, string(m.Data))
}

// idlePastDeadline waits, writing nothing, until the write deadline the
// stream's connection was given last has passed: a write that did not
// move it on would fail.
func idlePastDeadline(t *testing.T, deadline func() time.Time) {
	t.Helper()
	require.False(t, deadline().IsZero(), "the stream's connection got a write deadline")
	require.Eventually(t, func() bool { return time.Now().After(deadline()) }, 30*time.Second, 5*time.Millisecond,
		"the stream's write deadline passed")
}

// waitFollowers waits until the instance has n followers of q.
func waitFollowers(t *testing.T, e *env, q string, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return e.srv.Followers()[q] == n }, 10*time.Second, 5*time.Millisecond,
		"%d followers of %s joined", n, q)
}

// N followers cost one read per wake-up, not one per follower: the
// statements the instance sends while 20 followers get 10 pushes are the
// hub's, a handful per push.
func TestFollow_FollowersShareOneReadPerMessage(t *testing.T) {
	e := newEnv(t)
	const n, pushes = 20, 10
	var cs []*sseClient
	for range n {
		cs = append(cs, e.openSSE(t, "/api/v1/follow/queue/fr", nil))
	}
	waitFollowers(t, e, "fr", n)
	stats := e.store.QueryStats()
	before := stats.Snapshot()["follow_read"]
	for i := range pushes {
		e.push("fr", fmt.Sprint(i))
		for _, c := range cs {
			m := c.nextFollow()
			require.JSONEq(t, fmt.Sprint(i), string(m.Data))
		}
	}
	reads := stats.Snapshot()["follow_read"] - before
	t.Logf("%d follow reads for %d pushes to %d followers", reads, pushes, n)
	assert.LessOrEqual(t, reads, uint64(3*pushes), "reads are per push, not per follower (%d followers)", n)
}

// A follower that comes back with Last-Event-ID gets exactly what was
// pushed after its last event: nothing lost, nothing twice. A position of
// another queue, or garbage, is refused with 400.
func TestFollow_SSEResumesExactlyFromLastEventID(t *testing.T) {
	e := newEnv(t)
	c := e.openSSE(t, "/api/v1/follow/queue/fb", nil)
	waitFollowers(t, e, "fb", 1)
	e.push("fb", payloads(5, 0)...)
	var last string
	for range 3 {
		last = c.nextFollow().EventID
	}
	c.close()
	e.push("fb", payloads(4, 5)...)
	r := e.openSSE(t, "/api/v1/follow/queue/fb", http.Header{"Last-Event-Id": {last}})
	for i := 3; i < 9; i++ {
		m := r.nextFollow()
		assert.JSONEq(t, fmt.Sprint(i), string(m.Data))
	}
	r.nothing(200 * time.Millisecond)
	// lastEventId in the query, for a first connect.
	q := e.openSSE(t, "/api/v1/follow/queue/fb?lastEventId="+url.QueryEscape(last), nil)
	assert.JSONEq(t, "3", string(q.nextFollow().Data))

	for _, bad := range []string{"garbage", "f1AAAA"} {
		res := e.get("/api/v1/follow/queue/fb?from=" + bad)
		assert.Equal(t, http.StatusBadRequest, res.status, "%s: %s", bad, res)
	}
	res := e.doHeader("/api/v1/follow/queue/other", http.Header{"Last-Event-Id": {last}})
	assert.Equal(t, http.StatusBadRequest, res.status, "a position of another queue: %s", res)
}

// A push made on this instance that commits while an older transaction
// is still open waits behind it, even though the hub could take the
// push's messages as they are: the older transaction may still push to
// the queue (here to another partition), and its message comes before
// them in the follow order. Followers get it first, then the push's; a
// resume from its id gets the push's, and a resume from the last id
// nothing. (A hub that took a push's messages straight from the push would
// send the later one at once and never the older one: its position would
// already be past it.)
func TestFollow_PushHereWaitsBehindAnOlderOpenTransaction(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	c := e.openSSE(t, "/api/v1/follow/queue/fo", nil)
	waitFollowers(t, e, "fo", 1)
	tx, err := e.store.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT pg_current_xact_id()`) // the older transaction's id
	require.NoError(t, err)

	e.pushItems(`[{"queue":"fo","partition":"later","payload":2}]`) // committed, on this instance
	c.nothing(300 * time.Millisecond)
	_, err = tx.Exec(ctx, `SELECT push('fo', 'older', '1')`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	first, second := c.nextFollow(), c.nextFollow()
	assert.Equal(t, "older", first.Partition, "the older transaction's message comes first")
	assert.JSONEq(t, "1", string(first.Data))
	assert.Equal(t, "later", second.Partition)
	assert.JSONEq(t, "2", string(second.Data))

	r := e.openSSE(t, "/api/v1/follow/queue/fo", http.Header{"Last-Event-Id": {first.EventID}})
	m := r.nextFollow()
	assert.Equal(t, second.EventID, m.EventID, "a resume from the first id gets the second, with the same id")
	r.nothing(200 * time.Millisecond)
	z := e.openSSE(t, "/api/v1/follow/queue/fo", http.Header{"Last-Event-Id": {second.EventID}})
	z.nothing(200 * time.Millisecond)
}

// doHeader GETs path with header.
func (e *env) doHeader(path string, header http.Header) resp {
	e.t.Helper()
	req, err := http.NewRequestWithContext(ctxT(e.t), http.MethodGet, e.url+path, nil)
	require.NoError(e.t, err)
	for k, v := range header {
		req.Header[k] = v
	}
	res, err := e.client.Do(req)
	require.NoError(e.t, err)
	defer func() { _ = res.Body.Close() }()
	var b strings.Builder
	_, _ = bufio.NewReader(res.Body).WriteTo(&b)
	return resp{status: res.StatusCode, header: res.Header, body: []byte(b.String())}
}

// from=beginning reads what is stored; a partition follow sees its
// partition only.
func TestFollow_SSEFromBeginningAndPartition(t *testing.T) {
	e := newEnv(t)
	e.pushItems(`[{"queue":"fc","partition":"a","payload":1},{"queue":"fc","partition":"b","payload":2}]`)
	all := e.openSSE(t, "/api/v1/follow/queue/fc?from=beginning", nil)
	pa := e.openSSE(t, "/api/v1/follow/queue/fc/partition/a?from=beginning", nil)
	assert.JSONEq(t, "1", string(all.nextFollow().Data))
	assert.JSONEq(t, "2", string(all.nextFollow().Data))
	assert.JSONEq(t, "1", string(pa.nextFollow().Data))
	e.pushItems(`[{"queue":"fc","partition":"b","payload":3},{"queue":"fc","partition":"a","payload":4}]`)
	assert.JSONEq(t, "4", string(pa.nextFollow().Data))
	pa.nothing(200 * time.Millisecond)
}

// followPoll is a long-poll answer.
type followPoll struct {
	Messages    []followMsg     `json:"messages"`
	LastEventID string          `json:"lastEventId"`
	Gap         json.RawMessage `json:"gap"`
}

// Long-poll with after=: what follows the id at once; else it waits for
// the next push; 204 when its timeout passes.
func TestFollow_LongPollAfter(t *testing.T) {
	e := newEnv(t)
	e.push("fl", payloads(3, 0)...)
	r := e.get("/api/v1/follow/queue/fl?from=beginning&wait=false&batch=2")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	var p followPoll
	require.NoError(t, json.Unmarshal(r.body, &p))
	require.Len(t, p.Messages, 2)
	r = e.get("/api/v1/follow/queue/fl?wait=true&after=" + url.QueryEscape(p.LastEventID))
	require.Equal(t, http.StatusOK, r.status)
	require.NoError(t, json.Unmarshal(r.body, &p))
	require.Len(t, p.Messages, 1)
	assert.JSONEq(t, "2", string(p.Messages[0].Data))

	got := make(chan resp, 1)
	after := p.LastEventID
	go func() {
		got <- e.get("/api/v1/follow/queue/fl?wait=true&timeout=10000&after=" + url.QueryEscape(after))
	}()
	waitFollowers(t, e, "fl", 1)
	e.push("fl", "42")
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting long-poll was not answered")
	}
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	require.NoError(t, json.Unmarshal(r.body, &p))
	require.Len(t, p.Messages, 1)
	assert.JSONEq(t, "42", string(p.Messages[0].Data))

	r = e.get("/api/v1/follow/queue/fl?wait=true&timeout=50&after=" + url.QueryEscape(p.LastEventID))
	assert.Equal(t, http.StatusNoContent, r.status)
	assert.Empty(t, e.srv.Followers()["fl"], "the timed-out poll left its hub")
	for _, bad := range []string{"batch=many", "timeout=-1", "after=nope"} {
		r = e.get("/api/v1/follow/queue/fl?wait=true&" + bad)
		assert.Equal(t, http.StatusBadRequest, r.status, "%s: %s", bad, r)
	}
}

// A follow long-poll reads wait= as a pop does: 1 waits as true does,
// and a value that is no boolean is refused (400), not taken as false.
func TestFollow_LongPollWaitIsABoolean(t *testing.T) {
	e := newEnv(t)
	got := make(chan resp, 1)
	go func() { got <- e.get("/api/v1/follow/queue/fw?wait=1&timeout=10000") }()
	waitFollowers(t, e, "fw", 1)
	e.push("fw", "7")
	var r resp
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting long-poll was not answered")
	}
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	var p followPoll
	require.NoError(t, json.Unmarshal(r.body, &p))
	require.Len(t, p.Messages, 1, "%s", r)
	assert.JSONEq(t, "7", string(p.Messages[0].Data))
	for _, bad := range []string{"wait=yes", "wait=2"} {
		r = e.get("/api/v1/follow/queue/fw?" + bad)
		assert.Equal(t, http.StatusBadRequest, r.status, "%s: %s", bad, r)
	}
}

// Many follows on one WebSocket, beside nothing else: each its own
// follow_deliver frames; unfollow ends one, the others go on.
func TestFollow_WebSocketFollowsManyOnOneSocket(t *testing.T) {
	e := newEnv(t)
	c := e.dialWS(t)
	c.send(`{"type":"follow","id":1,"queue":"fw1"}`)
	f1 := string(c.next("followed")["follow"])
	c.send(`{"type":"follow","id":2,"queue":"fw2"}`)
	f2 := string(c.next("followed")["follow"])
	c.send(`{"type":"follow","id":3,"queue":"fw1","partition":"a"}`)
	f3 := string(c.next("followed")["follow"])
	require.NotEqual(t, f1, f2)
	waitFollowers(t, e, "fw1", 2)
	waitFollowers(t, e, "fw2", 1)
	e.pushItems(`[{"queue":"fw1","partition":"a","payload":1},{"queue":"fw1","partition":"b","payload":2},{"queue":"fw2","payload":3}]`)
	got := map[string][]string{}
	for len(got[f1]) < 2 || len(got[f2]) < 1 || len(got[f3]) < 1 {
		fr := c.next("follow_deliver")
		var msgs []followMsg
		require.NoError(t, json.Unmarshal(fr["messages"], &msgs))
		for _, m := range msgs {
			require.NotEmpty(t, m.EventID)
			got[string(fr["follow"])] = append(got[string(fr["follow"])], string(m.Data))
		}
	}
	assert.Equal(t, []string{"1", "2"}, got[f1])
	assert.Equal(t, []string{"3"}, got[f2])
	assert.Equal(t, []string{"1"}, got[f3])

	c.send(`{"type":"unfollow","id":4,"follow":` + f1 + `}`)
	c.next("unfollowed")
	waitFollowers(t, e, "fw1", 1)
	e.pushItems(`[{"queue":"fw1","partition":"a","payload":5}]`)
	fr := c.next("follow_deliver")
	assert.Equal(t, f3, string(fr["follow"]))
	c.send(`{"type":"unfollow","id":5,"follow":"nope"}`)
	assert.Equal(t, `"unknown_follow"`, string(c.next("error")["code"]))
	c.send(`{"type":"follow","id":6,"queue":"fw1","from":"f1zzzz"}`)
	assert.Equal(t, `"bad_request"`, string(c.next("error")["code"]))
}

// A follow frame finds its start on the connection's reader: bounded by
// FollowStartTimeout (here far too short for the walk a from=<time> makes),
// it is answered with a timeout error frame, and the connection reads its
// next frames.
func TestFollow_WebSocketStartPastItsTimeoutIsAnsweredWithAnError(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.FollowStartTimeout = time.Nanosecond })
	e.pushItems(`[{"queue":"fslow","payload":1}]`)
	c := e.dialWS(t)
	c.send(`{"type":"follow","id":1,"queue":"fslow","from":"2020-01-01T00:00:00Z"}`)
	fr := c.next("error")
	assert.Equal(t, `"timeout"`, string(fr["code"]))
	assert.Equal(t, `1`, string(fr["id"]))
	c.send(`{"type":"unfollow","id":2,"follow":"nope"}`)
	assert.Equal(t, `"unknown_follow"`, string(c.next("error")["code"]), "the reader goes on")
}

// Following needs consume rights on the queue or partition: refused with
// 403 (SSE, long-poll) or a forbidden error frame, on every transport.
func TestFollow_RefusedWithoutConsumeRights(t *testing.T) {
	e := newAuthEnv(t)
	alice := mailbox(t, "alice")
	ok := e.doAuth(http.MethodGet, "/api/v1/follow/queue/mail/partition/alice?wait=false", alice, "")
	assert.Equal(t, http.StatusOK, ok.status, "%s", ok)
	for _, path := range []string{"/api/v1/follow/queue/mail", "/api/v1/follow/queue/mail/partition/bob",
		"/api/v1/follow/queue/mail/partition/bob?wait=true&after=x", "/api/v1/follow/queue/other"} {
		r := e.doAuth(http.MethodGet, path, alice, "")
		assert.Equal(t, http.StatusForbidden, r.status, "%s: %s", path, r)
	}
	ws, err := dialToken(t, e, alice)
	require.NoError(t, err)
	defer func() { _ = ws.Close() }()
	require.NoError(t, ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"follow","id":1,"queue":"mail","partition":"bob"}`)))
	_ = ws.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, data, err := ws.ReadMessage()
	require.NoError(t, err)
	assert.Contains(t, string(data), `"forbidden"`)
}

// A follower that does not read is closed as a slow consumer once its
// buffer is full (a retry: line: EventSource comes back with its
// Last-Event-ID), while another follower gets everything; the slow one
// resumes exactly where it stopped.
func TestFollow_SlowFollowerIsClosedWhileOthersGoOn(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.FollowBuffer = 16 })
	fast := e.openSSE(t, "/api/v1/follow/queue/fz", nil)
	// The slow one reads its head and then nothing.
	u, err := url.Parse(e.url)
	require.NoError(t, err)
	conn, err := net.Dial("tcp", u.Host)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	_, err = conn.Write([]byte("GET /api/v1/follow/queue/fz HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n"))
	require.NoError(t, err)
	waitFollowers(t, e, "fz", 2)
	// Under the test client's 64 KiB line; 150 of them are more than the
	// socket buffers between the two hold.
	big := `"` + strings.Repeat("x", 48<<10) + `"`
	const n = 150
	for i := range n {
		e.pushItems(fmt.Sprintf(`[{"queue":"fz","payload":{"i":%d,"pad":%s}}]`, i, big))
		m := fast.nextFollow()
		var v struct{ I int }
		require.NoError(t, json.Unmarshal(m.Data, &v))
		require.Equal(t, i, v.I, "the fast follower gets everything in order")
	}
	waitFollowers(t, e, "fz", 1)
	// Now read what the slow one was sent: some messages, then a retry:.
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	rd := bufio.NewReaderSize(conn, 1<<20)
	var lastID, lastLine, event string
	got := 0 // messages (the stream opens with the start's id, which is none)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			var ne net.Error
			require.False(t, errors.As(err, &ne) && ne.Timeout(), "the server closed the slow stream (%d events read)", got)
			break
		}
		if !strings.HasSuffix(line, "\n") {
			break // a last event cut short: EventSource drops it
		}
		line = strings.TrimRight(line, "\r\n")
		if strings.HasPrefix(line, "event: ") {
			event = line[7:]
		}
		if strings.HasPrefix(line, "id: ") {
			lastID = line[4:]
			if event == "message" {
				got++
			}
		}
		if line != "" {
			lastLine = line
		}
	}
	require.Less(t, got, n, "the slow follower was cut off")
	t.Logf("the slow follower got %d of %d; its last line %.40q", got, n, lastLine)
	// It resumes by its last id: exactly the rest.
	r := e.openSSE(t, "/api/v1/follow/queue/fz", http.Header{"Last-Event-Id": {lastID}})
	for i := got; i < n; i++ {
		m := r.nextFollow()
		var v struct{ I int }
		require.NoError(t, json.Unmarshal(m.Data, &v))
		require.Equal(t, i, v.I)
	}
}

// A follower whose buffer fills because its client stopped reading is a
// slow consumer: its stream ends with event: disconnect {"code":4001} and a
// retry: (EventSource comes back with its Last-Event-ID), which reach the
// client once it reads again within SlowConsumerCloseGrace: the write
// under way when it was dropped is let finish, not cut short.
func TestFollow_SlowFollowerGetsDisconnectEvent(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.FollowBuffer = 16 })
	host := strings.TrimPrefix(e.url, "http://")
	conn, err := smallReadBuffer(ctxT(t), "tcp", host)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	_, err = fmt.Fprintf(conn, "GET /api/v1/follow/queue/fslow HTTP/1.1\r\nHost: %s\r\nAccept: text/event-stream\r\n\r\n", host)
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(20*time.Second)))
	br := bufio.NewReaderSize(conn, 1<<20)
	for { // the head, then the first retry: and ": connected"
		line, err := br.ReadString('\n')
		require.NoError(t, err)
		if line == ": connected\n" {
			break
		}
	}
	waitFollowers(t, e, "fslow", 1)
	// It reads nothing more: pushes fill its socket, then its buffer.
	big := `"` + strings.Repeat("x", 48<<10) + `"`
	dropped := false
	for i := 0; i < 400 && !dropped; i++ {
		e.pushItems(fmt.Sprintf(`[{"queue":"fslow","payload":{"i":%d,"pad":%s}}]`, i, big))
		dropped = e.srv.Followers()["fslow"] == 0
	}
	require.Eventually(t, func() bool { return e.srv.Followers()["fslow"] == 0 }, 10*time.Second, 5*time.Millisecond,
		"the follower that does not read is dropped once its buffer is full")
	last, _, err := lastEvent(br)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the server ends the slow stream")
	assert.Equal(t, "disconnect", last.event, "the last event")
	assert.JSONEq(t, `{"code":4001,"reason":"client reads too slowly"}`, last.data)
	assert.Positive(t, last.retry, "a retry: with it: EventSource comes back")
}

// Retention deletes messages a follower has not read: on its return it
// gets event: gap (naming the first message still stored), then what is
// still stored, and nothing is silently skipped.
func TestFollow_RetentionGapIsAnEvent(t *testing.T) {
	e := newEnv(t)
	r := e.post("/api/v1/configure", `{"queue":"fg","options":{"retentionEnabled":true,"retentionSeconds":60}}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	e.push("fg", payloads(5, 0)...)
	c := e.openSSE(t, "/api/v1/follow/queue/fg?from=beginning", nil)
	first := c.nextFollow().EventID
	c.close()
	e.exec(`UPDATE messages SET created_at = created_at - interval '2 minutes' WHERE seq <= 3`)
	_, ran, err := e.store.RunRetention(ctxT(t), 0)
	require.NoError(t, err)
	require.True(t, ran)
	r2 := e.openSSE(t, "/api/v1/follow/queue/fg", http.Header{"Last-Event-Id": {first}})
	m := r2.nextFollow()
	assert.JSONEq(t, "3", string(m.Data), "then what is still stored")
	var gap *sseEvent
	for _, ev := range r2.pending {
		if ev.event == "gap" {
			gap = &ev
		}
	}
	require.NotNil(t, gap, "the gap is told before the messages after it")
	var g struct {
		GoneThrough string  `json:"goneThrough"`
		NextEventID *string `json:"nextEventId"`
	}
	require.NoError(t, json.Unmarshal([]byte(gap.data), &g))
	require.NotNil(t, g.NextEventID)
	assert.Equal(t, m.EventID, *g.NextEventID)
	assert.NotEmpty(t, g.GoneThrough)
	assert.JSONEq(t, "4", string(r2.nextFollow().Data))
}

// Retention deleting a message while an older push transaction is still
// open moves no follower past that transaction's message: the deleted
// message sorts above it (a transaction's messages are placed at its own
// id), so the gap is told only once the barrier has passed it, and the
// older message comes first.
func TestFollow_RetentionGapAboveAnOpenTransactionSkipsNothing(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	r := e.post("/api/v1/configure", `{"queue":"fr","options":{"retentionEnabled":true,"retentionSeconds":60}}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	c := e.openSSE(t, "/api/v1/follow/queue/fr", nil)
	waitFollowers(t, e, "fr", 1)
	tx, err := e.store.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT pg_current_xact_id()`) // the older transaction's id
	require.NoError(t, err)

	e.pushItems(`[{"queue":"fr","partition":"deleted","payload":2}]`)
	e.exec(`UPDATE messages SET created_at = created_at - interval '2 minutes' WHERE partition_id IN
		(SELECT p.id FROM partitions p JOIN queues q ON q.id = p.queue_id WHERE q.name = 'fr' AND p.name = 'deleted')`)
	_, ran, err := e.store.RunRetention(ctx, 0)
	require.NoError(t, err)
	require.True(t, ran)
	// A newer message waits behind the open transaction: the hub reads
	// again and again meanwhile, each read seeing the deletion's mark.
	e.pushItems(`[{"queue":"fr","partition":"newer","payload":3}]`)
	c.nothing(300 * time.Millisecond)
	_, err = tx.Exec(ctx, `SELECT push('fr', 'older', '1')`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	first := c.nextFollow()
	assert.Equal(t, "older", first.Partition, "the open transaction's message is not skipped")
	assert.JSONEq(t, "1", string(first.Data))
	second := c.nextFollow()
	assert.Equal(t, "newer", second.Partition)
	assert.JSONEq(t, "3", string(second.Data))
	told := false
	for _, ev := range c.pending {
		told = told || ev.event == "gap"
	}
	assert.True(t, told, "the deleted message is told as a gap, not skipped in silence")
}

// Idle followers send no query: with followers parked on a hub and
// nothing pushed, the statements sent are the hub's slow sweep only.
func TestFollow_IdleFollowersCostNoQuery(t *testing.T) {
	e := newEnv(t)
	stats := e.store.QueryStats()
	// The idle span in the hub's own time: its sweeps, each with the
	// statements counted so far (taken under the hub's mutex: its next
	// read waits) and the wait it armed before the next.
	type sweep struct {
		reads uint64
		next  time.Duration
	}
	sweeps := make(chan sweep, 64)
	gateway.OnHubSweep(t, func(q string, next time.Duration) {
		if q == "fi" {
			select {
			case sweeps <- sweep{stats.Snapshot()["follow_read"], next}:
			default:
			}
		}
	})
	for range 10 {
		e.openSSE(t, "/api/v1/follow/queue/fi", nil)
	}
	waitFollowers(t, e, "fi", 10) // every catch-up read is done
	nextSweep := func() sweep {
		t.Helper()
		select {
		case s := <-sweeps:
			return s
		case <-time.After(30 * time.Second):
			t.Fatal("the hub did not sweep within 30 s")
			return sweep{}
		}
	}
	for len(sweeps) > 0 { // those of the joins
		<-sweeps
	}
	prev := nextSweep()
	// Four sweeps (at least 1.5 s of the hub's back-off): one statement
	// each, the hub's, whatever the followers (one read each would be 10
	// more), and each wait twice the one before, up to the longest.
	for i := range 4 {
		s := nextSweep()
		assert.Equal(t, 1, int(s.reads-prev.reads), "sweep %d: the hub's read only, 10 idle followers", i+1)
		assert.Equal(t, min(2*prev.next, gateway.FollowSweepMax), s.next, "sweep %d: the idle hub backs off", i+1)
		prev = s
	}
}

// A follow is a consumer for syncnet: its presence reaches the peers, so
// a push on B (which wakes only the peers that announced the queue, once
// it knows) reaches A's follower at once; when A's last follower leaves,
// so does its presence (after the linger).
func TestFollow_PresenceReachesPeersOverSyncnet(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	a, b := servertest.Start(t, dsn, "syncnet"), servertest.Start(t, dsn, "syncnet")
	servertest.Link(a, b)
	require.Eventually(t, func() bool {
		has, known := b.Node().HasSubscribers("fp")
		return known && !has
	}, 10*time.Second, 10*time.Millisecond, "B knows nobody follows fp")
	e := &env{t: t, url: a.URL(), client: http.DefaultClient}
	c := e.openSSE(t, "/api/v1/follow/queue/fp", nil)
	require.Eventually(t, func() bool {
		has, _ := b.Node().HasSubscribers("fp")
		return has
	}, 10*time.Second, 10*time.Millisecond, "A's follower is announced to B")
	b.Push("fp", `"hello"`)
	m := c.nextFollow()
	assert.JSONEq(t, `"hello"`, string(m.Data))
	assert.Equal(t, 1, a.Gateway().Followers()["fp"])
	c.close()
	require.Eventually(t, func() bool { return a.Gateway().Followers()["fp"] == 0 }, 10*time.Second, 10*time.Millisecond)
}

// Memory per idle SSE follower, server side (the client's side is a bare
// socket): at most ~7 KB, the figure of an idle subscription.
func TestFollow_IdleFollowerMemory(t *testing.T) {
	e := newEnv(t)
	u, err := url.Parse(e.url)
	require.NoError(t, err)
	const n = 500
	// The stacks are most of it, and vary: a goroutine starts with the
	// average stack of the last GC (the runtime's adaptive stack start).
	measure := func() (heap, stack uint64) {
		var ms runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse, ms.StackInuse
	}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	open := func(k int) {
		for range k {
			c, err := net.Dial("tcp", u.Host)
			require.NoError(t, err)
			_, err = c.Write([]byte("GET /api/v1/follow/queue/fm HTTP/1.1\r\nHost: x\r\n\r\n"))
			require.NoError(t, err)
			conns = append(conns, c)
		}
	}
	// A first round: the hub, the pools (goroutines, database connections
	// the joins' start reads opened) exist before the measure.
	open(n)
	waitFollowers(t, e, "fm", n)
	// Then three rounds of n more, each measured on its own: what else the process does meanwhile (an earlier test's pools
	// winding down, stacks shrunk by a collection) moves a single round
	// either way (6.0–11.5 KB seen at load 4–21; 3.7 KB once).
	var rounds []float64
	for round := 1; round <= 3; round++ {
		h0, s0 := measure()
		g0 := runtime.NumGoroutine()
		open(n)
		waitFollowers(t, e, "fm", (round+1)*n)
		// The handlers that joined have returned: one goroutine per
		// follower (its reader) is left.
		require.Eventually(t, func() bool { return runtime.NumGoroutine() <= g0+n+8 }, 10*time.Second, 10*time.Millisecond)
		h1, s1 := measure()
		heap, stack := (float64(h1)-float64(h0))/n, (float64(s1)-float64(s0))/n
		r := heap + stack
		t.Logf("round %d: %.0f bytes per idle SSE follower (heap %.0f + stacks %.0f, %d followers)", round, r, heap, stack, n)
		rounds = append(rounds, r)
	}
	// The least of the three: what else runs meanwhile only adds (the
	// median still moved past the bound under two CPU hogs).
	slices.Sort(rounds)
	per := rounds[0]
	assert.LessOrEqual(t, per, 7.5*1024, "an idle follower costs about what an idle subscription does")
}

// The followed frame names the follow's start (lastEventId): a WebSocket
// client cut off before its first message follows again from it and gets
// what was pushed meanwhile, of a queue and of a partition.
func TestFollow_WebSocketFollowedNamesItsStart(t *testing.T) {
	e := newEnv(t)
	e.pushItems(`[{"queue":"fst","partition":"a","payload":0}]`)
	c := e.dialWS(t)
	c.send(`{"type":"follow","id":1,"queue":"fst"}`)
	q := c.next("followed")
	c.send(`{"type":"follow","id":2,"queue":"fst","partition":"a"}`)
	p := c.next("followed")
	var qStart, pStart string
	require.NoError(t, json.Unmarshal(q["lastEventId"], &qStart))
	require.NoError(t, json.Unmarshal(p["lastEventId"], &pStart))
	require.NotEmpty(t, qStart)
	require.NotEmpty(t, pStart)
	require.NoError(t, c.ws.Close())

	e.pushItems(`[{"queue":"fst","partition":"a","payload":1}]`)
	c2 := e.dialWS(t)
	c2.send(`{"type":"follow","id":1,"queue":"fst","from":"` + qStart + `"}`)
	c2.next("followed")
	c2.send(`{"type":"follow","id":2,"queue":"fst","partition":"a","from":"` + pStart + `"}`)
	c2.next("followed")
	for range 2 {
		fr := c2.next("follow_deliver")
		var msgs []followMsg
		require.NoError(t, json.Unmarshal(fr["messages"], &msgs))
		require.Len(t, msgs, 1, "only what was pushed after the start")
		assert.JSONEq(t, "1", string(msgs[0].Data))
	}
}

// An SSE follow opens with an id and no data: it names the start (after
// "now", a time, ...) and sets the browser's Last-Event-ID before any
// message without dispatching an event, so a reconnect before the first
// message loses nothing.
func TestFollow_SSEOpensWithTheStartsID(t *testing.T) {
	e := newEnv(t)
	c := e.openSSE(t, "/api/v1/follow/queue/fss", nil)
	var start sseEvent
	for start.id == "" {
		select {
		case start = <-c.events:
			require.Empty(t, start.event, "no event before the start's id")
			require.Empty(t, start.data, "the start's id dispatches nothing")
		case <-time.After(10 * time.Second):
			t.Fatal("no id before the first message")
		}
	}
	c.close()
	e.push("fss", payloads(2, 0)...)
	r := e.openSSE(t, "/api/v1/follow/queue/fss", http.Header{"Last-Event-Id": {start.id}})
	assert.JSONEq(t, "0", string(r.nextFollow().Data), "what was pushed after the start")
	assert.JSONEq(t, "1", string(r.nextFollow().Data))
}
