package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/heraldmq/herald/gateway"
	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/queue/queuetest"
)

// Most tests leave their gateway to the end of the binary without Close:
// the goroutines its warmStacks keeps end a second after their last work
// (or at Close, which TestWarmStacks_KeepsAndEnds checks), after goleak
// has looked.
func TestMain(m *testing.M) {
	pgtest.Main(m, goleak.IgnoreTopFunction("github.com/heraldmq/herald/gateway.(*warmStacks).keep"))
}

// env is one gateway on a store in a schema of its own, served over real HTTP.
type env struct {
	t      testing.TB
	store  *queue.Store
	srv    *gateway.Server
	ts     *httptest.Server // nil on an instance of internal/server
	url    string           // the server's base URL
	client *http.Client
	p      *poller.Poller
}

// newEnv starts a gateway; cfg may adjust the Config (Store is set already).
func newEnv(t testing.TB, cfg ...func(*gateway.Config)) *env {
	t.Helper()
	return newEnvPolling(t, nil, cfg...)
}

// newEnvPolling is newEnv with a poller configured by pcfg (nil: defaults).
func newEnvPolling(t testing.TB, pcfg func(*poller.Config), cfg ...func(*gateway.Config)) *env {
	t.Helper()
	// The store tells the gateway of what its pops give up on, as
	// internal/server wires them (queue.Config.OnGivenUp).
	var gw atomic.Pointer[gateway.Server]
	store := queuetest.NewStoreWith(t, pgtest.DSN(t), func(c *queue.Config) {
		c.OnGivenUp = func(res *queue.PopResult) {
			if s := gw.Load(); s != nil {
				s.CountGivenUp(res)
			}
		}
	})
	e := newEnvOn(t, store, pcfg, cfg...)
	gw.Store(e.srv)
	return e
}

