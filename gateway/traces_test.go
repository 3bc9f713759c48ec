package gateway_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/auth/authtest"
)

// traceItem is an item of GET /api/v1/traces/... answers (by message: the
// first seven fields; by name: all).
type traceItem struct {
	ConsumerGroup  string          `json:"consumer_group"`
	CreatedAt      string          `json:"created_at"`
	Data           json.RawMessage `json:"data"`
	EventType      string          `json:"event_type"`
	ID             string          `json:"id"`
	MessagePayload json.RawMessage `json:"message_payload"`
	PartitionID    string          `json:"partition_id"`
	PartitionName  string          `json:"partition_name"`
	QueueName      string          `json:"queue_name"`
	TraceNames     []string        `json:"trace_names"`
	TransactionID  string          `json:"transaction_id"`
	WorkerID       string          `json:"worker_id"`
}

type tracePage struct {
	Pagination struct{ Limit, Offset int } `json:"pagination"`
	Total      int64                       `json:"total"`
	Traces     []traceItem                 `json:"traces"`
}

type traceNamesPage struct {
	Pagination struct{ Limit, Offset int } `json:"pagination"`
	Total      int64                       `json:"total"`
	TraceNames []struct {
		LastSeen     string `json:"last_seen"`
		MessageCount int64  `json:"message_count"`
		TraceCount   int64  `json:"trace_count"`
		TraceName    string `json:"trace_name"`
	} `json:"trace_names"`
}

// traceBody is the body the Queen JS client sends.
func traceBody(m pushResult, group, event, names, data string) string {
	return fmt.Sprintf(`{"transactionId":%q,"partitionId":%q,"consumerGroup":%s,"traceNames":%s,"eventType":%s,"data":%s}`,
		m.TransactionID, m.PartitionID, group, names, event, data)
}

// recordTrace posts a trace and expects 201 with its id.
func (e *env) recordTrace(body string) string {
	e.t.Helper()
	r := e.post("/api/v1/traces", body)
	require.Equal(e.t, http.StatusCreated, r.status, "%s", r)
	assert.Equal(e.t, []string{"success", "traceId"}, keys(e.t, r.body))
	var out struct {
		Success bool
		TraceID string
	}
	require.NoError(e.t, json.Unmarshal(r.body, &out))
	require.True(e.t, out.Success)
	require.NotEmpty(e.t, out.TraceID)
	return out.TraceID
}

func decodeInto[T any](t *testing.T, r resp) T {
	t.Helper()
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	var v T
	require.NoError(t, json.Unmarshal(r.body, &v), "%s", r.body)
	return v
}

