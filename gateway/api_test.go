package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/gateway"
	"github.com/heraldmq/herald/queue"
)

var (
	microRE = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$`)
	milliRE = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$`)
	uuidRE  = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
)

// Key orders of the reference server (sorted), plus Herald's additions where
// API.md lists them.
var (
	pushQueuedKeys    = []string{"index", "message_id", "partition_id", "queueName", "status", "trace_id", "transaction_id"}
	pushDuplicateKeys = []string{"index", "message_id", "queueName", "status", "transaction_id"}
	popKeys           = []string{"consumerGroup", "leaseId", "messages", "partition", "partitionId", "partitionsClaimed", "queue", "success"}
	messageKeys       = []string{"consumerGroup", "createdAt", "data", "id", "leaseId", "partition", "partitionId", "producerSub",
		"queue", "retryCount", "traceId", "transactionId"}
	ackKeys    = []string{"dlq", "error", "index", "leaseReleased", "partitionName", "queueName", "success", "transactionId"}
	extendKeys = []string{"error", "expiresAt", "index", "leaseId", "success"}
)

func TestPush_Shapes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)

	// Example 9: one item, raw bytes equal the reference's after substituting ids.
	r := e.post("/api/v1/push", `{"items":[{"queue":"golden-push","payload":{"orderId":1,"amount":9.5}}]}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r)
	assert.Equal(t, "application/json", r.header.Get("Content-Type"))
	var res []pushResult
	require.NoError(t, json.Unmarshal(r.body, &res))
	require.Len(t, res, 1)
	assert.Regexp(t, uuidRE, res[0].MessageID)
	assert.Regexp(t, uuidRE, res[0].PartitionID)
	assert.Regexp(t, uuidRE, res[0].TransactionID, "the server makes a transaction id")
	assert.Equal(t, fmt.Sprintf(`[{"index":0,"message_id":%q,"partition_id":%q,"queueName":"golden-push","status":"queued",`+
		`"trace_id":null,"transaction_id":%q}]`, res[0].MessageID, res[0].PartitionID, res[0].TransactionID), string(r.body))

	// Example 10: three items, in item order, same partition.
	three := e.push("golden-push", `{"n":1}`, `{"n":2}`, `{"n":3}`)
	require.Len(t, three, 3)
	for i, p := range three {
		assert.Equal(t, i, p.Index)
		assert.Equal(t, "queued", p.Status)
		assert.Equal(t, res[0].PartitionID, p.PartitionID)
	}
	assert.NotEqual(t, three[0].MessageID, three[1].MessageID)

	// Examples 11, 12: explicit transaction id, then its duplicate.
	first := e.post("/api/v1/push", `{"items":[{"queue":"golden-push","transactionId":"golden-tx-dup-0001","payload":{"first":true}}]}`)
	require.Equal(t, http.StatusCreated, first.status, "%s", first)
	a := array(t, first.body)
	require.Len(t, a, 1)
	assert.Equal(t, pushQueuedKeys, keys(t, a[0]))
	var orig pushResult
	require.NoError(t, json.Unmarshal(a[0], &orig))
	assert.Equal(t, "golden-tx-dup-0001", orig.TransactionID)

	dup := e.post("/api/v1/push", `{"items":[{"queue":"golden-push","transactionId":"golden-tx-dup-0001","payload":{"first":false}}]}`)
	require.Equal(t, http.StatusCreated, dup.status, "%s", dup)
	a = array(t, dup.body)
	require.Len(t, a, 1)
	assert.Equal(t, pushDuplicateKeys, keys(t, a[0]), "a duplicate has no partition_id and no trace_id")
	assert.Equal(t, fmt.Sprintf(`[{"index":0,"message_id":%q,"queueName":"golden-push","status":"duplicate",`+
		`"transaction_id":"golden-tx-dup-0001"}]`, orig.MessageID), string(dup.body))

	// A duplicate within one request, between two new items.
	mixed := e.pushItems(`[{"queue":"golden-push","transactionId":"m-1"},{"queue":"golden-push","transactionId":"golden-tx-dup-0001"},` +
		`{"queue":"golden-push","transactionId":"m-1"}]`)
	require.Len(t, mixed, 3)
	assert.Equal(t, []string{"queued", "duplicate", "duplicate"}, []string{mixed[0].Status, mixed[1].Status, mixed[2].Status})
	assert.Equal(t, orig.MessageID, mixed[1].MessageID)
	assert.Equal(t, mixed[0].MessageID, mixed[2].MessageID)
	assert.Equal(t, []int{0, 1, 2}, []int{mixed[0].Index, mixed[1].Index, mixed[2].Index})

	// Example 16: traceId is echoed as trace_id.
	traced := e.pushItems(`[{"queue":"golden-push","traceId":"8f3c1e2a-0000-4000-8000-000000000001","payload":{"traced":true}}]`)
	require.NotNil(t, traced[0].TraceID)
	assert.Equal(t, "8f3c1e2a-0000-4000-8000-000000000001", *traced[0].TraceID)

	// Example 15: a named partition gets a partition of its own.
	named := e.pushItems(`[{"queue":"golden-push","partition":"customer-42","payload":{"hello":"partition"}}]`)
	assert.NotEqual(t, res[0].PartitionID, named[0].PartitionID)

	// Example 20: an empty items array is 201 [].
	empty := e.post("/api/v1/push", `{"items":[]}`)
	assert.Equal(t, http.StatusCreated, empty.status)
	assert.Equal(t, "[]", string(empty.body))
}

func TestPush_PayloadKinds(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.pushItems(`[{"queue":"p","payload":null},{"queue":"p"},{"queue":"p","payload":"text"},{"queue":"p","payload":[1,2]},` +
		`{"queue":"p","payload":0},{"queue":"p","payload":false}]`)
	got := e.pop("/api/v1/pop/queue/p?batch=10&wait=false")
	require.Len(t, got.Messages, 6)
	var data []string
	for _, m := range got.Messages {
		data = append(data, string(m.Data))
	}
	// null is kept; an absent payload is {} (API.md).
	assert.Equal(t, []string{`null`, `{}`, `"text"`, `[1,2]`, `0`, `false`}, data)
}

// TestPush_LargePayloadRoundTrip pushes a 1 MiB payload with the default body
// limit and checks that pop returns its bytes unchanged. The payload is in the
// form PostgreSQL's jsonb prints (compact, shorter keys first), and holds
// characters an encoder may be tempted to escape.
func TestPush_LargePayloadRoundTrip(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var sb strings.Builder
	const chunk = `abc <b>&amp;</b> é 日本 😀 \"quoted\" back\\slash \n\t 0123456789 ` + "\u2028\u2029 "
	for sb.Len() < 1<<20 {
		sb.WriteString(chunk)
	}
	payload := `{"n":1,"blob":"` + sb.String() + `"}`
	require.Greater(t, len(payload), 1<<20)
	require.True(t, json.Valid([]byte(payload)))

	res := e.push("big", payload)
	require.Len(t, res, 1)
	r := e.get("/api/v1/pop/queue/big?wait=false")
	require.Equal(t, http.StatusOK, r.status)
	var got popResult
	require.NoError(t, json.Unmarshal(r.body, &got))
	require.Len(t, got.Messages, 1)
	assert.Equal(t, res[0].MessageID, got.Messages[0].ID)
	assert.JSONEq(t, payload, string(got.Messages[0].Data))
	assert.True(t, string(got.Messages[0].Data) == payload, "payload bytes changed on the way (len %d → %d)",
		len(payload), len(got.Messages[0].Data))
}

