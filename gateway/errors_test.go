package gateway_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/gateway"
)

// TestErrors_BadRequests sends every malformed request of API.md and the
// reference examples; each must be a 400 with the reference server's text
// (where it has one) and must not touch the database.
func TestErrors_BadRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const pid = "fb9618c5-30a9-404d-a500-5d0971e0804c"
	cases := []struct {
		name, method, path, body, msg string
	}{
		// Push (examples 19-27).
		{"PushNoItems", "POST", "/api/v1/push", `{"foo":1}`, "items array is required"},
		{"PushItemsNull", "POST", "/api/v1/push", `{"items":null}`, "items array is required"},
		{"PushItemsNotArray", "POST", "/api/v1/push", `{"items":{"queue":"q","payload":1}}`, "items array is required"},
		{"PushItemsString", "POST", "/api/v1/push", `{"items":"q"}`, "items array is required"},
		{"PushQueueNotString", "POST", "/api/v1/push", `{"items":[{"queue":123,"payload":1}]}`, "Queue must be a string"},
		{"PushQueueMissing", "POST", "/api/v1/push", `{"items":[{"payload":1}]}`, "Queue must be a string"},
		{"PushQueueMissingInSecondItem", "POST", "/api/v1/push", `{"items":[{"queue":"q"},{"payload":1}]}`, "Queue must be a string"},
		{"PushPartitionNotString", "POST", "/api/v1/push", `{"items":[{"queue":"q","partition":5,"payload":1}]}`, "Partition must be a string"},
		{"PushTransactionIDNotString", "POST", "/api/v1/push", `{"items":[{"queue":"q","transactionId":42,"payload":1}]}`, "TransactionId must be a string"},
		{"PushTraceIDNotString", "POST", "/api/v1/push", `{"items":[{"queue":"q","traceId":7}]}`, "TraceId must be a string"},
		{"PushItemNotObject", "POST", "/api/v1/push", `{"items":[1]}`, "Each item must be an object"},
		{"PushEmptyBody", "POST", "/api/v1/push", ``, "Empty request body"},
		{"PushBlankBody", "POST", "/api/v1/push", " \n\t", "Empty request body"},
		{"PushBodyArray", "POST", "/api/v1/push", `[{"queue":"q"}]`, "Invalid JSON: request body must be a JSON object"},
		{"PushBodyNull", "POST", "/api/v1/push", `null`, "Invalid JSON: request body must be a JSON object"},
		// Ack (examples 45, 46).
		{"AckNoTransactionID", "POST", "/api/v1/ack", `{"partitionId":"` + pid + `","status":"completed"}`, "transactionId is required"},
		{"AckEmptyTransactionID", "POST", "/api/v1/ack", `{"transactionId":"","partitionId":"` + pid + `"}`, "transactionId is required"},
		{"AckTransactionIDNotString", "POST", "/api/v1/ack", `{"transactionId":5,"partitionId":"` + pid + `"}`, "transactionId is required"},
		{"AckNoPartitionID", "POST", "/api/v1/ack", `{"transactionId":"tx","leaseId":"l","status":"completed"}`, "partitionId is required to ensure message uniqueness"},
		{"AckBadStatus", "POST", "/api/v1/ack", `{"transactionId":"tx","partitionId":"` + pid + `","status":"bogus"}`, "status must be one of completed, success, failed, retry, dlq"},
		{"AckStatusNotString", "POST", "/api/v1/ack", `{"transactionId":"tx","partitionId":"` + pid + `","status":1}`, "status must be a string"},
		{"AckEmptyBody", "POST", "/api/v1/ack", ``, "Empty request body"},
		// Ack batch (examples 53, 54).
		{"AckBatchNoAcknowledgments", "POST", "/api/v1/ack/batch", `{"acks":[]}`, "acknowledgments array is required"},
		{"AckBatchAcknowledgmentsNotArray", "POST", "/api/v1/ack/batch", `{"acknowledgments":{}}`, "acknowledgments array is required"},
		{"AckBatchItemNoPartitionID", "POST", "/api/v1/ack/batch", `{"acknowledgments":[{"transactionId":"x","status":"completed"}]}`,
			"Each acknowledgment must have a valid partitionId string to ensure message uniqueness"},
		{"AckBatchItemNoTransactionID", "POST", "/api/v1/ack/batch", `{"acknowledgments":[{"partitionId":"` + pid + `"}]}`,
			"Each acknowledgment must have a transactionId string"},
		{"AckBatchItemNotObject", "POST", "/api/v1/ack/batch", `{"acknowledgments":["x"]}`, "Each acknowledgment must be an object"},
		{"AckBatchItemBadStatus", "POST", "/api/v1/ack/batch", `{"acknowledgments":[{"transactionId":"x","partitionId":"` + pid + `","status":"nope"}]}`,
			"status must be one of completed, success, failed, retry, dlq"},
		// Transaction (example 63).
		{"TransactionEmptyOperations", "POST", "/api/v1/transaction", `{"operations":[]}`, "operations array cannot be empty"},
		{"TransactionNoOperations", "POST", "/api/v1/transaction", `{"requiredLeases":[]}`, "operations array cannot be empty"},
		{"TransactionBadType", "POST", "/api/v1/transaction", `{"operations":[{"type":"pop"}]}`, "operation type must be push or ack"},
		{"TransactionPushNoItems", "POST", "/api/v1/transaction", `{"operations":[{"type":"push"}]}`, "push operation requires an items array"},
		{"TransactionAckNoPartition", "POST", "/api/v1/transaction", `{"operations":[{"type":"ack","transactionId":"x"}]}`,
			"partitionId is required to ensure message uniqueness"},
		{"TransactionBadRequiredLeases", "POST", "/api/v1/transaction", `{"operations":[{"type":"push","items":[]}],"requiredLeases":"x"}`,
			"requiredLeases must be an array of strings"},
		// Configure (example 8).
		{"ConfigureNoQueue", "POST", "/api/v1/configure", `{"options":{"leaseTime":10}}`, "queue is required"},
		{"ConfigureEmptyQueue", "POST", "/api/v1/configure", `{"queue":""}`, "queue is required"},
		{"ConfigureQueueNotString", "POST", "/api/v1/configure", `{"queue":1}`, "queue is required"},
		{"ConfigureNegativeOption", "POST", "/api/v1/configure", `{"queue":"q","options":{"retryLimit":-1}}`, "options.retryLimit must be an integer between 0 and 10000"},
		// Pop query parameters.
		{"PopBatchNotInt", "GET", "/api/v1/pop/queue/q?batch=abc", ``, "batch must be an integer of at least 1"},
		{"PopBatchZero", "GET", "/api/v1/pop/queue/q?batch=0", ``, "batch must be an integer of at least 1"},
		{"PopWaitMaybe", "GET", "/api/v1/pop/queue/q?wait=maybe", ``, "wait must be true or false"},
		{"PopAutoAckYes", "GET", "/api/v1/pop/queue/q?autoAck=yes", ``, "autoAck must be true or false"},
		{"PopTimeoutNegative", "GET", "/api/v1/pop/queue/q?wait=true&timeout=-1", ``, "timeout must be an integer of at least 0"},
		{"PopPartitionsZero", "GET", "/api/v1/pop/queue/q?partitions=0", ``, "partitions must be an integer of at least 1"},
		{"PopSubscriptionFromBogus", "GET", "/api/v1/pop/queue/q?subscriptionFrom=yesterday", ``, "subscriptionFrom must be now or an RFC3339 time"},
		{"PopNamespaceMissing", "GET", "/api/v1/pop", ``, "namespace or task is required (or use /api/v1/pop/queue/{queue})"},
		// DLQ query parameters.
		{"DLQLimitZero", "GET", "/api/v1/dlq?limit=0", ``, "limit must be an integer between 1 and 1000"},
		{"DLQLimitNotInt", "GET", "/api/v1/dlq?limit=ten", ``, "limit must be an integer between 1 and 1000"},
		{"DLQOffsetNegative", "GET", "/api/v1/dlq?offset=-1", ``, "offset must be an integer between 0 and 1073741824"},
		// Lease extend.
		{"LeaseSecondsNotInt", "POST", "/api/v1/lease/00000000-0000-0000-0000-000000000000/extend", `{"seconds":"x"}`,
			"seconds must be an integer between 0 and 86400 (a day)"},
		{"LeaseSecondsNegative", "POST", "/api/v1/lease/00000000-0000-0000-0000-000000000000/extend", `{"seconds":-5}`,
			"seconds must be an integer between 0 and 86400 (a day)"},
		{"LeaseSecondsTooLarge", "POST", "/api/v1/lease/00000000-0000-0000-0000-000000000000/extend", `{"seconds":2147483648}`,
			"seconds must be an integer between 0 and 86400 (a day)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assertError(t, e.do(c.method, c.path, c.body), http.StatusBadRequest, c.msg)
		})
	}

	// Nothing above reached the database: no queue was created.
	var n int
	require.NoError(t, e.store.Pool().QueryRow(ctxT(t), `SELECT count(*) FROM queues`).Scan(&n))
	assert.Zero(t, n, "a rejected request created a queue")
}

