package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/gateway"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/queue/queuetest"
)

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
// configured with nothing (example 5 has the same values), in its key order,
// with Herald's idleGroupRetentionSeconds, and three values that differ:
// the reference answers deadLetterQueue and dlqAfterMaxRetries false and
// ttl 3600 while it always dead-letters and never expires a message;
// Herald honours the three, and answers what its defaults do (true, true,
// 0: never).
const optionDefaults = `{"completedRetentionSeconds":0,"deadLetterQueue":true,"delayedProcessing":0,"dlqAfterMaxRetries":true,` +
	`"encryptionEnabled":false,"idleGroupRetentionSeconds":86400,"leaseTime":300,"maxSize":0,"maxWaitTimeSeconds":0,"priority":0,"retentionEnabled":false,` +
	`"retentionSeconds":0,"retryDelay":1000,"retryLimit":3,"ttl":0,"windowBuffer":0}`

func TestConfigure(t *testing.T) {
	t.Parallel()
	// A server with an encryption key: the examples turn encryptionEnabled on.
	base := queuetest.NewStore(t)
	store, err := queue.New(queue.Config{Pool: base.Pool(), EncryptionKey: bytes.Repeat([]byte{1}, 32)})
	require.NoError(t, err)
	e := newEnvOn(t, store, nil)
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
	assert.Len(t, opts, 16)
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
		`"encryptionEnabled":false,"idleGroupRetentionSeconds":86400,"leaseTime":120,"maxSize":100000,"maxWaitTimeSeconds":0,"priority":7,"retentionEnabled":false,` +
		`"retentionSeconds":7200,"retryDelay":5000,"retryLimit":2,"ttl":86400,"windowBuffer":0}`
	assert.Equal(t, body("golden-opts", "billing", "invoices", opts7, res), string(r.body))

	// Upsert: same ids; named options change, the others (and namespace
	// and task) keep their stored values.
	r2, res2 := configure(`{"queue":"golden-opts","options":{"priority":1,"encryptionEnabled":true}}`)
	assert.Equal(t, res, res2)
	merged := strings.Replace(strings.Replace(opts7, `"priority":7`, `"priority":1`, 1),
		`"encryptionEnabled":false`, `"encryptionEnabled":true`, 1)
	assert.Equal(t, body("golden-opts", "billing", "invoices", merged, res), string(r2.body))

	// mode "replace": options left out go back to their defaults.
	r2, _ = configure(`{"queue":"golden-opts","mode":"replace","options":{"priority":1,"encryptionEnabled":true}}`)
	want := strings.Replace(strings.Replace(optionDefaults, `"priority":0`, `"priority":1`, 1),
		`"encryptionEnabled":false`, `"encryptionEnabled":true`, 1)
	assert.Equal(t, body("golden-opts", "billing", "invoices", want, res), string(r2.body))

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
		// The reference server's keys (id is the message's), plus dlqId:
		// the dead letter's own, which replay and purge name.
		assert.Equal(t, []string{"consumerGroup", "createdAt", "data", "errorMessage", "failedAt", "id", "dlqId", "partition",
			"partitionId", "producerSub", "queue", "retryCount", "traceId", "transactionId"}, keys(t, raw))
		var d struct {
			ConsumerGroup string          `json:"consumerGroup"`
			CreatedAt     string          `json:"createdAt"`
			Data          json.RawMessage `json:"data"`
			ErrorMessage  string          `json:"errorMessage"`
			FailedAt      string          `json:"failedAt"`
			ID            string          `json:"dlqId"`
			MessageID     string          `json:"id"`
			Partition     string          `json:"partition"`
			PartitionID   string          `json:"partitionId"`
			ProducerSub   *string         `json:"producerSub"`
			Queue         string          `json:"queue"`
			RetryCount    int             `json:"retryCount"`
			TransactionID string          `json:"transactionId"`
		}
		require.NoError(t, json.Unmarshal(raw, &d))
		m, ok := byID[d.MessageID]
		require.True(t, ok, "unexpected dead letter %s", raw)
		assert.Regexp(t, `^[1-9][0-9]*$`, d.ID)
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
	// connections: this request's (no cap: maxConnections 0).
	assert.Equal(t, `{"connections":1,"database":"connected","maxConnections":0,"server":"Herald","status":"healthy","version":"1.2.3-test"}`, string(r.body))
}