func TestTrace_RecordAndReadByMessage(t *testing.T) {
	e := newEnv(t)
	m := e.push("orders", `{"orderId":42}`)[0]
	// The JS client's body, with nulls for what it was not given.
	first := e.recordTrace(traceBody(m, "null", "null", "null", `{"step":"received"}`))
	second := e.recordTrace(traceBody(m, `"billing"`, `"error"`, `"order-42"`, `[1,2]`))
	third := e.recordTrace(traceBody(m, `"billing"`, `"processing"`, `["order-42","batch-7","order-42"]`, `null`))
	// Without the optional keys at all.
	fourth := e.recordTrace(fmt.Sprintf(`{"transactionId":%q,"partitionId":%q,"data":"done"}`, m.TransactionID, m.PartitionID))

	r := e.get("/api/v1/traces/" + m.PartitionID + "/" + m.TransactionID)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Equal(t, []string{"traces"}, keys(t, r.body))
	items := array(t, object(t, r.body)["traces"])
	require.Len(t, items, 4)
	assert.Equal(t, []string{"consumer_group", "created_at", "data", "event_type", "id", "trace_names", "worker_id"},
		keys(t, items[0]), "the reference's item, keys sorted")
	got := decodeInto[struct{ Traces []traceItem }](t, r).Traces
	assert.Equal(t, []string{first, second, third, fourth}, []string{got[0].ID, got[1].ID, got[2].ID, got[3].ID}, "oldest first")

	assert.Equal(t, "__QUEUE_MODE__", got[0].ConsumerGroup, "null group: queue mode")
	assert.Equal(t, "info", got[0].EventType, "null event type: info")
	assert.Equal(t, []string{}, got[0].TraceNames, "no names: []")
	assert.Equal(t, `"trace_names":[]`, regexp.MustCompile(`"trace_names":\[\]`).FindString(string(items[0])))
	assert.JSONEq(t, `{"step":"received"}`, string(got[0].Data))
	assert.Regexp(t, milliRE, got[0].CreatedAt)
	assert.NotEmpty(t, got[0].WorkerID)

	assert.Equal(t, "billing", got[1].ConsumerGroup)
	assert.Equal(t, "error", got[1].EventType)
	assert.Equal(t, []string{"order-42"}, got[1].TraceNames, "a single string is one name")
	assert.Equal(t, []string{"batch-7", "order-42"}, got[2].TraceNames, "duplicates collapse, sorted")
	assert.Equal(t, "null", string(got[2].Data))
	assert.Equal(t, `"done"`, string(got[3].Data))

	// A message without traces, or never pushed: an empty list.
	other := e.push("orders", `{}`)[0]
	for _, path := range []string{"/api/v1/traces/" + other.PartitionID + "/" + other.TransactionID,
		"/api/v1/traces/" + m.PartitionID + "/never-pushed"} {
		r := e.get(path)
		assert.Equal(t, http.StatusOK, r.status)
		assert.Equal(t, `{"traces":[]}`, string(r.body))
	}
}

// A transaction id with reserved characters round-trips, percent-encoded.
func TestTrace_PathValuesDecoded(t *testing.T) {
	e := newEnv(t)
	m := e.pushItems(`[{"queue":"q","payload":1,"transactionId":"tx/1 ü?"}]`)[0]
	e.recordTrace(traceBody(m, "null", "null", `"a/b c"`, `{}`))
	r := e.get("/api/v1/traces/" + m.PartitionID + "/" + url.PathEscape("tx/1 ü?"))
	assert.Len(t, decodeInto[struct{ Traces []traceItem }](t, r).Traces, 1)
	p := decodeInto[tracePage](t, e.get("/api/v1/traces/by-name/"+url.PathEscape("a/b c")))
	require.Len(t, p.Traces, 1)
	assert.Equal(t, "tx/1 ü?", p.Traces[0].TransactionID)
}

