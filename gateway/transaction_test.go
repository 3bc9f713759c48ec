package gateway_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Over HTTP, a transaction whose push hits maxSize answers as any
// failed transaction does (200, success false, an error naming the refusal,
// results ending with the refused item, which says success false), commits
// nothing, and each result's index is its own position.
func TestTransaction_MaxSizeRefusalOverHTTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.post("/api/v1/configure", `{"queue":"tx-full","options":{"maxSize":2}}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	e.push("tx-full", `{"n":1}`)

	r = e.post("/api/v1/transaction", `{"operations":[`+
		`{"type":"push","items":[{"queue":"tx-other","payload":{"n":7}}]},`+
		`{"type":"push","items":[{"queue":"tx-full","payload":{"n":2}},{"queue":"tx-full","transactionId":"refused","payload":{"n":3}}]}]}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	top := object(t, r.body)
	assert.JSONEq(t, `false`, string(top["success"]), "%s", r)
	assert.JSONEq(t, `"PUSH operation failed: queue tx-full is full: it holds its maxSize of 2 messages"`, string(top["error"]))
	results := array(t, top["results"])
	require.Len(t, results, 3)
	for i, raw := range results {
		var res struct {
			Index int `json:"index"`
		}
		require.NoError(t, json.Unmarshal(raw, &res))
		assert.Equal(t, i, res.Index, "result %d: %s", i, raw)
	}
	assert.JSONEq(t, `{"error":"queue tx-full is full: it holds its maxSize of 2 messages","index":2,"queueName":"tx-full",`+
		`"status":"rejected","success":false,"transactionId":"refused","type":"push"}`, string(results[2]))

	got := e.pop("/api/v1/pop/queue/tx-full?batch=10&wait=false")
	require.Len(t, got.Messages, 1, "only the message pushed before the transaction")
	assert.JSONEq(t, `{"n":1}`, string(got.Messages[0].Data))
	e.popEmpty("/api/v1/pop/queue/tx-other?wait=false")

	// Several items of one push operation: indexes 0, 1, 2.
	r = e.post("/api/v1/transaction", `{"operations":[{"type":"push","items":[`+
		`{"queue":"tx-many","payload":1},{"queue":"tx-many","payload":2},{"queue":"tx-many","payload":3}]}]}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	top = object(t, r.body)
	assert.JSONEq(t, `true`, string(top["success"]), "%s", r)
	results = array(t, top["results"])
	require.Len(t, results, 3)
	for i, raw := range results {
		var res struct {
			Index   int  `json:"index"`
			Success bool `json:"success"`
		}
		require.NoError(t, json.Unmarshal(raw, &res))
		assert.Equal(t, i, res.Index, "result %d: %s", i, raw)
		assert.True(t, res.Success)
	}
}