// TestErrors_InvalidJSON checks the prefix the reference uses; the parser's
// own words follow it and differ between implementations.
func TestErrors_InvalidJSON(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, path := range []string{"/api/v1/push", "/api/v1/ack", "/api/v1/ack/batch", "/api/v1/transaction",
		"/api/v1/configure", "/api/v1/lease/00000000-0000-0000-0000-000000000000/extend"} {
		for _, body := range []string{`{not json`, `{"items":[]} trailing`, `{"items":[`} {
			r := e.post(path, body)
			assert.Equal(t, http.StatusBadRequest, r.status, "%s %s: %s", path, body, r)
			msg := object(t, r.body)["error"]
			assert.True(t, strings.HasPrefix(string(msg), `"Invalid JSON: `), "%s %s: %s", path, body, r)
		}
	}
}

// TestErrors_BadNames: names the store refuses are the client's fault (400),
// never a 5xx that clients would retry.
func TestErrors_BadNames(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	assertError(t, e.post("/api/v1/push", `{"items":[{"queue":""}]}`), http.StatusBadRequest, "queue must not be empty")
	assertError(t, e.post("/api/v1/push", `{"items":[{"queue":"`+strings.Repeat("q", 256)+`"}]}`), http.StatusBadRequest,
		"queue must be at most 255 bytes")
	assertError(t, e.post("/api/v1/push", `{"items":[{"queue":"a\u0001b"}]}`), http.StatusBadRequest,
		"queue must not contain control characters")
	r := e.post("/api/v1/push", `{"items":[{"queue":"q","traceId":"not-a-uuid"}]}`)
	assert.Equal(t, http.StatusBadRequest, r.status, "%s", r)
	r = e.get("/api/v1/pop/queue/q?consumerGroup=%01")
	assert.Equal(t, http.StatusBadRequest, r.status, "%s", r)
	// Values Postgres refuses are bad input too, never a 5xx (clients retry those).
	for _, body := range []string{
		`{"items":[{"queue":"q","payload":{"a":"\u0000"}}]}`,
		`{"items":[{"queue":"q","payload":1e999999}]}`,
		`{"items":[{"queue":"q","transactionId":"a\u0000b"}]}`,
	} {
		r = e.post("/api/v1/push", body)
		assert.Equal(t, http.StatusBadRequest, r.status, "%s: %s", body, r)
	}
	for _, path := range []string{"/api/v1/pop/queue/q/partition/p%00", "/api/v1/pop?namespace=n%00", "/api/v1/dlq?queue=q%00"} {
		r = e.get(path)
		assert.Equal(t, http.StatusBadRequest, r.status, "%s: %s", path, r)
	}
	r = e.post("/api/v1/ack", `{"transactionId":"t\u0000","partitionId":"00000000-0000-0000-0000-000000000000"}`)
	assert.Equal(t, http.StatusBadRequest, r.status, "%s", r)
}