func TestTrace_RecordErrors(t *testing.T) {
	e := newEnv(t)
	m := e.push("q", `1`)[0]
	tx, pid := m.TransactionID, m.PartitionID
	big := `"` + strings.Repeat("x", 64<<10) + `"`
	for _, c := range []struct {
		body   string
		status int
		msg    string
	}{
		{``, 400, "Empty request body"},
		{`[1]`, 400, "Invalid JSON: request body must be a JSON object"},
		{`{"partitionId":"` + pid + `","data":{}}`, 400, "transactionId and partitionId are required"},
		{`{"transactionId":"` + tx + `","data":{}}`, 400, "transactionId and partitionId are required"},
		{`{"transactionId":"","partitionId":"` + pid + `","data":{}}`, 400, "transactionId and partitionId are required"},
		{`{"transactionId":"` + tx + `","partitionId":"` + pid + `"}`, 400, "data is required"},
		{`{"transactionId":7,"partitionId":"` + pid + `","data":{}}`, 400, "transactionId must be a string"},
		{`{"transactionId":"` + tx + `","partitionId":"not-a-uuid","data":{}}`, 400, "partitionId must be a UUID"},
		{`{"transactionId":"` + tx + `","partitionId":"` + pid + `","consumerGroup":1,"data":{}}`, 400, "consumerGroup must be a string"},
		{`{"transactionId":"` + tx + `","partitionId":"` + pid + `","eventType":"a\u0000","data":{}}`, 400, "eventType must not contain control characters"},
		{`{"transactionId":"` + tx + `","partitionId":"` + pid + `","traceNames":5,"data":{}}`, 400, "traceNames must be a string or an array of strings"},
		{`{"transactionId":"` + tx + `","partitionId":"` + pid + `","traceNames":[1],"data":{}}`, 400, "traceNames must be a string or an array of strings"},
		{`{"transactionId":"` + tx + `","partitionId":"` + pid + `","traceNames":[""],"data":{}}`, 400, "a trace name must not be empty"},
		{`{"transactionId":"` + tx + `","partitionId":"` + pid + `","traceNames":"` + strings.Repeat("n", 257) + `","data":{}}`, 400, "a trace name must be at most 256 bytes"},
		{`{"transactionId":"` + tx + `","partitionId":"` + pid + `","traceNames":[` + manyNames(101) + `],"data":{}}`, 400, "a trace carries at most 100 names"},
		{`{"transactionId":"` + tx + `","partitionId":"` + pid + `","data":{"a":"\u0000"}}`, 400, "data must not contain NUL characters"},
		{`{"transactionId":"` + tx + `","partitionId":"` + pid + `","data":` + big + `}`, 400, "data must be at most 65536 bytes of JSON"},
		// The message does not exist: an honest 404, not a 200 or a 500.
		{`{"transactionId":"nope","partitionId":"` + pid + `","data":{}}`, 404, "Message not found"},
		{`{"transactionId":"` + tx + `","partitionId":"00000000-0000-7000-8000-000000000000","data":{}}`, 404, "Message not found"},
	} {
		assertError(t, e.post("/api/v1/traces", c.body), c.status, c.msg)
	}
	var n int
	require.NoError(t, e.store.Pool().QueryRow(ctxT(t), `SELECT count(*) FROM traces`).Scan(&n))
	assert.Zero(t, n, "nothing refused was stored")

	assertError(t, e.get("/api/v1/traces/not-a-uuid/tx"), 400, "partitionId must be a UUID")
}

func manyNames(n int) string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf(`"n%d"`, i)
	}
	return strings.Join(names, ",")
}