func TestPop_Shape(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	before := time.Now()
	pushed := e.pushItems(`[{"queue":"shape","transactionId":"tx-a","traceId":"8f3c1e2a-0000-4000-8000-000000000001",` +
		`"payload":{"amount":9.5,"orderId":1}},{"queue":"shape","payload":{"n":2}}]`)

	r := e.get("/api/v1/pop/queue/shape?batch=2&wait=false")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Equal(t, "application/json", r.header.Get("Content-Type"))
	assert.Equal(t, popKeys, keys(t, r.body))
	top := object(t, r.body)
	msgs := array(t, top["messages"])
	require.Len(t, msgs, 2)
	for _, m := range msgs {
		assert.Equal(t, messageKeys, keys(t, m))
	}

	var got popResult
	require.NoError(t, json.Unmarshal(r.body, &got))
	assert.True(t, got.Success)
	assert.Equal(t, "shape", got.Queue)
	assert.Equal(t, "Default", got.Partition)
	assert.Equal(t, pushed[0].PartitionID, got.PartitionID)
	assert.Equal(t, queue.DefaultGroup, got.ConsumerGroup)
	assert.Equal(t, 1, got.PartitionsClaimed)
	assert.Regexp(t, uuidRE, got.LeaseID)

	m := got.Messages[0]
	assert.Equal(t, pushed[0].MessageID, m.ID)
	assert.Equal(t, "tx-a", m.TransactionID)
	require.NotNil(t, m.TraceID)
	assert.Equal(t, "8f3c1e2a-0000-4000-8000-000000000001", *m.TraceID)
	assert.JSONEq(t, `{"amount":9.5,"orderId":1}`, string(m.Data))
	assert.Nil(t, m.ProducerSub)
	assert.Equal(t, got.LeaseID, m.LeaseID)
	assert.Equal(t, "Default", m.Partition)
	assert.Equal(t, pushed[0].PartitionID, m.PartitionID)
	assert.Equal(t, "shape", m.Queue)
	assert.Equal(t, queue.DefaultGroup, m.ConsumerGroup)
	assert.Equal(t, 0, m.RetryCount)
	assert.Regexp(t, microRE, m.CreatedAt, "RFC3339 with exactly 6 fractional digits and Z")
	created, err := time.Parse(time.RFC3339Nano, m.CreatedAt)
	require.NoError(t, err)
	assert.WithinDuration(t, before, created, time.Minute)
	assert.Nil(t, got.Messages[1].TraceID)
	assert.Equal(t, pushed[1].TransactionID, got.Messages[1].TransactionID)

	// Raw traceId null and producerSub null, as the reference writes them.
	assert.Contains(t, string(msgs[1]), `"producerSub":null`)
	assert.Contains(t, string(msgs[1]), `"traceId":null`)

	// The partition is leased: the next pop finds nothing, at once.
	start := time.Now()
	e.popEmpty("/api/v1/pop/queue/shape?wait=false")
	assert.Less(t, time.Since(start), 5*time.Second)
	// wait=0 is wait=false; a queue that never existed is just empty.
	e.popEmpty("/api/v1/pop/queue/shape?wait=0")
	e.popEmpty("/api/v1/pop/queue/never-created?wait=false")
	e.popEmpty("/api/v1/pop/queue/never-created")
}

func TestPop_BatchPartitionAndRetry(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.push("b", `{"i":1}`, `{"i":2}`, `{"i":3}`)
	e.pushItems(`[{"queue":"b","partition":"p2","payload":{"p":2}}]`)

	// Example 34: a specific partition.
	p2 := e.pop("/api/v1/pop/queue/b/partition/p2?wait=false")
	require.Len(t, p2.Messages, 1)
	assert.Equal(t, "p2", p2.Partition)
	assert.Equal(t, "p2", p2.Messages[0].Partition)
	assert.JSONEq(t, `{"p":2}`, string(p2.Messages[0].Data))
	e.popEmpty("/api/v1/pop/queue/b/partition/p2?wait=false")
	e.popEmpty("/api/v1/pop/queue/b/partition/nope?wait=false")

	// Example 32: batch=2 of 3.
	two := e.pop("/api/v1/pop/queue/b/partition/Default?batch=2&wait=false")
	require.Len(t, two.Messages, 2)
	assert.JSONEq(t, `{"i":1}`, string(two.Messages[0].Data))
	assert.JSONEq(t, `{"i":2}`, string(two.Messages[1].Data))

	// Examples 43, 48, 49: complete the first, fail the second; the failed
	// one comes back with the third, its retryCount raised.
	done := e.ack(two.Messages[0], "completed", "")
	assert.True(t, done.Success)
	assert.False(t, done.LeaseReleased)
	failed := e.ack(two.Messages[1], "failed", "processing blew up")
	assert.True(t, failed.Success)
	assert.True(t, failed.LeaseReleased)
	assert.False(t, failed.DLQ)

	again := e.pop("/api/v1/pop/queue/b?batch=5&wait=false")
	require.Len(t, again.Messages, 2)
	assert.Equal(t, two.Messages[1].ID, again.Messages[0].ID)
	assert.Equal(t, 1, again.Messages[0].RetryCount)
	assert.Equal(t, 0, again.Messages[1].RetryCount)
	assert.JSONEq(t, `{"i":3}`, string(again.Messages[1].Data))
	assert.NotEqual(t, two.LeaseID, again.LeaseID)
}

// TestPop_MultiPartition: a wildcard pop may claim several partitions under
// one lease; extending it and acking work across them.
func TestPop_MultiPartition(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.pushItems(`[{"queue":"mp","partition":"p1","payload":{"p":1}},{"queue":"mp","partition":"p2","payload":{"p":2}},` +
		`{"queue":"mp","partition":"p3","payload":{"p":3}}]`)
	got := e.pop("/api/v1/pop/queue/mp?partitions=2&batch=10&wait=false")
	require.Len(t, got.Messages, 2)
	assert.Equal(t, 2, got.PartitionsClaimed)
	assert.NotEqual(t, got.Messages[0].PartitionID, got.Messages[1].PartitionID)
	assert.Contains(t, []string{got.Messages[0].PartitionID, got.Messages[1].PartitionID}, got.PartitionID)
	for _, m := range got.Messages {
		assert.Equal(t, got.LeaseID, m.LeaseID)
	}

	r := e.post("/api/v1/lease/"+got.LeaseID+"/extend", `{"seconds":60}`)
	require.Equal(t, http.StatusOK, r.status)
	assert.JSONEq(t, `true`, string(object(t, array(t, r.body)[0])["success"]))
	var left int
	require.NoError(t, e.store.Pool().QueryRow(ctxT(t), `SELECT count(*) FROM consumers WHERE lease_id = $1::uuid
		AND lease_expires_at BETWEEN now() + interval '50 seconds' AND now() + interval '70 seconds'`, got.LeaseID).Scan(&left))
	assert.Equal(t, 2, left, "both partitions' leases extended")

	for _, m := range got.Messages {
		a := e.ack(m, "completed", "")
		assert.True(t, a.Success)
		assert.True(t, a.LeaseReleased)
	}
	last := e.pop("/api/v1/pop/queue/mp?partitions=2&batch=10&wait=false")
	require.Len(t, last.Messages, 1)
	assert.JSONEq(t, `{"p":3}`, string(last.Messages[0].Data))
	assert.Equal(t, 1, last.PartitionsClaimed)
}

