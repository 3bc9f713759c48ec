package gateway_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/queue/queuetest"
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

// A warm push (queue and partition seen before) issues no queue-config or
// partition-id query: herald_db_queries_total{op} counts only its own two
// statements.
func TestPush_WarmIssuesNoLookup(t *testing.T) {
	e := newEnv(t)
	lookups := []string{"queue_config", "create_queues", "create_partitions", "resolve_partitions"}
	count := func(op string) float64 { return e.scrape(`herald_db_queries_total{op="` + op + `"}`) }
	e.push("warm-http", `{"i":0}`)
	for _, op := range []string{"create_queues", "create_partitions", "resolve_partitions"} {
		assert.Equal(t, 1.0, count(op), "the cold push looked up %s", op)
	}
	before := map[string]float64{}
	for _, op := range append(lookups, "push_lock", "push_insert_lean") {
		before[op] = count(op)
	}
	for i := range 10 {
		e.push("warm-http", fmt.Sprintf(`{"i":%d}`, i+1))
	}
	for _, op := range lookups {
		assert.Equal(t, before[op], count(op), "warm pushes ran no %s", op)
	}
	assert.Equal(t, before["push_lock"]+10, count("push_lock"))
	assert.Equal(t, before["push_insert_lean"]+10, count("push_insert_lean"), "nobody waits: no hand-off to make")
}

// A push beyond a queue's maxSize is refused per item with its own status
// and reason, not a 5xx; the rest of the push is stored.
func TestPush_MaxSizeRefusesPerItem(t *testing.T) {
	e := newEnv(t)
	r := e.post("/api/v1/configure", `{"queue":"small","options":{"maxSize":1}}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	r = e.post("/api/v1/push", `{"items":[{"queue":"small","payload":1},{"queue":"small","payload":2}]}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r)
	var out []map[string]any
	require.NoError(t, json.Unmarshal(r.body, &out))
	require.Len(t, out, 2)
	assert.Equal(t, "queued", out[0]["status"])
	assert.Equal(t, "rejected", out[1]["status"])
	assert.Contains(t, out[1]["error"], "maxSize of 1")
	assert.Equal(t, "small", out[1]["queueName"])
}

// A direct pop (wait=false) whose transaction committed its lease but
// whose answer was lost (the connection broke after the COMMIT reached the
// server) answers 503, and the lease it may have taken is given back at
// once, uncharged: the next pop gets the messages with retryCount 0, not
// after the lease time (5 min) with retryCount 1.
func TestPop_LostAnswerIsGivenBackUncharged(t *testing.T) {
	t.Parallel()
	proxy, dsn := pgtest.NewProxy(t, pgtest.DSN(t))
	e := newEnvOn(t, queuetest.NewStoreDSN(t, dsn), func(c *poller.Config) { c.SweepMin, c.SweepMax = time.Minute, time.Minute })
	e.push("lost", `{"i":0}`)
	first := e.pop("/api/v1/pop/queue/lost?wait=false") // registers the group (a transaction of its own)
	require.True(t, e.ack(first.Messages[0], "completed", "").Success)
	e.push("lost", `{"i":1}`, `{"i":2}`)

	cut := proxy.CutAnswer("commit") // the pop transaction's COMMIT: it runs, its answer is dropped
	r := e.get("/api/v1/pop/queue/lost?batch=10&wait=false")
	assert.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r)
	assert.NotEmpty(t, r.header.Get("Retry-After"))
	select {
	case <-cut:
	case <-time.After(10 * time.Second):
		t.Fatal("the pop's COMMIT never ran")
	}
	start := time.Now()
	var got popResult
	require.Eventually(t, func() bool {
		r := e.get("/api/v1/pop/queue/lost?batch=10&wait=false")
		if r.status != http.StatusOK {
			return false
		}
		require.NoError(t, json.Unmarshal(r.body, &got))
		return true
	}, 5*time.Second, 20*time.Millisecond, "the lost pop's lease given back")
	t.Logf("lost answer → popped again: %v", time.Since(start))
	require.Len(t, got.Messages, 2)
	assert.JSONEq(t, `{"i":1}`, string(got.Messages[0].Data))
	for _, m := range got.Messages {
		assert.Zero(t, m.RetryCount, "no attempt charged for a delivery that never happened")
	}
}