func TestTrace_ByName(t *testing.T) {
	e := newEnv(t)
	orders := e.pushItems(`[{"queue":"orders","partition":"eu","payload":{"orderId":42}}]`)[0]
	billing := e.push("billing", `{"invoice":7}`)[0]
	var ids []string
	for i := range 5 {
		m := orders
		if i%2 == 1 {
			m = billing
		}
		ids = append(ids, e.recordTrace(traceBody(m, `"g"`, `"info"`, `["order-42"]`, fmt.Sprintf(`{"i":%d}`, i))))
	}
	e.recordTrace(traceBody(orders, "null", "null", `"order-43"`, `{}`))

	r := e.get("/api/v1/traces/by-name/order-42")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Equal(t, []string{"pagination", "total", "traces"}, keys(t, r.body))
	items := array(t, object(t, r.body)["traces"])
	require.Len(t, items, 5)
	assert.Equal(t, []string{"consumer_group", "created_at", "data", "event_type", "id", "message_payload", "partition_id",
		"partition_name", "queue_name", "trace_names", "transaction_id", "worker_id"}, keys(t, items[0]))
	all := decodeInto[tracePage](t, r)
	assert.EqualValues(t, 5, all.Total)
	assert.Equal(t, 100, all.Pagination.Limit, "the default limit")
	first := all.Traces[0]
	assert.Equal(t, ids[0], first.ID)
	assert.Equal(t, "orders", first.QueueName)
	assert.Equal(t, "eu", first.PartitionName)
	assert.Equal(t, orders.PartitionID, first.PartitionID)
	assert.Equal(t, orders.TransactionID, first.TransactionID)
	assert.JSONEq(t, `{"orderId":42}`, string(first.MessagePayload))
	assert.Regexp(t, milliRE, first.CreatedAt)
	assert.Equal(t, "Default", all.Traces[1].PartitionName)

	idsOf := func(p tracePage) []string {
		out := []string{}
		for _, tr := range p.Traces {
			out = append(out, tr.ID)
		}
		return out
	}
	// limit truncates and offset pages (the reference did neither).
	for _, c := range []struct {
		query string
		want  []string
	}{
		{"limit=2", ids[:2]},
		{"limit=2&offset=2", ids[2:4]},
		{"limit=2&offset=4", ids[4:]},
		{"offset=1", ids[1:]},
	} {
		p := decodeInto[tracePage](t, e.get("/api/v1/traces/by-name/order-42?"+c.query))
		assert.Equal(t, c.want, idsOf(p), c.query)
		assert.EqualValues(t, 5, p.Total, c.query)
	}
	r = e.get("/api/v1/traces/by-name/order-42?limit=3&offset=5")
	assert.Contains(t, string(r.body), `"traces":[]`, "past the end: [], never null")
	assert.Contains(t, string(r.body), `"total":5`)
	assert.Contains(t, string(r.body), `"pagination":{"limit":3,"offset":5}`)

	// from (inclusive) and to (exclusive), RFC 3339.
	// The answer's times are in ms; read the stored ones for an exact window.
	var from, to time.Time
	require.NoError(t, e.store.Pool().QueryRow(ctxT(t), `SELECT (SELECT created_at FROM traces WHERE id = $1::uuid),
		(SELECT created_at FROM traces WHERE id = $2::uuid)`, ids[1], ids[4]).Scan(&from, &to))
	p := decodeInto[tracePage](t, e.get("/api/v1/traces/by-name/order-42?from="+url.QueryEscape(from.Format(time.RFC3339Nano))+
		"&to="+url.QueryEscape(to.Format(time.RFC3339Nano))))
	assert.Equal(t, ids[1:4], idsOf(p))
	assert.EqualValues(t, 3, p.Total)
	p = decodeInto[tracePage](t, e.get("/api/v1/traces/by-name/order-42?from="+url.QueryEscape(time.Now().Add(time.Hour).Format(time.RFC3339))))
	assert.Empty(t, p.Traces)
	assert.Zero(t, p.Total)

	// Unknown name: an empty page.
	assert.Equal(t, `{"pagination":{"limit":100,"offset":0},"total":0,"traces":[]}`, string(e.get("/api/v1/traces/by-name/nobody").body))

	// Bad parameters: 400, never a default in disguise.
	for query, msg := range map[string]string{
		"limit=0":     "limit must be an integer between 1 and 1000",
		"limit=1001":  "limit must be an integer between 1 and 1000",
		"limit=x":     "limit must be an integer between 1 and 1000",
		"offset=-1":   "offset must be an integer between 0 and 1073741824",
		"from=monday": "from must be an RFC3339 time",
		"to=2026-13":  "to must be an RFC3339 time",
	} {
		assertError(t, e.get("/api/v1/traces/by-name/order-42?"+query), 400, msg)
	}
	assertError(t, e.get("/api/v1/traces/by-name/"+strings.Repeat("n", 257)), 400, "a trace name must be at most 256 bytes")
	assertError(t, e.get("/api/v1/traces/by-name/a%00b"), 400, "a trace name must not contain control characters")

	// The message gone: its traces stay until their retention, payload null.
	e.exec(`DELETE FROM messages WHERE transaction_id = $1`, billing.TransactionID)
	p = decodeInto[tracePage](t, e.get("/api/v1/traces/by-name/order-42"))
	require.Len(t, p.Traces, 5)
	assert.Equal(t, "null", string(p.Traces[1].MessagePayload))

	// Deleting a queue deletes its traces.
	r = e.do(http.MethodDelete, "/api/v1/resources/queues/orders", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	p = decodeInto[tracePage](t, e.get("/api/v1/traces/by-name/order-42"))
	assert.Equal(t, []string{ids[1], ids[3]}, idsOf(p))
	assert.Equal(t, `{"traces":[]}`, string(e.get("/api/v1/traces/"+orders.PartitionID+"/"+orders.TransactionID).body))
}

func TestTrace_Names(t *testing.T) {
	e := newEnv(t)
	a := e.push("orders", `1`)[0]
	b := e.push("orders", `2`)[0]
	e.recordTrace(traceBody(a, "null", "null", `["flow","flow"]`, `1`))
	e.recordTrace(traceBody(a, "null", "null", `"flow"`, `2`))
	e.recordTrace(traceBody(b, "null", "null", `["flow","later"]`, `3`))
	e.recordTrace(traceBody(b, "null", "null", `"latest"`, `4`))
	e.recordTrace(traceBody(b, "null", "null", `[]`, `5`))

	r := e.get("/api/v1/traces/names")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Equal(t, []string{"pagination", "total", "trace_names"}, keys(t, r.body))
	items := array(t, object(t, r.body)["trace_names"])
	require.Len(t, items, 3)
	assert.Equal(t, []string{"last_seen", "message_count", "trace_count", "trace_name"}, keys(t, items[0]))
	p := decodeInto[traceNamesPage](t, r)
	assert.EqualValues(t, 3, p.Total)
	assert.Equal(t, 50, p.Pagination.Limit, "the default limit")
	var names []string
	for _, n := range p.TraceNames {
		names = append(names, n.TraceName)
		assert.Regexp(t, milliRE, n.LastSeen)
	}
	// flow and later were last seen on the same trace: by name.
	assert.Equal(t, []string{"latest", "flow", "later"}, names, "most recently seen first")
	flow := p.TraceNames[1]
	assert.EqualValues(t, 3, flow.TraceCount)
	assert.EqualValues(t, 2, flow.MessageCount)

	p = decodeInto[traceNamesPage](t, e.get("/api/v1/traces/names?limit=1&offset=1"))
	require.Len(t, p.TraceNames, 1)
	assert.Equal(t, "flow", p.TraceNames[0].TraceName)
	assert.EqualValues(t, 3, p.Total)
	r = e.get("/api/v1/traces/names?offset=3")
	assert.Equal(t, `{"pagination":{"limit":50,"offset":3},"total":3,"trace_names":[]}`, string(r.body))
	assertError(t, e.get("/api/v1/traces/names?limit=5000"), 400, "limit must be an integer between 1 and 1000")
	assertError(t, e.get("/api/v1/traces/names?offset=x"), 400, "offset must be an integer between 0 and 1073741824")
}

// With auth on: roles per route, and a token's rights. Recording or reading
// the traces of a message in a partition the token may not consume is
// answered as for a message that does not exist (nothing stored); by-name and names list and count only the traces on
// partitions it may consume.
func TestTrace_RightsAndRoles(t *testing.T) {
	e := newAuthEnv(t)
	alice, bob := mailbox(t, "alice"), mailbox(t, "bob")
	admin := auth.SignToken(authSecret, "ops", "admin", time.Hour)
	reader := auth.SignToken(authSecret, "dash", "read-only", time.Hour)
	pushTo := func(tok, partition string) pushResult {
		r := e.doAuth(http.MethodPost, "/api/v1/push", tok, `{"items":[{"queue":"mail","partition":"`+partition+`","payload":{"to":"`+partition+`"}}]}`)
		require.Equal(t, http.StatusCreated, r.status, "%s", r)
		var out []pushResult
		require.NoError(t, json.Unmarshal(r.body, &out))
		return out[0]
	}
	am, bm := pushTo(alice, "alice"), pushTo(bob, "bob")
	record := func(tok string, m pushResult, names string) resp {
		return e.doAuth(http.MethodPost, "/api/v1/traces", tok, traceBody(m, "null", "null", names, `{}`))
	}
	require.Equal(t, http.StatusCreated, record(alice, am, `["shared","alice-only"]`).status)
	require.Equal(t, http.StatusCreated, record(bob, bm, `["shared","bob-only"]`).status)
	require.Equal(t, http.StatusCreated, record(admin, bm, `"shared"`).status, "admins: no rights claim")

	// Another's message: as a message that does not exist, nothing stored.
	assertError(t, record(alice, bm, `"shared"`), http.StatusNotFound, "Message not found")
	r := e.doAuth(http.MethodGet, "/api/v1/traces/"+bm.PartitionID+"/"+bm.TransactionID, alice, "")
	assert.Equal(t, http.StatusOK, r.status)
	assert.JSONEq(t, `{"traces":[]}`, string(r.body))
	assert.Equal(t, http.StatusNotFound, record(alice, pushResult{PartitionID: "00000000-0000-7000-8000-000000000000", TransactionID: "x"}, `null`).status)

	// Her own: allowed.
	r = e.doAuth(http.MethodGet, "/api/v1/traces/"+am.PartitionID+"/"+am.TransactionID, alice, "")
	assert.Len(t, decodeInto[struct{ Traces []traceItem }](t, r).Traces, 1)

	// by-name: only what is on her partitions, counted so.
	p := decodeInto[tracePage](t, e.doAuth(http.MethodGet, "/api/v1/traces/by-name/shared", alice, ""))
	require.Len(t, p.Traces, 1)
	assert.EqualValues(t, 1, p.Total)
	assert.Equal(t, "alice", p.Traces[0].PartitionName)
	p = decodeInto[tracePage](t, e.doAuth(http.MethodGet, "/api/v1/traces/by-name/bob-only", alice, ""))
	assert.Empty(t, p.Traces)
	assert.Zero(t, p.Total)
	p = decodeInto[tracePage](t, e.doAuth(http.MethodGet, "/api/v1/traces/by-name/shared", admin, ""))
	assert.EqualValues(t, 3, p.Total, "an admin sees all")
	p = decodeInto[tracePage](t, e.doAuth(http.MethodGet, "/api/v1/traces/by-name/shared", reader, ""))
	assert.EqualValues(t, 3, p.Total, "a token without a rights claim: its role decides")

	// names: the same filter.
	names := func(tok string) []string {
		p := decodeInto[traceNamesPage](t, e.doAuth(http.MethodGet, "/api/v1/traces/names", tok, ""))
		out := []string{}
		for _, n := range p.TraceNames {
			out = append(out, n.TraceName)
		}
		assert.EqualValues(t, len(out), p.Total)
		return out
	}
	assert.ElementsMatch(t, []string{"shared", "alice-only"}, names(alice))
	assert.ElementsMatch(t, []string{"shared", "bob-only"}, names(bob))
	assert.ElementsMatch(t, []string{"shared", "alice-only", "bob-only"}, names(admin))
	// A claim with no consume pattern sees nothing.
	producer := authtest.Sign(t, jwa.HS256(), authSecret, "", map[string]any{"sub": "p", "role": "read-write",
		"exp": time.Now().Add(time.Hour).Unix(), "herald": map[string]any{"produce": []string{"mail/*"}}})
	assert.Empty(t, names(producer))
	// A whole-queue pattern, and a partition glob.
	mailAll := authtest.Sign(t, jwa.HS256(), authSecret, "", map[string]any{"sub": "m", "role": "read-only",
		"exp": time.Now().Add(time.Hour).Unix(), "herald": map[string]any{"consume": []string{"mail"}}})
	assert.ElementsMatch(t, []string{"shared", "alice-only", "bob-only"}, names(mailAll))
	bGlob := authtest.Sign(t, jwa.HS256(), authSecret, "", map[string]any{"sub": "g", "role": "read-only",
		"exp": time.Now().Add(time.Hour).Unix(), "herald": map[string]any{"consume": []string{"ma*/b*", "other.q/*"}}})
	assert.ElementsMatch(t, []string{"shared", "bob-only"}, names(bGlob))

	// Roles: reads need read-only, recording read-write; no token is 401.
	assert.Equal(t, http.StatusForbidden, record(reader, am, `null`).status, "read-only may not record")
	for _, path := range []string{"/api/v1/traces/names", "/api/v1/traces/by-name/shared",
		"/api/v1/traces/" + am.PartitionID + "/" + am.TransactionID} {
		assert.Equal(t, http.StatusUnauthorized, e.doAuth(http.MethodGet, path, "", "").status, path)
		assert.Equal(t, http.StatusOK, e.doAuth(http.MethodGet, path, reader, "").status, path)
	}
	assert.Equal(t, http.StatusUnauthorized, record("", am, `null`).status)
}