func TestPop_AutoAck(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.push("auto", `{"auto":true}`)
	r := e.get("/api/v1/pop/queue/auto?autoAck=true&wait=false")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	top := object(t, r.body)
	assert.JSONEq(t, `""`, string(top["leaseId"]), "autoAck: top-level leaseId is empty, not null")
	msgs := array(t, top["messages"])
	require.Len(t, msgs, 1)
	assert.JSONEq(t, `""`, string(object(t, msgs[0])["leaseId"]))
	// Example 37: drained.
	e.popEmpty("/api/v1/pop/queue/auto?autoAck=true&wait=false")
	e.popEmpty("/api/v1/pop/queue/auto?wait=false")
}

func TestPop_ConsumerGroups(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.push("cg", `{"old":true}`)
	// Example 39: a new group in "new" mode skips what is already there.
	// Herald answers that empty pop 204 like any other.
	e.popEmpty("/api/v1/pop/queue/cg?consumerGroup=g1&subscriptionMode=new&wait=false")
	e.push("cg", `{"new":true}`)
	g1 := e.pop("/api/v1/pop/queue/cg?consumerGroup=g1&subscriptionMode=new&wait=false")
	require.Len(t, g1.Messages, 1)
	assert.JSONEq(t, `{"new":true}`, string(g1.Messages[0].Data))
	assert.Equal(t, "g1", g1.ConsumerGroup)
	assert.Equal(t, "g1", g1.Messages[0].ConsumerGroup)
	// Example 42: queue mode sees both.
	qm := e.pop("/api/v1/pop/queue/cg?batch=10&wait=false")
	assert.Len(t, qm.Messages, 2)
	// subscriptionFrom=now is like "new"; an RFC3339 instant in the past sees both.
	e.popEmpty("/api/v1/pop/queue/cg?consumerGroup=g3&subscriptionFrom=now&wait=false")
	past := e.pop("/api/v1/pop/queue/cg?batch=10&consumerGroup=g4&subscriptionFrom=2000-01-01T00:00:00Z&wait=false")
	assert.Len(t, past.Messages, 2)
	// A group in "all" mode sees both too.
	all := e.pop("/api/v1/pop/queue/cg?batch=10&consumerGroup=g2&subscriptionMode=all&wait=false")
	assert.Len(t, all.Messages, 2)

	// Acks name their group; the batch's top-level group overrides the items'.
	body := fmt.Sprintf(`{"consumerGroup":"g1","acknowledgments":[{"transactionId":%q,"partitionId":%q,"leaseId":%q}]}`,
		g1.Messages[0].TransactionID, g1.Messages[0].PartitionID, g1.LeaseID)
	r := e.post("/api/v1/ack/batch", body)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	var acks []ackResult
	require.NoError(t, json.Unmarshal(r.body, &acks))
	require.Len(t, acks, 1)
	assert.True(t, acks[0].Success, "%s", r)
	assert.True(t, acks[0].LeaseReleased)
}

