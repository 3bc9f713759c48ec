package queue_test

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"encoding/base64"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

var boundKey = bytes.Repeat([]byte{9}, 32)

// sealedStore is a store with an encryption key and encrypted queues qs.
func sealedStore(t *testing.T, qs ...string) *queue.Store {
	t.Helper()
	plain := newStore(t)
	s, err := queue.New(queue.Config{Pool: plain.Pool(), EncryptionKey: boundKey})
	require.NoError(t, err)
	require.NoError(t, s.CheckEncryption(ctxT(t)))
	for _, q := range qs {
		_, err := s.Configure(ctxT(t), queue.ConfigureRequest{Queue: q, Options: json.RawMessage(`{"encryptionEnabled":true}`)})
		require.NoError(t, err)
	}
	return s
}

// storedPayload reads a message's payload as stored.
func storedPayload(t *testing.T, s *queue.Store, messageID string) string {
	t.Helper()
	var p string
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT payload::text FROM messages WHERE id = $1::uuid`, messageID).Scan(&p))
	return p
}

// dlqByID lists a queue's dead letters of queue mode by message id.
func dlqByID(t *testing.T, s *queue.Store, q string) map[string]queue.DeadLetter {
	t.Helper()
	page, err := s.DLQ(ctxT(t), queue.DLQQuery{Queue: q, Group: queue.DefaultGroup})
	require.NoError(t, err)
	out := map[string]queue.DeadLetter{}
	for _, d := range page.Messages {
		out[d.ID] = d
	}
	return out
}

// dlqIDs lists the message ids of a group's dead letters, oldest first.
func dlqIDs(t *testing.T, s *queue.Store, q, group string) []string {
	t.Helper()
	page, err := s.DLQ(ctxT(t), queue.DLQQuery{Queue: q, Group: group})
	require.NoError(t, err)
	var out []string
	for i := len(page.Messages) - 1; i >= 0; i-- {
		out = append(out, page.Messages[i].ID)
	}
	return out
}

// A ciphertext is bound to its message (AES-GCM additional data:
// partition, transaction id, message id). One copied into another row of
// the same queue, or of another queue, is not delivered as that message's
// data: the pop dead-letters the row and goes on.
func TestCrypt_CiphertextIsBoundToItsMessage(t *testing.T) {
	s := sealedStore(t, "enc-a", "enc-b")
	ctx := ctxT(t)
	a := push(t, s, "enc-a", "", map[string]any{"n": 1, "secret": "A"}, map[string]any{"n": 2, "secret": "B"},
		map[string]any{"n": 3, "secret": "C"})
	b := push(t, s, "enc-b", "", map[string]any{"n": 10, "secret": "D"}, map[string]any{"n": 11, "secret": "E"})

	// Message 2 gets message 1's ciphertext; enc-b's first message gets it too.
	exec(t, s, `UPDATE messages SET payload = (SELECT payload FROM messages WHERE id = $1::uuid) WHERE id = ANY($2::uuid[])`,
		a[0].MessageID, []string{a[1].MessageID, b[0].MessageID})

	res := pop(t, s, queue.PopRequest{Queue: "enc-a", Batch: 10})
	assert.Equal(t, []int{1, 3}, payloads(t, res.Messages), "the row holding a copied ciphertext is not delivered")
	for _, m := range res.Messages {
		assert.NotEqual(t, a[1].MessageID, m.ID)
	}
	assert.Equal(t, map[string]int{"enc-a": 1}, res.DeadLettered)
	dl := dlqByID(t, s, "enc-a")
	require.Contains(t, dl, a[1].MessageID, "dead-lettered")
	assert.Equal(t, queue.DecryptError, dl[a[1].MessageID].ErrorMessage)
	assert.NotContains(t, string(dl[a[1].MessageID].Data), `"A"`, "the DLQ does not show it as message 1 either")

	// Across queues, through the coalesced pop of waiting consumers.
	require.NoError(t, s.EnsureConsumers(ctx, []queue.Target{{Queue: "enc-b"}}))
	as, err := s.PopAssigned(ctx, []queue.Assignment{{Intention: 1, PartitionID: b[0].PartitionID, Group: queue.DefaultGroup,
		Limit: 10, Total: 10, LeaseID: queue.NewID()}})
	require.NoError(t, err)
	require.NotNil(t, as[1])
	assert.Equal(t, []int{11}, payloads(t, as[1].Messages))
	require.Contains(t, dlqByID(t, s, "enc-b"), b[0].MessageID)
	assert.Equal(t, uint64(2), s.DecryptFailures())

	// Ciphertexts written before the binding (format v1: no message in the
	// additional data) still decrypt.
	legacy := push(t, s, "enc-a", "", map[string]any{"n": 4})
	exec(t, s, `UPDATE messages SET payload = $2::jsonb WHERE id = $1::uuid`, legacy[0].MessageID, sealV1(t, `{"n":40}`))
	ackAll(t, s, res, queue.StatusCompleted)
	assert.Equal(t, []int{40}, payloads(t, pop(t, s, queue.PopRequest{Queue: "enc-a", Batch: 10}).Messages))
	assert.Equal(t, uint64(2), s.DecryptFailures())
}

// A ciphertext with a flipped byte is not delivered (not as the
// raw envelope either): it goes to the DLQ with the reason, is counted, and
// the message after it is still delivered, in order.
func TestCrypt_TamperedPayloadIsNotDelivered(t *testing.T) {
	s := sealedStore(t, "enc")
	pushed := push(t, s, "enc", "", nums(1, 4)...)
	tamper(t, s, pushed[1].MessageID)

	first := pop(t, s, queue.PopRequest{Queue: "enc"})
	assert.Equal(t, []int{1}, payloads(t, first.Messages))
	ackAll(t, s, first, queue.StatusCompleted)
	next := pop(t, s, queue.PopRequest{Queue: "enc"})
	require.Len(t, next.Messages, 1)
	assert.NotContains(t, string(next.Messages[0].Data), "$herald_enc", "never the raw envelope")
	assert.Equal(t, []int{3}, payloads(t, next.Messages), "the next message, in order")
	assert.Equal(t, map[string]int{"enc": 1}, next.DeadLettered)
	assert.Equal(t, uint64(1), s.DecryptFailures())
	ackAll(t, s, next, queue.StatusCompleted)

	dl := dlqByID(t, s, "enc")
	require.Len(t, dl, 1)
	d, ok := dl[pushed[1].MessageID]
	require.True(t, ok, "the tampered message is in the DLQ")
	assert.Equal(t, queue.DecryptError, d.ErrorMessage)
	assert.True(t, d.DecryptFailed)
	assert.JSONEq(t, `null`, string(d.Data), "the DLQ lists it without data, not as the envelope")

	// An auto-acked stream and the coalesced pop skip it the same way.
	tamper(t, s, pushed[3].MessageID)
	auto := pop(t, s, queue.PopRequest{Queue: "enc", Group: "audit", AutoAck: true, Batch: 10})
	assert.Equal(t, []int{1, 3}, payloads(t, auto.Messages))
	as, err := s.PopAssigned(ctxT(t), []queue.Assignment{{Intention: 7, PartitionID: pushed[0].PartitionID,
		Group: queue.DefaultGroup, Limit: 10, Total: 10, LeaseID: queue.NewID()}})
	require.NoError(t, err)
	assert.Nil(t, as[7], "its only message was undecryptable")
	assert.Equal(t, uint64(4), s.DecryptFailures())
	assert.Equal(t, []string{pushed[1].MessageID, pushed[3].MessageID}, dlqIDs(t, s, "enc", queue.DefaultGroup))
	assert.Equal(t, []string{pushed[1].MessageID, pushed[3].MessageID}, dlqIDs(t, s, "enc", "audit"))
	assert.Empty(t, pop(t, s, queue.PopRequest{Queue: "enc", Batch: 10}).Messages, "queue mode is through")
}

// What a pop dead-letters because it failed to decrypt is told to
// Config.OnGivenUp once, by Pop and by the poller's coalesced pop
// (PopAssigned) alike; a pop that gives nothing up tells nothing.
func TestCrypt_UndecryptablePayloadIsToldAsGivenUpByEveryPop(t *testing.T) {
	plain := newStore(t)
	var told []*queue.PopResult // Pop and PopAssigned tell on this goroutine
	s, err := queue.New(queue.Config{Pool: plain.Pool(), EncryptionKey: boundKey,
		OnGivenUp: func(res *queue.PopResult) { told = append(told, res) }})
	require.NoError(t, err)
	require.NoError(t, s.CheckEncryption(ctxT(t)))
	_, err = s.Configure(ctxT(t), queue.ConfigureRequest{Queue: "enc", Options: json.RawMessage(`{"encryptionEnabled":true}`)})
	require.NoError(t, err)
	pushed := push(t, s, "enc", "", nums(1, 4)...)
	tamper(t, s, pushed[0].MessageID)
	tamper(t, s, pushed[2].MessageID)

	first := pop(t, s, queue.PopRequest{Queue: "enc"})
	assert.Equal(t, []int{2}, payloads(t, first.Messages))
	require.Len(t, told, 1, "Pop")
	assert.Equal(t, map[string]int{"enc": 1}, told[0].DeadLettered)
	ackAll(t, s, first, queue.StatusCompleted)

	as, err := s.PopAssigned(ctxT(t), []queue.Assignment{{Intention: 7, PartitionID: pushed[0].PartitionID,
		Group: queue.DefaultGroup, Limit: 10, Total: 10, LeaseID: queue.NewID()}})
	require.NoError(t, err)
	require.NotNil(t, as[7])
	assert.Equal(t, []int{4}, payloads(t, as[7].Messages))
	require.Len(t, told, 2, "PopAssigned")
	assert.Equal(t, map[string]int{"enc": 1}, told[1].DeadLettered)
	assert.Nil(t, told[1].Dropped)
	assert.Nil(t, told[1].Expired)

	ackAll(t, s, as[7], queue.StatusCompleted)
	push(t, s, "enc", "", nums(5, 5)...)
	assert.Equal(t, []int{5}, payloads(t, pop(t, s, queue.PopRequest{Queue: "enc"}).Messages))
	assert.Len(t, told, 2, "a pop that gives nothing up tells nothing")
}

// tamper flips one ciphertext byte of a stored sealed payload.
func tamper(t *testing.T, s *queue.Store, messageID string) {
	t.Helper()
	var env map[string]any
	require.NoError(t, json.Unmarshal([]byte(storedPayload(t, s, messageID)), &env))
	ct, err := base64.StdEncoding.DecodeString(env["$herald_enc"].(string))
	require.NoError(t, err)
	ct[len(ct)-20] ^= 0x01
	env["$herald_enc"] = base64.StdEncoding.EncodeToString(ct)
	b, err := json.Marshal(env)
	require.NoError(t, err)
	exec(t, s, `UPDATE messages SET payload = $2::jsonb WHERE id = $1::uuid`, messageID, string(b))
}

// sealV1 is the envelope of the first format: AAD "herald payload v1".
func sealV1(t *testing.T, plain string) string {
	t.Helper()
	block, err := aes.NewCipher(boundKey)
	require.NoError(t, err)
	aead, err := cipher.NewGCM(block)
	require.NoError(t, err)
	nonce := bytes.Repeat([]byte{1}, aead.NonceSize())
	ct := aead.Seal(nonce, nonce, []byte(plain), []byte("herald payload v1"))
	b, err := json.Marshal(map[string]string{"$herald_enc": base64.StdEncoding.EncodeToString(ct)})
	require.NoError(t, err)
	return string(b)
}