func TestErrors_BodyLimit(t *testing.T) {
	t.Parallel()
	const limit = 1024
	e := newEnv(t, func(c *gateway.Config) { c.BodyLimit = limit })

	// A body of exactly the limit is accepted; one byte more is not.
	body := func(n int) string {
		prefix, suffix := `{"items":[{"queue":"q","payload":"`, `"}]}`
		return prefix + strings.Repeat("x", n-len(prefix)-len(suffix)) + suffix
	}
	r := e.post("/api/v1/push", body(limit))
	require.Equal(t, http.StatusCreated, r.status, "%s", r)
	assertError(t, e.post("/api/v1/push", body(limit+1)), http.StatusRequestEntityTooLarge,
		"request body too large (limit 1024 bytes)")
	r = e.post("/api/v1/push", body(16*limit))
	assertError(t, r, http.StatusRequestEntityTooLarge, "request body too large (limit 1024 bytes)")
	assert.Equal(t, "*", r.header.Get("Access-Control-Allow-Origin"))

	// Every route that reads a body enforces the limit.
	big := `{"pad":"` + strings.Repeat("x", 2*limit) + `"}`
	for _, path := range []string{"/api/v1/ack", "/api/v1/ack/batch", "/api/v1/transaction", "/api/v1/configure",
		"/api/v1/lease/00000000-0000-0000-0000-000000000000/extend"} {
		assertError(t, e.post(path, big), http.StatusRequestEntityTooLarge, "request body too large (limit 1024 bytes)")
	}

	// Only the one accepted push was stored.
	m := e.pop("/api/v1/pop/queue/q?batch=10&wait=false")
	assert.Len(t, m.Messages, 1)
}