func TestPop_Namespace(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.post("/api/v1/configure", `{"queue":"ns-q","namespace":"billing","task":"invoices"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	e.push("ns-q", `{"via":"configure"}`)
	// A dotted name gets its namespace and task from the name.
	e.push("billing.refunds.eu", `{"via":"name"}`)
	e.push("other", `{"via":"other"}`)

	inv := e.pop("/api/v1/pop?namespace=billing&task=invoices&wait=false")
	require.Len(t, inv.Messages, 1)
	assert.Equal(t, "ns-q", inv.Queue)
	assert.Equal(t, "ns-q", inv.Messages[0].Queue)
	e.popEmpty("/api/v1/pop?namespace=billing&task=invoices&wait=false")

	ref := e.pop("/api/v1/pop?namespace=billing&wait=false")
	require.Len(t, ref.Messages, 1)
	assert.Equal(t, "billing.refunds.eu", ref.Queue)
	assert.JSONEq(t, `{"via":"name"}`, string(ref.Messages[0].Data))
	e.popEmpty("/api/v1/pop?namespace=billing&wait=false")
	e.popEmpty("/api/v1/pop?namespace=nobody&wait=false")
}

// TestPop_LongPollTimeout: an empty long-poll answers 204 with no body once
// its timeout has passed, not before.
func TestPop_LongPollTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	start := time.Now()
	r := e.get("/api/v1/pop/queue/lp-empty?wait=true&timeout=300")
	elapsed := time.Since(start)
	assert.Equal(t, http.StatusNoContent, r.status, "%s", r)
	assert.Empty(t, r.body)
	assert.GreaterOrEqual(t, elapsed, 250*time.Millisecond)
	assert.Less(t, elapsed, 5*time.Second)

	// wait=1 is wait=true.
	start = time.Now()
	r = e.get("/api/v1/pop/queue/lp-empty?wait=1&timeout=300")
	assert.Equal(t, http.StatusNoContent, r.status, "%s", r)
	assert.GreaterOrEqual(t, time.Since(start), 250*time.Millisecond)
}

// waitingPop starts a long-poll in a goroutine and returns once ready (an SQL
// boolean) holds: the long-poll's first pop has run. A push made after that
// can only reach it through the wake-up.
func (e *env) waitingPop(path, ready string, args ...any) <-chan resp {
	e.t.Helper()
	ctx := ctxT(e.t)
	out := make(chan resp, 1)
	go func() {
		defer close(out)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.ts.URL+path, nil)
		if err != nil {
			return
		}
		res, err := e.ts.Client().Do(req)
		if err != nil {
			return
		}
		defer func() { _ = res.Body.Close() }()
		b, _ := io.ReadAll(res.Body)
		out <- resp{status: res.StatusCode, header: res.Header, body: b}
	}()
	eventually(e.t, func() bool {
		var ok bool
		err := e.store.Pool().QueryRow(ctx, ready, args...).Scan(&ok)
		return err == nil && ok
	}, "the long-poll never ran its first pop")
	return out
}

// groupExists is true once a pop has registered the consumer group $1.
const groupExists = `SELECT EXISTS (SELECT 1 FROM consumer_groups WHERE name = $1)`

// receive waits for a long-poll's answer and expects one message.
func receive(t *testing.T, got <-chan resp, wantID string) {
	t.Helper()
	var r resp
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("long-poll did not return")
	}
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	var p popResult
	require.NoError(t, json.Unmarshal(r.body, &p))
	require.Len(t, p.Messages, 1)
	if wantID != "" {
		assert.Equal(t, wantID, p.Messages[0].ID)
	}
}

// TestPop_LongPollWakesOnPush: a waiting pop returns as soon as a message is
// pushed. The re-check tick is set far beyond the test, so only the wake-up
// can return it before its 10 s timeout.
func TestPop_LongPollWakesOnPush(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *gateway.Config) { c.LongPollInterval = time.Hour })
	for _, body := range []string{`{"queue":"lp"}`, `{"queue":"lp-ns","namespace":"wake"}`, `{"queue":"lp-retry"}`} {
		r := e.post("/api/v1/configure", body)
		require.Equal(t, http.StatusOK, r.status, "%s", r)
	}

	t.Run("Queue", func(t *testing.T) {
		start := time.Now()
		got := e.waitingPop("/api/v1/pop/queue/lp?wait=true&timeout=10000&consumerGroup=w1", groupExists, "w1")
		pushed := e.push("lp", `{"wake":1}`)
		receive(t, got, pushed[0].MessageID)
		assert.Less(t, time.Since(start), 5*time.Second, "returned at the timeout, not at the push")
	})
	t.Run("Partition", func(t *testing.T) {
		start := time.Now()
		// "new" mode: the message the Queue case left is not w2's.
		got := e.waitingPop("/api/v1/pop/queue/lp/partition/Default?wait=true&timeout=10000&consumerGroup=w2&subscriptionMode=new",
			groupExists, "w2")
		pushed := e.push("lp", `{"wake":2}`)
		receive(t, got, pushed[0].MessageID)
		assert.Less(t, time.Since(start), 5*time.Second)
	})
	t.Run("Namespace", func(t *testing.T) {
		start := time.Now()
		got := e.waitingPop("/api/v1/pop?namespace=wake&wait=true&timeout=10000&consumerGroup=w3", groupExists, "w3")
		pushed := e.push("lp-ns", `{"wake":"ns"}`)
		receive(t, got, pushed[0].MessageID)
		assert.Less(t, time.Since(start), 5*time.Second)
	})
	t.Run("Transaction", func(t *testing.T) {
		start := time.Now()
		got := e.waitingPop("/api/v1/pop/queue/lp-ns?wait=true&timeout=10000&consumerGroup=w4&subscriptionMode=new", groupExists, "w4")
		r := e.post("/api/v1/transaction", `{"operations":[{"type":"push","items":[{"queue":"lp-ns","payload":{"tx":1}}]}]}`)
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		var res struct {
			Results []struct {
				MessageID string `json:"messageId"`
			} `json:"results"`
		}
		require.NoError(t, json.Unmarshal(r.body, &res))
		require.Len(t, res.Results, 1)
		receive(t, got, res.Results[0].MessageID)
		assert.Less(t, time.Since(start), 5*time.Second)
	})
	t.Run("RetryAck", func(t *testing.T) {
		// A message released by a retry ack is work again for a waiting
		// consumer of the same group. The first pop leases partition a; the
		// long-poll's first pop then registers the group on the (empty)
		// Default partition, which is how we know it is waiting.
		e.pushItems(`[{"queue":"lp-retry","partition":"a","payload":{"retry":1}}]`)
		first := e.pop("/api/v1/pop/queue/lp-retry/partition/a?consumerGroup=w5&wait=false")
		require.Len(t, first.Messages, 1)
		start := time.Now()
		got := e.waitingPop("/api/v1/pop/queue/lp-retry?wait=true&timeout=10000&consumerGroup=w5", `SELECT EXISTS (
			SELECT 1 FROM consumers c JOIN partitions p ON p.id = c.partition_id JOIN queues q ON q.id = p.queue_id
			WHERE q.name = 'lp-retry' AND p.name = 'Default' AND c.consumer_group = 'w5')`)
		a := e.ack(first.Messages[0], "retry", "")
		require.True(t, a.Success)
		require.True(t, a.LeaseReleased)
		receive(t, got, first.Messages[0].ID)
		assert.Less(t, time.Since(start), 5*time.Second)
	})
}

// TestPop_LongPollClientGone: a long-poll whose client disconnects ends at
// once, so the server can shut down without waiting for its timeout.
func TestPop_LongPollClientGone(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *gateway.Config) { c.LongPollInterval = time.Hour })
	r := e.post("/api/v1/configure", `{"queue":"gone"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet,
			e.ts.URL+"/api/v1/pop/queue/gone?wait=true&timeout=300000&consumerGroup=gone", nil)
		if err != nil {
			done <- err
			return
		}
		res, err := e.ts.Client().Do(req)
		if err == nil {
			_ = res.Body.Close()
		}
		done <- err
	}()
	eventually(t, func() bool {
		var ok bool
		err := e.store.Pool().QueryRow(ctx, groupExists, "gone").Scan(&ok)
		return err == nil && ok
	}, "the long-poll never ran its first pop")
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)

	start := time.Now()
	e.ts.Close() // waits for outstanding requests
	assert.Less(t, time.Since(start), 5*time.Second)
}