// newEnvOn starts a gateway, and the poller behind its long-polls, on the
// given store. The poller stops when the test ends.
func newEnvOn(t testing.TB, store *queue.Store, pcfg func(*poller.Config), cfg ...func(*gateway.Config)) *env {
	t.Helper()
	reg := prometheus.NewRegistry() // shared by gateway and poller, as cmd/herald does
	reg.MustRegister(collectors.NewGoCollector())
	pc := poller.Config{Store: store, Registerer: reg}
	if pcfg != nil {
		pcfg(&pc)
	}
	p, err := poller.New(pc)
	require.NoError(t, err)
	t.Cleanup(p.Start())
	c := gateway.Config{Store: store, Poller: p, Registry: reg}
	for _, f := range cfg {
		f(&c)
	}
	srv, err := gateway.New(c)
	require.NoError(t, err)
	// Served as internal/server does: every connection counts against
	// Config.MaxConnections.
	ts := httptest.NewUnstartedServer(srv.Handler())
	ts.Listener = srv.Listener(ts.Listener)
	ts.Config.ConnContext = srv.ConnContext
	ts.Start()
	// Registered after pgtest's cleanups, so it runs first: no request is
	// left using the pool when it closes.
	t.Cleanup(ts.Close)
	return &env{t: t, store: store, srv: srv, ts: ts, url: ts.URL, client: ts.Client(), p: p}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// resp is a fully read HTTP answer.
type resp struct {
	status int
	header http.Header
	body   []byte
}

func (r resp) String() string { return fmt.Sprintf("%d %s", r.status, r.body) }

// do sends one request; body "" sends none.
func (e *env) do(method, path, body string) resp {
	e.t.Helper()
	return e.doCtx(ctxT(e.t), method, path, body)
}

func (e *env) doCtx(ctx context.Context, method, path, body string) resp {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, e.url+path, rd)
	require.NoError(e.t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := e.client.Do(req)
	require.NoError(e.t, err)
	defer func() { _ = res.Body.Close() }()
	b, err := io.ReadAll(res.Body)
	require.NoError(e.t, err)
	return resp{status: res.StatusCode, header: res.Header, body: b}
}

func (e *env) get(path string) resp { e.t.Helper(); return e.do(http.MethodGet, path, "") }
func (e *env) post(path string, body string) resp {
	e.t.Helper()
	return e.do(http.MethodPost, path, body)
}

// pushResult is one element of a push answer.
type pushResult struct {
	Index         int     `json:"index"`
	MessageID     string  `json:"message_id"`
	PartitionID   string  `json:"partition_id"`
	QueueName     string  `json:"queueName"`
	Status        string  `json:"status"`
	TraceID       *string `json:"trace_id"`
	TransactionID string  `json:"transaction_id"`
}

// pushItems pushes a raw items array and expects 201.
func (e *env) pushItems(items string) []pushResult {
	e.t.Helper()
	r := e.post("/api/v1/push", `{"items":`+items+`}`)
	require.Equal(e.t, http.StatusCreated, r.status, "push: %s", r)
	var out []pushResult
	require.NoError(e.t, json.Unmarshal(r.body, &out))
	return out
}

// push pushes raw JSON payloads to a queue's Default partition.
func (e *env) push(q string, payloads ...string) []pushResult {
	e.t.Helper()
	items := make([]string, len(payloads))
	for i, p := range payloads {
		items[i] = fmt.Sprintf(`{"queue":%q,"payload":%s}`, q, p)
	}
	return e.pushItems("[" + strings.Join(items, ",") + "]")
}

// message is one popped message.
type message struct {
	ConsumerGroup string          `json:"consumerGroup"`
	CreatedAt     string          `json:"createdAt"`
	Data          json.RawMessage `json:"data"`
	ID            string          `json:"id"`
	LeaseID       string          `json:"leaseId"`
	Partition     string          `json:"partition"`
	PartitionID   string          `json:"partitionId"`
	ProducerSub   *string         `json:"producerSub"`
	Queue         string          `json:"queue"`
	RetryCount    int             `json:"retryCount"`
	TraceID       *string         `json:"traceId"`
	TransactionID string          `json:"transactionId"`
}

// popResult is a 200 pop answer.
type popResult struct {
	ConsumerGroup     string    `json:"consumerGroup"`
	LeaseID           string    `json:"leaseId"`
	Messages          []message `json:"messages"`
	Partition         string    `json:"partition"`
	PartitionID       string    `json:"partitionId"`
	PartitionsClaimed int       `json:"partitionsClaimed"`
	Queue             string    `json:"queue"`
	Success           bool      `json:"success"`
}

// pop GETs a pop path and expects 200.
func (e *env) pop(path string) popResult {
	e.t.Helper()
	r := e.get(path)
	require.Equal(e.t, http.StatusOK, r.status, "pop %s: %s", path, r)
	var out popResult
	require.NoError(e.t, json.Unmarshal(r.body, &out))
	return out
}

// popEmpty GETs a pop path and expects 204 with no body.
func (e *env) popEmpty(path string) {
	e.t.Helper()
	r := e.get(path)
	require.Equal(e.t, http.StatusNoContent, r.status, "pop %s: %s", path, r)
	assert.Empty(e.t, r.body)
}

// ackResult is one element of an ack answer.
type ackResult struct {
	DLQ           bool    `json:"dlq"`
	Error         *string `json:"error"`
	Index         int     `json:"index"`
	LeaseReleased bool    `json:"leaseReleased"`
	PartitionName *string `json:"partitionName"`
	QueueName     *string `json:"queueName"`
	Success       bool    `json:"success"`
	TransactionID string  `json:"transactionId"`
}

// ack acknowledges one message and expects 200 with one result.
func (e *env) ack(m message, status, errText string) ackResult {
	e.t.Helper()
	body, err := json.Marshal(map[string]string{"transactionId": m.TransactionID, "partitionId": m.PartitionID,
		"leaseId": m.LeaseID, "status": status, "error": errText, "consumerGroup": m.ConsumerGroup})
	require.NoError(e.t, err)
	r := e.post("/api/v1/ack", string(body))
	require.Equal(e.t, http.StatusOK, r.status, "ack: %s", r)
	var out []ackResult
	require.NoError(e.t, json.Unmarshal(r.body, &out))
	require.Len(e.t, out, 1)
	return out[0]
}

// exec runs SQL in the store's schema; tests use it to move time (expire a
// lease) instead of sleeping.
func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	_, err := e.store.Pool().Exec(ctxT(e.t), sql, args...)
	require.NoError(e.t, err)
}

// keys returns the keys of a JSON object in the order they appear.
func keys(t testing.TB, raw []byte) []string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	require.NoError(t, err)
	require.Equal(t, json.Delim('{'), tok, "not an object: %s", raw)
	var out []string
	for dec.More() {
		tok, err := dec.Token()
		require.NoError(t, err)
		out = append(out, tok.(string))
		var skip json.RawMessage
		require.NoError(t, dec.Decode(&skip))
	}
	return out
}

// object decodes a JSON object keeping its values raw.
func object(t testing.TB, raw []byte) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(raw, &m), "%s", raw)
	return m
}

// array decodes a JSON array keeping its elements raw.
func array(t testing.TB, raw []byte) []json.RawMessage {
	t.Helper()
	var a []json.RawMessage
	require.NoError(t, json.Unmarshal(raw, &a), "%s", raw)
	return a
}

// assertError checks a {"error": msg} answer byte for byte.
func assertError(t testing.TB, r resp, status int, msg string) {
	t.Helper()
	want, err := json.Marshal(map[string]string{"error": msg})
	require.NoError(t, err)
	assert.Equal(t, status, r.status, "%s", r)
	assert.Equal(t, string(want), string(r.body))
	assert.Equal(t, "application/json", r.header.Get("Content-Type"))
}

// eventually waits up to 10 s for cond, polling it.
func eventually(t testing.TB, cond func() bool, msg string) {
	t.Helper()
	require.Eventually(t, cond, 10*time.Second, 5*time.Millisecond, msg)
}
