package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/gateway"
	"github.com/heraldmq/herald/internal/server"
	"github.com/heraldmq/herald/internal/server/servertest"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/queue/queuetest"
)

// newMaintEnv is a gateway with a push buffer in a temp dir and its
// maintenance loop running (refreshing every 100 ms unless cfg says
// otherwise). The loop stops and the buffer closes when the test ends.
func newMaintEnv(t *testing.T, cfg ...func(*gateway.Config)) *env {
	t.Helper()
	return newMaintEnvIn(t, t.TempDir(), cfg...)
}

// newMaintEnvIn is newMaintEnv with its buffer in dir.
func newMaintEnvIn(t *testing.T, dir string, cfg ...func(*gateway.Config)) *env {
	t.Helper()
	base := func(c *gateway.Config) {
		c.BufferDir, c.MaintenanceRefresh = dir, 100*time.Millisecond
	}
	e := newEnv(t, append([]func(*gateway.Config){base}, cfg...)...)
	e.runMaintenance()
	return e
}

// runMaintenance runs the server's maintenance loop until stop (or the
// test's end), then closes the server (and its buffer).
func (e *env) runMaintenance() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = e.srv.RunMaintenance(ctx)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
			e.srv.Close()
		})
	}
	e.t.Cleanup(stop)
	return stop
}

// setMaintenance switches a mode ("" push, "/pop" pop) and expects 200.
func (e *env) setMaintenance(mode string, on bool) resp {
	e.t.Helper()
	r := e.post("/api/v1/system/maintenance"+mode, fmt.Sprintf(`{"enabled":%t}`, on))
	require.Equal(e.t, http.StatusOK, r.status, "%s", r)
	return r
}

// buffered is one item of a push answered in push maintenance.
type buffered struct {
	Status        string `json:"status"`
	Queue         string `json:"queue"`
	Partition     string `json:"partition"`
	TransactionID string `json:"transactionId"`
}

// pushBuffered pushes raw items and expects each to be buffered.
func (e *env) pushBuffered(items string) []buffered {
	e.t.Helper()
	r := e.post("/api/v1/push", `{"items":`+items+`}`)
	require.Equal(e.t, http.StatusCreated, r.status, "push: %s", r)
	var out []buffered
	require.NoError(e.t, json.Unmarshal(r.body, &out))
	for _, b := range out {
		require.Equal(e.t, "buffered", b.Status, "%s", r)
	}
	return out
}

// count runs a SELECT count(*) in the env's schema.
func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.store.Pool().QueryRow(ctxT(e.t), sql, args...).Scan(&n))
	return n
}