// TestPop_Drain: Drain answers waiting long-polls 204 at once, and later
// long-polls do not wait; messages are still delivered.
func TestPop_Drain(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *gateway.Config) { c.LongPollInterval = time.Hour })
	r := e.post("/api/v1/configure", `{"queue":"drain"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	start := time.Now()
	got := e.waitingPop("/api/v1/pop/queue/drain?wait=true&timeout=60000&consumerGroup=d1", groupExists, "d1")
	e.srv.Drain()
	e.srv.Drain() // twice is fine
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("Drain did not end the long-poll")
	}
	assert.Equal(t, http.StatusNoContent, r.status, "%s", r)
	assert.Empty(t, r.body)
	assert.Less(t, time.Since(start), 5*time.Second)

	start = time.Now()
	e.popEmpty("/api/v1/pop/queue/drain?wait=true&timeout=60000")
	assert.Less(t, time.Since(start), 5*time.Second)
	pushed := e.push("drain", `{"d":1}`)
	got2 := e.pop("/api/v1/pop/queue/drain?wait=true&timeout=60000")
	require.Len(t, got2.Messages, 1)
	assert.Equal(t, pushed[0].MessageID, got2.Messages[0].ID)
}

// TestPop_LongPollConcurrent: several consumers wait on one queue with one
// partition per consumer; every pushed message is delivered exactly once.
func TestPop_LongPollConcurrent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *gateway.Config) { c.LongPollInterval = 50 * time.Millisecond })
	const n = 4
	var wg sync.WaitGroup
	results := make(chan resp, n)
	for range n {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctxT(t), http.MethodGet,
				e.ts.URL+"/api/v1/pop/queue/many?wait=true&timeout=10000&batch=10", nil)
			if !assert.NoError(t, err) {
				return
			}
			res, err := e.ts.Client().Do(req)
			if !assert.NoError(t, err) {
				return
			}
			defer func() { _ = res.Body.Close() }()
			var p json.RawMessage
			if res.StatusCode == http.StatusOK {
				assert.NoError(t, json.NewDecoder(res.Body).Decode(&p))
			}
			results <- resp{status: res.StatusCode, body: p}
		})
	}
	items := make([]string, n)
	for i := range n {
		items[i] = fmt.Sprintf(`{"queue":"many","partition":"p%d","payload":{"i":%d}}`, i, i)
	}
	e.pushItems("[" + strings.Join(items, ",") + "]")
	wg.Wait()
	close(results)
	seen := map[string]bool{}
	for r := range results {
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		var p popResult
		require.NoError(t, json.Unmarshal(r.body, &p))
		for _, m := range p.Messages {
			assert.False(t, seen[m.ID], "delivered twice: %s", m.ID)
			seen[m.ID] = true
		}
	}
	assert.Len(t, seen, n)
}

func TestAck_Shapes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.push("ack", `{"k":1}`, `{"k":2}`, `{"k":3}`)
	got := e.pop("/api/v1/pop/queue/ack?batch=2&wait=false")
	require.Len(t, got.Messages, 2)
	m0, m1 := got.Messages[0], got.Messages[1]

	// Example 44: a wrong lease is 200 with success:false.
	r := e.post("/api/v1/ack", fmt.Sprintf(`{"transactionId":%q,"partitionId":%q,"leaseId":"00000000-0000-0000-0000-000000000000","status":"completed"}`,
		m0.TransactionID, m0.PartitionID))
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Equal(t, fmt.Sprintf(`[{"dlq":false,"error":"Invalid or expired lease","index":0,"leaseReleased":false,`+
		`"partitionName":"Default","queueName":"ack","success":false,"transactionId":%q}]`, m0.TransactionID), string(r.body))

	// Example 43: a valid ack, byte for byte.
	r = e.post("/api/v1/ack", fmt.Sprintf(`{"transactionId":%q,"partitionId":%q,"leaseId":%q,"status":"completed"}`,
		m0.TransactionID, m0.PartitionID, got.LeaseID))
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Equal(t, "application/json", r.header.Get("Content-Type"))
	assert.Equal(t, fmt.Sprintf(`[{"dlq":false,"error":null,"index":0,"leaseReleased":false,"partitionName":"Default",`+
		`"queueName":"ack","success":true,"transactionId":%q}]`, m0.TransactionID), string(r.body))
	assert.Equal(t, ackKeys, keys(t, array(t, r.body)[0]))

	// Acks are idempotent.
	again := e.ack(m0, "completed", "")
	assert.True(t, again.Success)

	// Example 47: an unknown transaction id in a known partition.
	r = e.post("/api/v1/ack", fmt.Sprintf(`{"transactionId":"does-not-exist","partitionId":%q,"status":"completed"}`, m0.PartitionID))
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Equal(t, `[{"dlq":false,"error":"Message not found","index":0,"leaseReleased":false,"partitionName":"Default",`+
		`"queueName":"ack","success":false,"transactionId":"does-not-exist"}]`, string(r.body))

	// An unknown (or malformed) partition: no names to report.
	for _, pid := range []string{"00000000-0000-0000-0000-000000000000", "not-a-uuid"} {
		r = e.post("/api/v1/ack", `{"transactionId":"x","partitionId":"`+pid+`"}`)
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		assert.Equal(t, `[{"dlq":false,"error":"Message not found","index":0,"leaseReleased":false,"partitionName":null,`+
			`"queueName":null,"success":false,"transactionId":"x"}]`, string(r.body))
	}

	// "success" is a synonym of completed; it releases the lease (last of the batch).
	last := e.ack(m1, "success", "")
	assert.True(t, last.Success)
	assert.True(t, last.LeaseReleased)
	assert.Nil(t, last.Error)
	require.NotNil(t, last.QueueName)
	assert.Equal(t, "ack", *last.QueueName)

	rest := e.pop("/api/v1/pop/queue/ack?batch=10&wait=false")
	require.Len(t, rest.Messages, 1)
	assert.JSONEq(t, `{"k":3}`, string(rest.Messages[0].Data))
}

func TestAck_Batch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.push("ackbatch", `{"k":1}`, `{"k":2}`)
	got := e.pop("/api/v1/pop/queue/ackbatch?batch=2&wait=false")
	require.Len(t, got.Messages, 2)
	m0, m1 := got.Messages[0], got.Messages[1]

	// Example 52: two completed; the second releases the lease.
	r := e.post("/api/v1/ack/batch", fmt.Sprintf(`{"acknowledgments":[`+
		`{"transactionId":%q,"partitionId":%q,"leaseId":%q,"status":"completed"},`+
		`{"transactionId":%q,"partitionId":%q,"leaseId":%q,"status":"completed"}]}`,
		m0.TransactionID, m0.PartitionID, got.LeaseID, m1.TransactionID, m1.PartitionID, got.LeaseID))
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Equal(t, fmt.Sprintf(`[`+
		`{"dlq":false,"error":null,"index":0,"leaseReleased":false,"partitionName":"Default","queueName":"ackbatch","success":true,"transactionId":%q},`+
		`{"dlq":false,"error":null,"index":1,"leaseReleased":true,"partitionName":"Default","queueName":"ackbatch","success":true,"transactionId":%q}]`,
		m0.TransactionID, m1.TransactionID), string(r.body))
	e.popEmpty("/api/v1/pop/queue/ackbatch?wait=false")

	// An empty batch is 200 [].
	r = e.post("/api/v1/ack/batch", `{"acknowledgments":[]}`)
	assert.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, "[]", string(r.body))

	// Mixed results keep request order and indexes.
	r = e.post("/api/v1/ack/batch", fmt.Sprintf(`{"acknowledgments":[{"transactionId":"nope","partitionId":%q},`+
		`{"transactionId":%q,"partitionId":%q}]}`, m0.PartitionID, m0.TransactionID, m0.PartitionID))
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	var res []ackResult
	require.NoError(t, json.Unmarshal(r.body, &res))
	require.Len(t, res, 2)
	assert.Equal(t, 0, res[0].Index)
	assert.False(t, res[0].Success)
	assert.Equal(t, 1, res[1].Index)
	assert.True(t, res[1].Success, "already completed: idempotent")
}

func TestLease_Extend(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.post("/api/v1/configure", `{"queue":"lease","options":{"leaseTime":120}}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	e.push("lease", `{"l":1}`)
	got := e.pop("/api/v1/pop/queue/lease?wait=false")
	require.Len(t, got.Messages, 1)

	check := func(body string, want time.Duration) {
		t.Helper()
		before := time.Now()
		r := e.post("/api/v1/lease/"+got.LeaseID+"/extend", body)
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		a := array(t, r.body)
		require.Len(t, a, 1)
		assert.Equal(t, extendKeys, keys(t, a[0]))
		var res struct {
			Error     *string `json:"error"`
			ExpiresAt string  `json:"expiresAt"`
			Index     int     `json:"index"`
			LeaseID   string  `json:"leaseId"`
			Success   bool    `json:"success"`
		}
		require.NoError(t, json.Unmarshal(a[0], &res))
		assert.True(t, res.Success, "%s", r)
		assert.Nil(t, res.Error)
		assert.Equal(t, got.LeaseID, res.LeaseID)
		assert.Regexp(t, milliRE, res.ExpiresAt)
		exp, err := time.Parse(time.RFC3339Nano, res.ExpiresAt)
		require.NoError(t, err)
		assert.WithinDuration(t, before.Add(want), exp, 10*time.Second)
	}
	// Example 57.
	check(`{"seconds":900}`, 900*time.Second)
	// No seconds: the queue's lease time.
	check(`{}`, 120*time.Second)
	check(``, 120*time.Second)
	check(`{"seconds":0}`, 120*time.Second)
	check(`{"seconds":null}`, 120*time.Second)

	// Example 58, byte for byte.
	r = e.post("/api/v1/lease/00000000-0000-0000-0000-000000000000/extend", `{"seconds":120}`)
	require.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, `[{"error":"Lease not found","expiresAt":null,"index":0,"leaseId":"00000000-0000-0000-0000-000000000000","success":false}]`,
		string(r.body))
	r = e.post("/api/v1/lease/not-a-uuid/extend", `{}`)
	require.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, `[{"error":"Lease not found","expiresAt":null,"index":0,"leaseId":"not-a-uuid","success":false}]`, string(r.body))

	// An expired lease.
	e.exec(`UPDATE consumers SET lease_expires_at = now() - interval '1 second' WHERE lease_id = $1::uuid`, got.LeaseID)
	r = e.post("/api/v1/lease/"+got.LeaseID+"/extend", `{"seconds":60}`)
	require.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, fmt.Sprintf(`[{"error":"Lease already expired","expiresAt":null,"index":0,"leaseId":%q,"success":false}]`,
		got.LeaseID), string(r.body))
}

func TestTransaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// Examples 59-64.
	src := e.push("tx-src", `{"step":1}`)
	got := e.pop("/api/v1/pop/queue/tx-src?wait=false")
	require.Len(t, got.Messages, 1)
	m := got.Messages[0]

	r := e.post("/api/v1/transaction", fmt.Sprintf(`{"operations":[`+
		`{"type":"ack","transactionId":%q,"partitionId":%q,"status":"completed"},`+
		`{"type":"push","items":[{"queue":"tx-dst","payload":{"step":2}}]}],"requiredLeases":[%q]}`,
		m.TransactionID, m.PartitionID, got.LeaseID))
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Equal(t, []string{"results", "success", "transactionId"}, keys(t, r.body), "no error key on success")
	top := object(t, r.body)
	assert.JSONEq(t, `true`, string(top["success"]))
	var txID string
	require.NoError(t, json.Unmarshal(top["transactionId"], &txID))
	assert.Regexp(t, uuidRE, txID)
	results := array(t, top["results"])
	require.Len(t, results, 2)
	assert.Equal(t, []string{"dlq", "error", "index", "success", "transactionId", "type"}, keys(t, results[0]))
	assert.JSONEq(t, fmt.Sprintf(`{"dlq":false,"error":null,"index":0,"success":true,"transactionId":%q,"type":"ack"}`,
		src[0].TransactionID), string(results[0]))
	// The reference's push result keys, plus Herald's "status" (queued or duplicate).
	assert.Equal(t, []string{"index", "messageId", "partitionId", "queueName", "status", "success", "transactionId", "type"},
		keys(t, results[1]))
	var pr struct {
		Index         int    `json:"index"`
		MessageID     string `json:"messageId"`
		PartitionID   string `json:"partitionId"`
		QueueName     string `json:"queueName"`
		Status        string `json:"status"`
		Success       bool   `json:"success"`
		TransactionID string `json:"transactionId"`
		Type          string `json:"type"`
	}
	require.NoError(t, json.Unmarshal(results[1], &pr))
	assert.Equal(t, 1, pr.Index)
	assert.Equal(t, "tx-dst", pr.QueueName)
	assert.Equal(t, "queued", pr.Status)
	assert.True(t, pr.Success)
	assert.Equal(t, "push", pr.Type)
	assert.Regexp(t, uuidRE, pr.MessageID)
	assert.Regexp(t, uuidRE, pr.PartitionID)
	assert.NotEmpty(t, pr.TransactionID)

	// The ack took effect.
	e.popEmpty("/api/v1/pop/queue/tx-src?wait=false")

	// Example 62: a failing ack rolls the whole transaction back.
	r = e.post("/api/v1/transaction", `{"operations":[`+
		`{"type":"ack","transactionId":"no-such-tx","partitionId":"00000000-0000-0000-0000-000000000000","status":"completed"},`+
		`{"type":"push","items":[{"queue":"tx-dst","payload":{"step":"should-not-exist"}}]}],"requiredLeases":[]}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Equal(t, []string{"error", "results", "success", "transactionId"}, keys(t, r.body))
	top = object(t, r.body)
	require.NoError(t, json.Unmarshal(top["transactionId"], &txID))
	assert.Equal(t, fmt.Sprintf(`{"error":"ACK operation failed: Message not found","results":[{"dlq":false,"error":"Message not found",`+
		`"index":0,"success":false,"transactionId":"no-such-tx","type":"ack"}],"success":false,"transactionId":%q}`, txID), string(r.body))

	// A push before the failing ack is rolled back too.
	r = e.post("/api/v1/transaction", `{"operations":[`+
		`{"type":"push","items":[{"queue":"tx-dst","payload":{"step":"rolled-back"}}]},`+
		`{"type":"ack","transactionId":"no-such-tx","partitionId":"00000000-0000-0000-0000-000000000000"}]}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.JSONEq(t, `false`, string(object(t, r.body)["success"]))

	// A required lease that is not live fails it before anything runs.
	r = e.post("/api/v1/transaction", `{"operations":[{"type":"push","items":[{"queue":"tx-dst","payload":{"step":"no-lease"}}]}],`+
		`"requiredLeases":["00000000-0000-0000-0000-000000000000"]}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	top = object(t, r.body)
	assert.JSONEq(t, `false`, string(top["success"]))
	assert.JSONEq(t, `"Required lease is not valid: 00000000-0000-0000-0000-000000000000"`, string(top["error"]))
	assert.JSONEq(t, `[]`, string(top["results"]))

	// Example 64: only the successful transaction's push is there.
	dst := e.pop("/api/v1/pop/queue/tx-dst?batch=10&wait=false")
	require.Len(t, dst.Messages, 1)
	assert.JSONEq(t, `{"step":2}`, string(dst.Messages[0].Data))
	assert.Equal(t, pr.MessageID, dst.Messages[0].ID)
}

// optionDefaults is the reference's resolved options object for a queue
// configured with nothing (example 5 has the same values), in its key order.
const optionDefaults = `{"completedRetentionSeconds":0,"deadLetterQueue":false,"delayedProcessing":0,"dlqAfterMaxRetries":false,` +
	`"encryptionEnabled":false,"leaseTime":300,"maxSize":0,"maxWaitTimeSeconds":0,"priority":0,"retentionEnabled":false,` +
	`"retentionSeconds":0,"retryDelay":1000,"retryLimit":3,"ttl":3600,"windowBuffer":0}`

func TestConfigure(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	type result struct {
		PartitionID string `json:"partitionId"`
		QueueID     string `json:"queueId"`
	}
	configure := func(body string) (resp, result) {
		t.Helper()
		r := e.post("/api/v1/configure", body)
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		assert.Equal(t, "application/json", r.header.Get("Content-Type"))
		var res result
		require.NoError(t, json.Unmarshal(r.body, &res))
		assert.Regexp(t, uuidRE, res.PartitionID)
		assert.Regexp(t, uuidRE, res.QueueID)
		return r, res
	}
	body := func(queue, ns, task, options string, res result) string {
		return fmt.Sprintf(`{"configured":true,"namespace":%q,"options":%s,"partitionId":%q,"queue":%q,"queueId":%q,"task":%q}`,
			ns, options, res.PartitionID, queue, res.QueueID, task)
	}

	// Examples 2, 3: no options, or {}: Herald answers the defaults.
	r, res := configure(`{"queue":"golden-plain"}`)
	assert.Equal(t, body("golden-plain", "", "", optionDefaults, res), string(r.body))
	opts := object(t, object(t, r.body)["options"])
	assert.Len(t, opts, 15)
	r, res = configure(`{"queue":"golden-plain2","options":{}}`)
	assert.Equal(t, body("golden-plain2", "", "", optionDefaults, res), string(r.body))
	r, res = configure(`{"queue":"golden-plain3","options":null}`)
	assert.Equal(t, body("golden-plain3", "", "", optionDefaults, res), string(r.body))

	// Example 5: one option.
	r, res = configure(`{"queue":"golden-min","options":{"leaseTime":300}}`)
	assert.Equal(t, body("golden-min", "", "", optionDefaults, res), string(r.body))

	// Example 6: namespace only.
	r, res = configure(`{"queue":"golden-nsonly","namespace":"ns-a"}`)
	assert.Equal(t, body("golden-nsonly", "ns-a", "", optionDefaults, res), string(r.body))

	// Example 7: namespace, task and options, byte for byte.
	r, res = configure(`{"queue":"golden-opts","namespace":"billing","task":"invoices","options":{"leaseTime":120,"retryLimit":2,` +
		`"retryDelay":5000,"maxSize":100000,"ttl":86400,"deadLetterQueue":true,"dlqAfterMaxRetries":true,"priority":7,` +
		`"delayedProcessing":0,"windowBuffer":0,"retentionSeconds":7200,"completedRetentionSeconds":600}}`)
	const opts7 = `{"completedRetentionSeconds":600,"deadLetterQueue":true,"delayedProcessing":0,"dlqAfterMaxRetries":true,` +
		`"encryptionEnabled":false,"leaseTime":120,"maxSize":100000,"maxWaitTimeSeconds":0,"priority":7,"retentionEnabled":false,` +
		`"retentionSeconds":7200,"retryDelay":5000,"retryLimit":2,"ttl":86400,"windowBuffer":0}`
	assert.Equal(t, body("golden-opts", "billing", "invoices", opts7, res), string(r.body))

	// Upsert: same ids; options left out go back to their defaults.
	r2, res2 := configure(`{"queue":"golden-opts","options":{"priority":1,"encryptionEnabled":true}}`)
	assert.Equal(t, res, res2)
	want := strings.Replace(strings.Replace(optionDefaults, `"priority":0`, `"priority":1`, 1),
		`"encryptionEnabled":false`, `"encryptionEnabled":true`, 1)
	assert.Equal(t, body("golden-opts", "", "", want, res), string(r2.body))

	// A dotted name derives namespace and task.
	r, res = configure(`{"queue":"shop.orders.eu"}`)
	assert.Equal(t, body("shop.orders.eu", "shop", "orders", optionDefaults, res), string(r.body))

	// A configured queue's Default partition is the one pushes use.
	pushed := e.push("golden-plain", `{}`)
	_, plain := configure(`{"queue":"golden-plain"}`)
	assert.Equal(t, plain.PartitionID, pushed[0].PartitionID)

	// Wrong option types are the client's fault.
	for _, bad := range []string{`{"queue":"q","options":{"leaseTime":"long"}}`, `{"queue":"q","options":[1]}`,
		`{"queue":"q","options":{"leaseTime":1.5}}`, `{"queue":"q","namespace":5}`, `{"queue":"q","task":false}`,
		`{"queue":"q","options":{"leaseTime":0}}`} {
		r := e.post("/api/v1/configure", bad)
		assert.Equal(t, http.StatusBadRequest, r.status, "%s: %s", bad, r)
		assert.Contains(t, object(t, r.body), "error")
	}
}

func TestDeleteQueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.push("golden-del", `{"x":1}`)
	// Example 71.
	r := e.do(http.MethodDelete, "/api/v1/resources/queues/golden-del", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Equal(t, `{"deleted":true,"existed":true,"queue":"golden-del"}`, string(r.body))
	assert.Equal(t, "application/json", r.header.Get("Content-Type"))
	e.popEmpty("/api/v1/pop/queue/golden-del?wait=false")
	// Example 72.
	r = e.do(http.MethodDelete, "/api/v1/resources/queues/golden-does-not-exist", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Equal(t, `{"deleted":true,"existed":false,"queue":"golden-does-not-exist"}`, string(r.body))
	r = e.do(http.MethodDelete, "/api/v1/resources/queues/golden-del", "")
	assert.Equal(t, `{"deleted":true,"existed":false,"queue":"golden-del"}`, string(r.body))

	// The queue comes back on the next push (the partition id cache was dropped).
	again := e.push("golden-del", `{"x":2}`)
	got := e.pop("/api/v1/pop/queue/golden-del?wait=false")
	require.Len(t, got.Messages, 1)
	assert.Equal(t, again[0].MessageID, got.Messages[0].ID)

	// An escaped name is the queue's name, unescaped.
	e.push("a b/c", `{}`)
	p := e.pop("/api/v1/pop/queue/a%20b%2Fc?wait=false")
	assert.Equal(t, "a b/c", p.Queue)
	r = e.do(http.MethodDelete, "/api/v1/resources/queues/a%20b%2Fc", "")
	assert.Equal(t, `{"deleted":true,"existed":true,"queue":"a b/c"}`, string(r.body))
}

func TestDLQ(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// Examples 65-69.
	r := e.post("/api/v1/configure", `{"queue":"golden-dlq","options":{"retryLimit":0,"deadLetterQueue":true}}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	e.push("golden-dlq", `{"poison":1}`, `{"poison":2}`, `{"poison":3}`)
	got := e.pop("/api/v1/pop/queue/golden-dlq?batch=3&wait=false")
	require.Len(t, got.Messages, 3)
	before := time.Now()
	for i, m := range got.Messages {
		a := e.ack(m, "failed", fmt.Sprintf("poison message %d", i+1))
		assert.True(t, a.Success)
		assert.True(t, a.DLQ, "retryLimit 0: failed goes straight to the DLQ")
	}
	// Another queue's dead letter must not show up under golden-dlq.
	e.push("other", `{"other":true}`)
	o := e.pop("/api/v1/pop/queue/other?consumerGroup=og&wait=false")
	require.Len(t, o.Messages, 1)
	assert.True(t, e.ack(o.Messages[0], "dlq", "").DLQ)

	r = e.get("/api/v1/dlq?queue=golden-dlq")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Equal(t, []string{"messages", "pagination", "total"}, keys(t, r.body))
	top := object(t, r.body)
	assert.JSONEq(t, `3`, string(top["total"]))
	assert.Equal(t, `{"limit":100,"offset":0}`, string(top["pagination"]))
	msgs := array(t, top["messages"])
	require.Len(t, msgs, 3)
	byID := map[string]message{}
	for _, m := range got.Messages {
		byID[m.ID] = m
	}
	for _, raw := range msgs {
		assert.Equal(t, []string{"consumerGroup", "createdAt", "data", "errorMessage", "failedAt", "id", "partition", "partitionId",
			"producerSub", "queue", "retryCount", "traceId", "transactionId"}, keys(t, raw))
		var d struct {
			ConsumerGroup string          `json:"consumerGroup"`
			CreatedAt     string          `json:"createdAt"`
			Data          json.RawMessage `json:"data"`
			ErrorMessage  string          `json:"errorMessage"`
			FailedAt      string          `json:"failedAt"`
			ID            string          `json:"id"`
			Partition     string          `json:"partition"`
			PartitionID   string          `json:"partitionId"`
			ProducerSub   *string         `json:"producerSub"`
			Queue         string          `json:"queue"`
			RetryCount    int             `json:"retryCount"`
			TransactionID string          `json:"transactionId"`
		}
		require.NoError(t, json.Unmarshal(raw, &d))
		m, ok := byID[d.ID]
		require.True(t, ok, "unexpected dead letter %s", raw)
		assert.Equal(t, m.TransactionID, d.TransactionID)
		assert.Equal(t, m.PartitionID, d.PartitionID)
		assert.Equal(t, "golden-dlq", d.Queue)
		assert.Equal(t, "Default", d.Partition)
		assert.Equal(t, queue.DefaultGroup, d.ConsumerGroup)
		assert.Equal(t, string(m.Data), string(d.Data))
		assert.Regexp(t, `^poison message [123]$`, d.ErrorMessage)
		assert.Equal(t, 0, d.RetryCount)
		assert.Nil(t, d.ProducerSub)
		assert.Regexp(t, milliRE, d.CreatedAt)
		assert.Regexp(t, milliRE, d.FailedAt)
		failed, err := time.Parse(time.RFC3339Nano, d.FailedAt)
		require.NoError(t, err)
		assert.WithinDuration(t, before, failed, time.Minute)
	}

	// Pagination: pages are disjoint and cover everything; total stays 3.
	seen := map[string]bool{}
	for _, page := range []struct {
		query string
		n     int
	}{{"limit=2&offset=0", 2}, {"limit=2&offset=2", 1}, {"limit=2&offset=4", 0}} {
		r := e.get("/api/v1/dlq?queue=golden-dlq&" + page.query)
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		top := object(t, r.body)
		assert.JSONEq(t, `3`, string(top["total"]))
		msgs := array(t, top["messages"])
		assert.Len(t, msgs, page.n, page.query)
		for _, raw := range msgs {
			var d struct{ ID string }
			require.NoError(t, json.Unmarshal(raw, &d))
			assert.False(t, seen[d.ID])
			seen[d.ID] = true
		}
	}
	assert.Len(t, seen, 3)
	r = e.get("/api/v1/dlq?queue=golden-dlq&limit=2&offset=2")
	assert.Equal(t, `{"limit":2,"offset":2}`, string(object(t, r.body)["pagination"]))

	// Filters: no filter lists every queue; an unknown group lists nothing
	// (an empty array, not null).
	r = e.get("/api/v1/dlq")
	assert.JSONEq(t, `4`, string(object(t, r.body)["total"]))
	r = e.get("/api/v1/dlq?consumerGroup=og")
	assert.JSONEq(t, `1`, string(object(t, r.body)["total"]))
	r = e.get("/api/v1/dlq?queue=golden-dlq&consumerGroup=nobody")
	require.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, `{"messages":[],"pagination":{"limit":100,"offset":0},"total":0}`, string(r.body))
}

