package gateway_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/queue/queuetest"
)

// Over HTTP, a waiting consumer (the coalesced pop) is not handed
// a ciphertext copied from another message; it gets the next message, and
// the DLQ listing names the copy with the reason and no data.
func TestPop_UndecryptableMessageIsNotDelivered(t *testing.T) {
	t.Parallel()
	plain := queuetest.NewStore(t)
	s, err := queue.New(queue.Config{Pool: plain.Pool(), EncryptionKey: bytes.Repeat([]byte{5}, 32)})
	require.NoError(t, err)
	require.NoError(t, s.CheckEncryption(ctxT(t)))
	e := newEnvOn(t, s, nil)
	r := e.post("/api/v1/configure", `{"queue":"enc-lp","options":{"encryptionEnabled":true}}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)

	first := e.push("enc-lp", `{"secret":"first"}`)
	got := e.pop("/api/v1/pop/queue/enc-lp?wait=false")
	require.Len(t, got.Messages, 1)
	assert.JSONEq(t, `{"secret":"first"}`, string(got.Messages[0].Data))
	e.ack(got.Messages[0], "completed", "")
	var envelope string
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT payload::text FROM messages WHERE id = $1::uuid`,
		first[0].MessageID).Scan(&envelope))

	// A writer with database access adds the first message's ciphertext as
	// a new message, then a plain one (SQL pushes are not encrypted).
	waiting := e.waitingPop("/api/v1/pop/queue/enc-lp?wait=true&timeout=10000&batch=5")
	e.exec(`SELECT push('enc-lp', 'Default', $1::jsonb, 'forged'), push('enc-lp', 'Default', '{"n":2}', 'plain')`, envelope)
	res := <-waiting
	require.Equal(t, http.StatusOK, res.status, "%s", res)
	var pr popResult
	require.NoError(t, json.Unmarshal(res.body, &pr))
	require.Len(t, pr.Messages, 1, "%s", res)
	assert.Equal(t, "plain", pr.Messages[0].TransactionID)
	assert.JSONEq(t, `{"n":2}`, string(pr.Messages[0].Data))
	assert.Equal(t, uint64(1), s.DecryptFailures())

	r = e.get("/api/v1/dlq?queue=enc-lp")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	var dl struct {
		Messages []struct {
			TransactionID string          `json:"transactionId"`
			ErrorMessage  string          `json:"errorMessage"`
			Data          json.RawMessage `json:"data"`
		} `json:"messages"`
	}
	require.NoError(t, json.Unmarshal(r.body, &dl))
	require.Len(t, dl.Messages, 1, "%s", r)
	assert.Equal(t, "forged", dl.Messages[0].TransactionID)
	assert.Equal(t, queue.DecryptError, dl.Messages[0].ErrorMessage)
	assert.JSONEq(t, `null`, string(dl.Messages[0].Data), fmt.Sprintf("not the envelope: %s", r))

	m := e.get("/metrics")
	assert.Contains(t, string(m.body), "\nherald_decrypt_failures_total 1\n", "counted in /metrics")
}