// metric reads one unlabelled sample from /metrics.
func (e *env) metric(name string) string {
	e.t.Helper()
	r := e.get("/metrics")
	for _, line := range strings.Split(string(r.body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	e.t.Fatalf("no %s in /metrics", name)
	return ""
}

// popAll pops queue (autoAck) until 204 and returns the payloads in order.
func (e *env) popAll(path string) []string {
	e.t.Helper()
	var out []string
	for {
		r := e.get(path)
		if r.status == http.StatusNoContent {
			return out
		}
		require.Equal(e.t, http.StatusOK, r.status, "%s", r)
		var p popResult
		require.NoError(e.t, json.Unmarshal(r.body, &p))
		for _, m := range p.Messages {
			out = append(out, string(m.Data))
		}
	}
}

func TestMaintenance_RoutesAndShapes(t *testing.T) {
	t.Parallel()
	e := newMaintEnv(t)

	// Exactly the reference server's shape, key order included; Herald has
	// no failover files, so those counts stay zero.
	r := e.get("/api/v1/system/maintenance")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.JSONEq(t, `{"maintenanceMode":false,"popMaintenanceMode":false,"bufferedMessages":0,"bufferHealthy":true,
		"bufferStats":{"pendingCount":0,"failedCount":0,"dbHealthy":true,
		"failedFiles":{"count":0,"totalBytes":0,"totalMB":0,"failoverCount":0,"qos0Count":0}}}`, string(r.body))
	assert.Equal(t, []string{"maintenanceMode", "popMaintenanceMode", "bufferedMessages", "bufferHealthy", "bufferStats"}, keys(t, r.body))
	assert.Equal(t, []string{"pendingCount", "failedCount", "dbHealthy", "failedFiles"}, keys(t, object(t, r.body)["bufferStats"]))
	r = e.get("/api/v1/system/maintenance/pop")
	require.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, []string{"popMaintenanceMode", "message"}, keys(t, r.body))
	assert.Equal(t, "false", string(object(t, r.body)["popMaintenanceMode"]))

	// Validation: the reference server's texts.
	for _, path := range []string{"/api/v1/system/maintenance", "/api/v1/system/maintenance/pop"} {
		for _, body := range []string{`{}`, `{"enabled":"true"}`, `{"enabled":1}`, `{"enabled":null}`, `{"on":true}`} {
			assertError(t, e.post(path, body), http.StatusBadRequest, "enabled (boolean) is required")
		}
		assertError(t, e.do(http.MethodPost, path, ""), http.StatusBadRequest, "Empty request body")
		assert.Equal(t, http.StatusBadRequest, e.post(path, `{"enabled":`).status)
	}
	assert.Zero(t, e.count(`SELECT count(*) FROM system_state`), "a refused request stores nothing")

	// Push maintenance on: the switches are independent.
	r = e.setMaintenance("", true)
	assert.Equal(t, []string{"maintenanceMode", "bufferedMessages", "bufferHealthy", "message"}, keys(t, r.body))
	on := object(t, r.body)
	assert.Equal(t, "true", string(on["maintenanceMode"]))
	assert.Equal(t, "0", string(on["bufferedMessages"]))
	assert.Equal(t, "true", string(on["bufferHealthy"]))
	assert.Contains(t, string(on["message"]), "enabled")
	r = e.get("/api/v1/system/maintenance")
	assert.Equal(t, "true", string(object(t, r.body)["maintenanceMode"]))
	assert.Equal(t, "false", string(object(t, r.body)["popMaintenanceMode"]))
	assert.Equal(t, "1", e.metric("herald_maintenance_mode"))
	assert.Equal(t, "0", e.metric("herald_pop_maintenance_mode"))

	r = e.setMaintenance("/pop", true)
	assert.Equal(t, []string{"popMaintenanceMode", "message"}, keys(t, r.body))
	pop := object(t, r.body)
	assert.Equal(t, "true", string(pop["popMaintenanceMode"]))
	assert.Equal(t, "1", e.metric("herald_pop_maintenance_mode"))
	r = e.get("/api/v1/system/maintenance")
	assert.Equal(t, "true", string(object(t, r.body)["popMaintenanceMode"]))
	assert.Equal(t, "true", string(object(t, e.get("/api/v1/system/maintenance/pop").body)["popMaintenanceMode"]))

	// Persisted: one row per key, with who switched it.
	assert.Equal(t, 2, e.count(`SELECT count(*) FROM system_state WHERE value = '{"enabled": true}' AND updated_by = 'test'`))
	st, err := e.store.SystemState(ctxT(t))
	require.NoError(t, err)
	assert.True(t, st.Maintenance && st.PopMaintenance)

	e.setMaintenance("", false)
	e.setMaintenance("/pop", false)
	assert.Equal(t, "0", e.metric("herald_maintenance_mode"))
	assert.Equal(t, "0", e.metric("herald_pop_maintenance_mode"))
	r = e.get("/api/v1/system/maintenance")
	assert.Equal(t, "false", string(object(t, r.body)["maintenanceMode"]))

	// The reference server's name for the shared state's stats.
	a, b := e.get("/api/v1/system/shared-state"), e.get("/internal/api/shared-state/stats")
	require.Equal(t, http.StatusOK, a.status)
	assert.JSONEq(t, string(b.body), string(a.body))
}

func TestMaintenance_Roles(t *testing.T) {
	t.Parallel()
	e := newMaintEnv(t, func(c *gateway.Config) { c.Auth = &auth.Auth{Secret: authSecret} })
	writer := auth.SignToken(authSecret, "svc", "read-write", time.Hour)
	reader := auth.SignToken(authSecret, "dash", "read-only", time.Hour)
	admin := auth.SignToken(authSecret, "ops", "admin", time.Hour)
	routes := []struct{ method, path, body string }{
		{http.MethodGet, "/api/v1/system/maintenance", ""},
		{http.MethodPost, "/api/v1/system/maintenance", `{"enabled":true}`},
		{http.MethodGet, "/api/v1/system/maintenance/pop", ""},
		{http.MethodPost, "/api/v1/system/maintenance/pop", `{"enabled":false}`},
		{http.MethodGet, "/api/v1/system/shared-state", ""},
	}
	for _, rt := range routes {
		assert.Equal(t, http.StatusUnauthorized, e.doAuth(rt.method, rt.path, "", rt.body).status, rt.path)
		assert.Equal(t, http.StatusForbidden, e.doAuth(rt.method, rt.path, writer, rt.body).status, rt.path)
		assert.Equal(t, http.StatusOK, e.doAuth(rt.method, rt.path, admin, rt.body).status, rt.path)
	}
	// Push maintenance is on now; a push still needs its role and rights
	// before it is buffered.
	push := `{"items":[{"queue":"roles","payload":1}]}`
	assert.Equal(t, http.StatusForbidden, e.doAuth(http.MethodPost, "/api/v1/push", reader, push).status)
	r := e.doAuth(http.MethodPost, "/api/v1/push", mailbox(t, "alice"), push) // may produce to mail/alice only
	assert.Equal(t, http.StatusForbidden, r.status, "%s", r)
	r = e.doAuth(http.MethodPost, "/api/v1/push", writer, push)
	assert.Equal(t, http.StatusCreated, r.status, "%s", r)
	assert.Contains(t, string(r.body), `"status":"buffered"`)
	assert.Equal(t, 1, e.srvBuffered())
}

// srvBuffered is bufferedMessages of GET /api/v1/system/maintenance (as
// admin when auth is on).
func (e *env) srvBuffered() int {
	e.t.Helper()
	admin := auth.SignToken(authSecret, "ops", "admin", time.Hour)
	r := e.doAuth(http.MethodGet, "/api/v1/system/maintenance", admin, "")
	require.Equal(e.t, http.StatusOK, r.status, "%s", r)
	var out struct {
		BufferedMessages int `json:"bufferedMessages"`
	}
	require.NoError(e.t, json.Unmarshal(r.body, &out))
	return out.BufferedMessages
}

func TestMaintenance_PushBufferedThenDrained(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	e := newMaintEnvIn(t, dir)
	e.push("mq", `0`) // before: straight to the database
	e.setMaintenance("", true)

	out := e.pushBuffered(`[{"queue":"mq","payload":1,"transactionId":"tx-1"},
		{"queue":"mq","partition":"p2","payload":{"a":[1,2]}},
		{"queue":"mq","payload":null},
		{"queue":"mq"},
		{"queue":"mq","payload":1,"transactionId":"tx-1"}]`)
	require.Len(t, out, 5)
	assert.Equal(t, buffered{"buffered", "mq", "Default", "tx-1"}, out[0])
	assert.Equal(t, "p2", out[1].Partition)
	for _, b := range out[1:4] {
		assert.NotEmpty(t, b.TransactionID, "a transactionId is made for every buffered item: a drain run twice stores it once")
	}
	r := e.post("/api/v1/push", `{"items":[{"queue":"mq","payload":2}]}`)
	assert.Equal(t, []string{"status", "queue", "partition", "transactionId"}, keys(t, array(t, r.body)[0]))
	assert.Equal(t, `[]`, strings.TrimSpace(string(e.post("/api/v1/push", `{"items":[]}`).body)), "empty items: 201 []")

	// Bad input is refused as a push would refuse it, before the buffer.
	assert.Equal(t, http.StatusBadRequest, e.post("/api/v1/push", `{"items":[{"queue":""}]}`).status)
	assert.Equal(t, http.StatusBadRequest, e.post("/api/v1/push", `{"items":[{"queue":"mq","traceId":"x"}]}`).status)
	assert.Equal(t, http.StatusBadRequest, e.post("/api/v1/push", `{"nope":1}`).status)

	// Nothing reached the database; buffered messages are invisible to pops.
	assert.Equal(t, 1, e.count(`SELECT count(*) FROM messages`))
	assert.Equal(t, []string{"0"}, e.popAll("/api/v1/pop/queue/mq?autoAck=true&batch=100"))
	assert.Equal(t, 6, e.srvBuffered())
	// The reference's buffer read says so too.
	assert.Contains(t, string(e.get("/api/v1/status/buffers").body), `"pending":6`)
	assert.Equal(t, "6", e.metric("herald_buffer_messages"))
	assert.Equal(t, "6", e.metric("herald_buffer_appended_total"))

	// A transaction still writes to the database (its pushes are atomic
	// with its acks), as on the reference server.
	r = e.post("/api/v1/transaction", `{"operations":[{"type":"push","items":[{"queue":"mq-tx","payload":7}]}]}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Equal(t, 1, e.count(`SELECT count(*) FROM messages m JOIN partitions p ON p.id = m.partition_id
		JOIN queues q ON q.id = p.queue_id WHERE q.name = 'mq-tx'`))

	// Off: the buffer drains into the queue, in order, each message once.
	e.setMaintenance("", false)
	eventually(t, func() bool { return e.srvBuffered() == 0 }, "the buffer drains")
	assert.Equal(t, "6", e.metric("herald_buffer_drained_total"), "the duplicate is offered, and stored once")
	assert.Equal(t, []string{"1", "null", "{}", "2"}, e.popAll("/api/v1/pop/queue/mq/partition/Default?autoAck=true&batch=100"))
	assert.Equal(t, []string{`{"a":[1,2]}`}, e.popAll("/api/v1/pop/queue/mq/partition/p2?autoAck=true&batch=100"))
	assert.Equal(t, 1, e.count(`SELECT count(*) FROM messages WHERE transaction_id = 'tx-1'`))
	assert.Equal(t, 6+1, e.count(`SELECT count(*) FROM messages`), "0, five buffered (one a duplicate), 2, and the transaction's")
	// Pushes go straight to the database again.
	res := e.push("mq", `3`)
	assert.Equal(t, "queued", res[0].Status)
	st, err := os.Stat(filepath.Join(dir, "push-0.buf"))
	require.NoError(t, err)
	assert.Equal(t, int64(16), st.Size(), "the buffer file is back to its header")
}

func TestMaintenance_WebSocketPushBuffered(t *testing.T) {
	t.Parallel()
	e := newMaintEnv(t)
	e.setMaintenance("", true)
	c := e.dialWS(t)
	c.send(`{"type":"push","id":7,"items":[{"queue":"wsq","payload":1,"transactionId":"w1"},{"queue":"wsq","payload":2}]}`)
	f := c.next("push_result")
	assert.Equal(t, "7", string(f["id"]))
	var res []buffered
	require.NoError(t, json.Unmarshal(f["results"], &res))
	require.Len(t, res, 2)
	assert.Equal(t, buffered{"buffered", "wsq", "Default", "w1"}, res[0])
	assert.Zero(t, e.count(`SELECT count(*) FROM messages`))
	c.send(`{"type":"push","id":8,"items":[{"queue":"wsq","traceId":"not-a-uuid"}]}`)
	assert.Equal(t, `"bad_request"`, string(c.next("error")["code"]))

	e.setMaintenance("", false)
	eventually(t, func() bool { return e.count(`SELECT count(*) FROM messages`) == 2 }, "drained")
	assert.Equal(t, []string{"1", "2"}, e.popAll("/api/v1/pop/queue/wsq?autoAck=true&batch=10"))
}

func TestMaintenance_BufferFullAndNoBuffer(t *testing.T) {
	t.Parallel()
	e := newMaintEnv(t, func(c *gateway.Config) { c.BufferMaxBytes = 300 })
	e.setMaintenance("", true)
	e.pushBuffered(`[{"queue":"full","payload":"` + strings.Repeat("x", 100) + `"}]`)
	r := e.post("/api/v1/push", `{"items":[{"queue":"full","payload":"`+strings.Repeat("x", 200)+`"}]}`)
	assertError(t, r, http.StatusServiceUnavailable, "the push buffer is full: retry when push maintenance ends")
	assert.Equal(t, "5", r.header.Get("Retry-After"))
	assert.Equal(t, "1", e.metric("herald_buffer_full_total"))
	assert.Equal(t, 1, e.srvBuffered(), "a refused push writes nothing")
	c := e.dialWS(t)
	c.send(`{"type":"push","id":1,"items":[{"queue":"full","payload":"` + strings.Repeat("x", 200) + `"}]}`)
	assert.Equal(t, `"unavailable"`, string(c.next("error")["code"]))

	// Without a buffer directory, push maintenance refuses pushes.
	n := newEnv(t, func(c *gateway.Config) { c.MaintenanceRefresh = 100 * time.Millisecond })
	n.runMaintenance()
	n.setMaintenance("", true)
	assertError(t, n.post("/api/v1/push", `{"items":[{"queue":"nobuf"}]}`), http.StatusServiceUnavailable,
		"push maintenance is on and this instance has no push buffer (--buffer-dir): retry when it ends")
	assert.Equal(t, "false", string(object(t, n.get("/api/v1/system/maintenance").body)["bufferHealthy"]))
	n.setMaintenance("", false) // the schema is the test's own, but leave it as found
}

// A queue at its maxSize stops the drain before the refused message, which
// waits (the rest after it) until there is room: nothing is lost or
// reordered.
func TestMaintenance_DrainWaitsForRoom(t *testing.T) {
	t.Parallel()
	e := newMaintEnv(t)
	r := e.post("/api/v1/configure", `{"queue":"small","options":{"maxSize":3}}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	e.setMaintenance("", true)
	e.pushBuffered(`[{"queue":"small","payload":1},{"queue":"small","payload":2},{"queue":"small","payload":3},
		{"queue":"small","payload":4},{"queue":"small","payload":5}]`)
	e.setMaintenance("", false)
	eventually(t, func() bool { return e.srvBuffered() == 2 }, "three stored, two wait")
	assert.Equal(t, 3, e.count(`SELECT count(*) FROM messages`))
	assert.Equal(t, []string{"1", "2", "3"}, e.popAll("/api/v1/pop/queue/small?batch=10"),
		"popped but not acked: the queue stays full")
	r = e.post("/api/v1/configure", `{"queue":"small","options":{"maxSize":10}}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	eventually(t, func() bool { return e.srvBuffered() == 0 }, "the rest is drained at a later refresh")
	assert.Equal(t, []int{1, 2, 3, 4, 5}, e.storedPayloads("small"), "in order, each once")
}

// storedPayloads reads a queue's stored (integer) payloads in offset order.
func (e *env) storedPayloads(q string) []int {
	e.t.Helper()
	rows, err := e.store.Pool().Query(ctxT(e.t), `SELECT m.payload::int FROM messages m JOIN partitions p ON p.id = m.partition_id
		JOIN queues qu ON qu.id = p.queue_id WHERE qu.name = $1 ORDER BY p.name, m.seq`, q)
	require.NoError(e.t, err)
	defer rows.Close()
	var out []int
	for rows.Next() {
		var v int
		require.NoError(e.t, rows.Scan(&v))
		out = append(out, v)
	}
	require.NoError(e.t, rows.Err())
	return out
}

// An instance that stopped while buffering, and whose drain had stored a
// prefix before it crashed (its position lost), drains at its next start:
// every message once, in order.
func TestMaintenance_CrashedDrainRerunsAtStart(t *testing.T) {
	t.Parallel()
	dsn := servertest.SharedDSN(t)
	dir := t.TempDir()
	cfg := func(c *server.Config) {
		c.BufferDir = dir
		c.Adjust.Gateway = func(g *gateway.Config) { g.MaintenanceRefresh = 100 * time.Millisecond }
	}
	a, instA := newInstance(t, dsn, "notify", cfg)
	a.setMaintenance("", true)
	var items []string
	for i := 1; i <= 20; i++ {
		items = append(items, fmt.Sprintf(`{"queue":"crash","payload":%d,"transactionId":"c%d"}`, i, i))
	}
	a.pushBuffered("[" + strings.Join(items, ",") + "]")
	// The switch goes off while this instance is gone: its buffer stays.
	instA.Stop()
	pool, err := queue.NewPool(ctxT(t), dsn, 0)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := queue.New(queue.Config{Pool: pool})
	require.NoError(t, err)
	_, err = store.SetSystemFlag(ctxT(t), queue.StateMaintenance, false)
	require.NoError(t, err)
	// The crashed drain had stored the first seven.
	var first []queue.PushItem
	for i := 1; i <= 7; i++ {
		first = append(first, queue.PushItem{Queue: "crash", Payload: json.RawMessage(fmt.Sprint(i)), TransactionID: fmt.Sprintf("c%d", i)})
	}
	_, err = store.Push(ctxT(t), first)
	require.NoError(t, err)

	b, _ := newInstance(t, dsn, "notify", cfg)
	eventually(t, func() bool { return b.count(`SELECT count(*) FROM messages`) == 20 }, "the start-up drain stores the rest")
	eventually(t, func() bool { return b.srvBuffered() == 0 }, "and empties the buffer")
	want := make([]int, 20)
	for i := range want {
		want[i] = i + 1
	}
	assert.Equal(t, want, b.storedPayloads("crash"), "in order, each once")
}

func TestMaintenance_PopHTTP(t *testing.T) {
	t.Parallel()
	e := newMaintEnv(t)
	e.push("pm", `1`, `2`)
	held := e.pop("/api/v1/pop/queue/pm") // leased before pop maintenance
	e.setMaintenance("/pop", true)

	// Every pop route: 204 at once, even wait=true; no lease taken.
	e.push("pm", `3`) // pushes work
	start := time.Now()
	for _, path := range []string{"/api/v1/pop/queue/pm", "/api/v1/pop/queue/pm?wait=true&timeout=30000",
		"/api/v1/pop/queue/pm/partition/Default?wait=true", "/api/v1/pop?namespace=x&wait=true"} {
		e.popEmpty(path)
	}
	assert.Less(t, time.Since(start), 2*time.Second, "no pop waited")
	assert.Equal(t, 1, e.count(`SELECT count(*) FROM consumers WHERE lease_id IS NOT NULL`), "only the earlier lease")
	// Bad input is still 400.
	assert.Equal(t, http.StatusBadRequest, e.get("/api/v1/pop/queue/pm?batch=-1").status)
	// Acks and lease extensions work.
	r := e.post("/api/v1/lease/"+held.LeaseID+"/extend", `{"seconds":60}`)
	require.Equal(t, http.StatusOK, r.status)
	assert.Contains(t, string(r.body), `"success":true`)
	assert.True(t, e.ack(held.Messages[0], "completed", "").Success)

	e.setMaintenance("/pop", false)
	assert.Equal(t, []string{"2", "3"}, e.popAll("/api/v1/pop/queue/pm?autoAck=true&batch=10"))
}

// A long-poll waiting when pop maintenance starts is answered 204 at once,
// and holds no lease.
func TestMaintenance_PopLongPollAnswered(t *testing.T) {
	t.Parallel()
	e := newMaintEnv(t)
	before := e.p.Intentions()
	got := make(chan resp, 1)
	go func() { got <- e.get("/api/v1/pop/queue/lp?wait=true&timeout=60000") }()
	eventually(t, func() bool { return e.p.Intentions() > before }, "the long-poll waits")
	start := time.Now()
	e.setMaintenance("/pop", true)
	select {
	case r := <-got:
		assert.Equal(t, http.StatusNoContent, r.status)
		assert.Less(t, time.Since(start), 2*time.Second)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting long-poll was not answered")
	}
	e.push("lp", `1`)
	assert.Zero(t, e.count(`SELECT count(*) FROM consumers WHERE lease_id IS NOT NULL`))
	e.setMaintenance("/pop", false)
	assert.Equal(t, "1", string(e.pop("/api/v1/pop/queue/lp?wait=true&timeout=5000").Messages[0].Data))
}

// WebSocket and SSE subscriptions get nothing during pop maintenance (the
// poller leases nothing for them, a push hands off nothing) and resume on
// the same connection when it ends.
func TestMaintenance_PopSubscriptionsPauseAndResume(t *testing.T) {
	t.Parallel()
	e := newMaintEnv(t)
	c := e.dialWS(t)
	sub := c.subscribe(`{"type":"subscribe","id":1,"queue":"ps","batch":10}`)
	sse := e.openSSE(t, "/api/v1/sse/queue/ps-sse?batch=10", nil)
	defer sse.close()
	e.push("ps", `0`)
	first := deliveredMessages(t, c.next("deliver"))
	require.Len(t, first, 1, "served before")
	c.send(fmt.Sprintf(`{"type":"ack","items":[{"transactionId":%q,"partitionId":%q,"leaseId":%q}]}`,
		first[0].TransactionID, first[0].PartitionID, first[0].LeaseID))
	c.next("ack_result")

	e.setMaintenance("/pop", true)
	e.push("ps", `1`, `2`)
	e.push("ps-sse", `1`, `2`)
	c.nothing(300 * time.Millisecond)
	sse.nothing(100 * time.Millisecond)
	assert.Zero(t, e.count(`SELECT count(*) FROM consumers WHERE lease_id IS NOT NULL`), "nothing leased for them")

	e.setMaintenance("/pop", false)
	f := c.next("deliver")
	assert.Equal(t, `"`+sub+`"`, string(f["sub"]))
	var got []string
	for _, m := range deliveredMessages(t, f) {
		got = append(got, string(m.Data))
	}
	assert.Equal(t, []string{"1", "2"}, got)
	m1, _ := sse.next()
	m2, _ := sse.next()
	assert.Equal(t, []string{"1", "2"}, []string{string(m1.Data), string(m2.Data)})
}

// The switches survive in the database: an instance reads them at start.
func TestMaintenance_StateReadAtStart(t *testing.T) {
	t.Parallel()
	store := queuetest.NewStore(t)
	_, err := store.SetSystemFlag(ctxT(t), queue.StatePopMaintenance, true)
	require.NoError(t, err)
	e := newEnvOn(t, store, nil, func(c *gateway.Config) { c.BufferDir = t.TempDir() })
	require.NoError(t, e.srv.LoadMaintenance(ctxT(t)))
	e.popEmpty("/api/v1/pop/queue/start?wait=true")
	assert.Equal(t, "1", e.metric("herald_pop_maintenance_mode"))
	_, err = store.SetSystemFlag(ctxT(t), "nonsense", true)
	require.True(t, queue.IsInputError(err))
}

// A read of the switches that began before a switch was turned and ends
// after it (a periodic refresh racing an operator) does not turn it back:
// a state older than the one applied is ignored.
func TestMaintenance_StaleReadDoesNotUndoASwitch(t *testing.T) {
	t.Parallel()
	e := newMaintEnv(t)
	e.setMaintenance("", true)
	e.srv.ApplyMaintenance(queue.SystemState{UpdatedAt: time.Now().Add(-time.Minute)}) // read before the switch
	assert.Equal(t, "1", e.metric("herald_maintenance_mode"), "still on")
	e.pushBuffered(`[{"queue":"stale","payload":1}]`) // buffered, not stored
	e.setMaintenance("", false)
}