func TestHealth(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *gateway.Config) { c.Version = "1.2.3-test" })
	r := e.get("/health")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Equal(t, "application/json", r.header.Get("Content-Type"))
	assert.Equal(t, `{"database":"connected","server":"Herald","status":"healthy","version":"1.2.3-test"}`, string(r.body))
}

// TestHealth_DatabaseDown: /health says 503 unhealthy when the database does
// not answer, whether the pool is closed or the server is unreachable.
func TestHealth_DatabaseDown(t *testing.T) {
	t.Parallel()
	checkDown := func(t *testing.T, pool *pgxpool.Pool) {
		store, err := queue.New(queue.Config{Pool: pool})
		require.NoError(t, err)
		e := newEnvOn(t, store)
		r := e.get("/health")
		require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r)
		assert.Equal(t, "application/json", r.header.Get("Content-Type"))
		assert.Equal(t, "*", r.header.Get("Access-Control-Allow-Origin"))
		top := object(t, r.body)
		assert.JSONEq(t, `"unhealthy"`, string(top["status"]))
		assert.JSONEq(t, `"disconnected"`, string(top["database"]))
		assert.Contains(t, top, "error")

		// A database fault is a 500 with a JSON error, never a hang or a 4xx.
		r = e.post("/api/v1/push", `{"items":[{"queue":"q"}]}`)
		assert.Equal(t, http.StatusInternalServerError, r.status, "%s", r)
		assert.Contains(t, object(t, r.body), "error")
		// Metrics still render (the pool gauges read a closed pool).
		assert.Equal(t, http.StatusOK, e.get("/metrics").status)
	}

	t.Run("ClosedPool", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.store.Pool().Close()
		checkDown(t, e.store.Pool())
	})
	t.Run("Unreachable", func(t *testing.T) {
		t.Parallel()
		// A port nothing listens on: take one, then let it go.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := ln.Addr().(*net.TCPAddr)
		require.NoError(t, ln.Close())
		pool, err := pgxpool.New(context.Background(),
			fmt.Sprintf("postgres://nobody@127.0.0.1:%d/nodb?sslmode=disable&connect_timeout=2", addr.Port))
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		checkDown(t, pool)
	})
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.push("m", `{"a":1}`, `{"a":2}`)
	e.pushItems(`[{"queue":"m","transactionId":"dup"},{"queue":"m","transactionId":"dup"}]`)
	got := e.pop("/api/v1/pop/queue/m?batch=10&wait=false")
	for _, m := range got.Messages {
		e.ack(m, "completed", "")
	}
	e.post("/api/v1/push", `{"foo":1}`)
	e.get("/api/v1/nope")

	r := e.get("/metrics")
	require.Equal(t, http.StatusOK, r.status)
	assert.Contains(t, r.header.Get("Content-Type"), "text/plain")
	body := string(r.body)
	for _, want := range []string{
		`herald_http_requests_total{method="POST",route="push",status="201"} 2`,
		`herald_http_requests_total{method="POST",route="push",status="400"} 1`,
		`herald_http_requests_total{method="GET",route="pop",status="200"} 1`,
		`herald_http_requests_total{method="POST",route="ack",status="200"} 3`,
		`herald_http_requests_total{method="GET",route="not_found",status="404"} 1`,
		`herald_messages_pushed_total{queue="m"} 3`,
		`herald_messages_duplicate_total{queue="m"} 1`,
		`herald_messages_popped_total{group="__QUEUE_MODE__",queue="m"} 3`,
		`herald_acks_total{queue="m",status="completed"} 3`,
		`herald_http_request_duration_seconds_count{route="push"} 3`,
		"herald_db_pool_total_conns ",
		"herald_db_pool_max_conns ",
		"go_goroutines ",
	} {
		assert.Contains(t, body, want)
	}
}

func TestIndexAndStats(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.get("/")
	assert.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, "text/html; charset=utf-8", r.header.Get("Content-Type"))
	assert.Contains(t, string(r.body), "Herald")
	r = e.get("/internal/api/shared-state/stats")
	assert.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, "application/json", r.header.Get("Content-Type"))
	assert.JSONEq(t, `{"enabled":false,"running":false,"peers":[]}`, string(r.body))
}

func TestNew_Validate(t *testing.T) {
	t.Parallel()
	_, err := gateway.New(gateway.Config{})
	assert.ErrorContains(t, err, "Config.Store is required")
	e := newEnv(t)
	_, err = gateway.New(gateway.Config{Store: e.store, BodyLimit: -1})
	assert.ErrorContains(t, err, "Config.BodyLimit must not be negative")
	_, err = gateway.New(gateway.Config{Store: e.store, LongPollInterval: -1})
	assert.ErrorContains(t, err, "Config.LongPollInterval must not be negative")
}