// TestHealth_DatabaseDown: /health says 503 unhealthy when the database does
// not answer, and why, whether the pool is closed or the server is
// unreachable; every route that needs the database answers 503 with
// Retry-After (a WebSocket an error frame with code "unavailable"), never
// a 500, a hang or a 4xx; and the outage is logged once, not per request.
func TestHealth_DatabaseDown(t *testing.T) {
	t.Parallel()
	checkDown := func(t *testing.T, pool *pgxpool.Pool) {
		store, err := queue.New(queue.Config{Pool: pool})
		require.NoError(t, err)
		var logs syncBuffer
		e := newEnvOn(t, store, nil, func(c *gateway.Config) { c.Logger = zerolog.New(&logs) })
		r := e.get("/health")
		require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r)
		assert.Equal(t, "application/json", r.header.Get("Content-Type"))
		assert.Equal(t, "*", r.header.Get("Access-Control-Allow-Origin"))
		top := object(t, r.body)
		assert.JSONEq(t, `"unhealthy"`, string(top["status"]))
		assert.JSONEq(t, `"disconnected"`, string(top["database"]))
		assert.Contains(t, string(top["error"]), "database unreachable: ", "/health says why")

		routes := []struct{ method, path, body string }{
			{http.MethodPost, "/api/v1/push", `{"items":[{"queue":"q"}]}`},
			{http.MethodPost, "/api/v1/push", `{"items":[{"queue":"q"}]}`},
			{http.MethodGet, "/api/v1/pop/queue/q?wait=false", ""},
			{http.MethodPost, "/api/v1/ack", `{"transactionId":"t","partitionId":"` + queue.NewID() + `","leaseId":"` +
				queue.NewID() + `","status":"completed"}`},
			{http.MethodPost, "/api/v1/lease/" + queue.NewID() + "/extend", `{"seconds":10}`},
			{http.MethodGet, "/api/v1/resources/queues", ""},
		}
		for _, rt := range routes {
			r = e.do(rt.method, rt.path, rt.body)
			assert.Equal(t, http.StatusServiceUnavailable, r.status, "%s %s: %s", rt.method, rt.path, r)
			assert.Equal(t, strconv.Itoa(gateway.RetryAfterUnavailable), r.header.Get("Retry-After"), "%s %s", rt.method, rt.path)
			assert.JSONEq(t, strconv.Quote(gateway.ErrTextUnavailable), string(object(t, r.body)["error"]), "%s %s", rt.method, rt.path)
		}
		ws := e.dialWS(t)
		ws.send(`{"type":"push","id":"p1","items":[{"queue":"q","payload":{"a":1}}]}`)
		f := ws.next("error")
		assert.JSONEq(t, `"unavailable"`, string(f["code"]), "%v", f)
		assert.JSONEq(t, strconv.Itoa(gateway.RetryAfterUnavailable), string(f["retryAfter"]), "%v", f)
		assert.Equal(t, 1, strings.Count(logs.String(), `"level":"error"`),
			"one error line for the outage, not one per request:\n%s", logs.String())
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
		`herald_db_queries_total{op="push_insert_lean"} 2`, // nobody waits: no hand-off to make
		`herald_db_queries_total{op="pop_lock"} 2`,         // the first pop registers its group, then claims again
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
	_, err = gateway.New(gateway.Config{Store: e.store})
	assert.ErrorContains(t, err, "Config.Poller is required")
}

// herald_followers counts this instance's followers per queue, under the
// queue label's bound (--metrics-max-queues): past it, queues share
// "__other__", so followers cannot add series. The status route the demo
// page and the console read names them per queue.
func TestMetrics_FollowersPerQueueWithinTheLabelBound(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *gateway.Config) { c.Metrics.Queues = gateway.NewLabelLimiter(1) })
	for _, path := range []string{"/api/v1/follow/queue/mf1", "/api/v1/follow/queue/mf1/partition/p",
		"/api/v1/follow/queue/mf2", "/api/v1/follow/queue/mf3"} {
		e.openSSE(t, path, nil)
	}
	require.Eventually(t, func() bool {
		f := e.srv.Followers()
		return f["mf1"] == 2 && f["mf2"] == 1 && f["mf3"] == 1
	}, 10*time.Second, 5*time.Millisecond, "every follower joined")
	var lines []string
	for _, l := range strings.Split(string(e.get("/metrics").body), "\n") {
		if strings.HasPrefix(l, "herald_followers") {
			lines = append(lines, l)
		}
	}
	assert.ElementsMatch(t, []string{`herald_followers{queue="__other__"} 2`, `herald_followers{queue="mf1"} 2`}, lines)

	var st struct {
		Followers map[string]int `json:"followers"`
	}
	r := e.get("/internal/api/status")
	require.Equal(t, http.StatusOK, r.status)
	require.NoError(t, json.Unmarshal(r.body, &st))
	assert.Equal(t, map[string]int{"mf1": 2, "mf2": 1, "mf3": 1}, st.Followers)
}