func TestErrors_BodyLimitDefault(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.post("/api/v1/push", `{"items":[{"queue":"q","payload":"`+strings.Repeat("x", gateway.BodyLimitDefault)+`"}]}`)
	assertError(t, r, http.StatusRequestEntityTooLarge, "request body too large (limit 8388608 bytes)")
}

func TestErrors_UnknownRoute(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, c := range []struct{ method, path string }{
		{"GET", "/api/v1/nope"},
		{"POST", "/api/v1/nope"},
		{"GET", "/api/v2/pop/queue/q"},
		{"DELETE", "/api/v1/resources/queues"},
		{"GET", "/api/v1/pop/queue/q/partition/p/extra"},
	} {
		r := e.do(c.method, c.path, "")
		assertError(t, r, http.StatusNotFound, "no route for "+c.method+" "+c.path)
		assert.Equal(t, "*", r.header.Get("Access-Control-Allow-Origin"))
	}
}

func TestCORS(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	check := func(r resp) {
		t.Helper()
		assert.Equal(t, "*", r.header.Get("Access-Control-Allow-Origin"), "%s", r)
		assert.Equal(t, "GET, POST, PUT, DELETE, OPTIONS", r.header.Get("Access-Control-Allow-Methods"))
		assert.Equal(t, "Content-Type, Authorization, X-Herald-CSRF", r.header.Get("Access-Control-Allow-Headers"))
		// Never with credentials: a page of another origin cannot send
		// X-Herald-CSRF with the user's cookie (the cookie rule).
		assert.Empty(t, r.header.Get("Access-Control-Allow-Credentials"))
	}
	check(e.post("/api/v1/push", `{"items":[{"queue":"q"}]}`)) // 201
	check(e.post("/api/v1/push", `{"foo":1}`))                 // 400
	check(e.get("/api/v1/pop/queue/empty?wait=false"))         // 204
	check(e.get("/api/v1/pop/queue/q?wait=false"))             // 200
	check(e.get("/health"))                                    // 200
	check(e.get("/metrics"))                                   // 200, text
	check(e.do("DELETE", "/api/v1/resources/queues/q", ""))    // 200

	for _, path := range []string{"/api/v1/push", "/api/v1/pop/queue/q", "/api/v1/ack", "/health", "/", "/anything/else"} {
		req, err := http.NewRequestWithContext(ctxT(t), http.MethodOptions, e.url+path, nil)
		require.NoError(t, err)
		req.Header.Set("Origin", "https://example.com")
		req.Header.Set("Access-Control-Request-Method", "POST")
		req.Header.Set("Access-Control-Request-Headers", "content-type")
		res, err := e.client.Do(req)
		require.NoError(t, err)
		require.NoError(t, res.Body.Close())
		assert.Equal(t, http.StatusNoContent, res.StatusCode, "OPTIONS %s", path)
		check(resp{status: res.StatusCode, header: res.Header})
	}
}
