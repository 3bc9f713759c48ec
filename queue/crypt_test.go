package queue_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// Encrypted queues store ciphertext (a fresh nonce per message), deliver
// plaintext, refuse to be configured without a key, and a wrong key is
// found at start-up.
func TestEncryption(t *testing.T) {
	ctx := ctxT(t)
	plain := newStore(t)
	_, err := plain.Configure(ctx, queue.ConfigureRequest{Queue: "sec", Options: json.RawMessage(`{"encryptionEnabled":true}`)})
	require.Error(t, err)
	assert.True(t, queue.IsInputError(err), "no key: 400")

	key := bytes.Repeat([]byte{7}, 32)
	s, err := queue.New(queue.Config{Pool: plain.Pool(), EncryptionKey: key})
	require.NoError(t, err)
	require.NoError(t, s.CheckEncryption(ctx), "the first key is recorded")
	_, err = s.Configure(ctx, queue.ConfigureRequest{Queue: "sec",
		Options: json.RawMessage(`{"encryptionEnabled":true,"retryLimit":0,"deadLetterQueue":true}`)})
	require.NoError(t, err)
	secret := `{"card":"4111-1111-1111-1111"}`
	_, err = s.Push(ctx, []queue.PushItem{{Queue: "sec", Payload: json.RawMessage(secret)},
		{Queue: "sec", Payload: json.RawMessage(secret)}})
	require.NoError(t, err)

	var stored []string
	rows, err := s.Pool().Query(ctx, `SELECT payload::text FROM messages ORDER BY seq`)
	require.NoError(t, err)
	for rows.Next() {
		var p string
		require.NoError(t, rows.Scan(&p))
		stored = append(stored, p)
	}
	require.NoError(t, rows.Err())
	require.Len(t, stored, 2)
	for _, p := range stored {
		assert.NotContains(t, p, "4111", "ciphertext at rest")
		assert.Contains(t, p, "$herald_enc")
	}
	assert.NotEqual(t, stored[0], stored[1], "a fresh nonce per message")

	res, err := s.Pop(ctx, queue.PopRequest{Queue: "sec", Batch: 1})
	require.NoError(t, err)
	require.Len(t, res.Messages, 1)
	assert.JSONEq(t, secret, string(res.Messages[0].Data), "delivered in clear")
	_, err = s.Ack(ctx, []queue.Ack{{TransactionID: res.Messages[0].TransactionID, PartitionID: res.PartitionID,
		LeaseID: res.LeaseID, Status: queue.StatusDLQ}})
	require.NoError(t, err)
	dl, err := s.DLQ(ctx, queue.DLQQuery{Queue: "sec"})
	require.NoError(t, err)
	require.Len(t, dl.Messages, 1)
	assert.JSONEq(t, secret, string(dl.Messages[0].Data), "the DLQ shows it in clear too")

	// The coalesced pop of waiting consumers decrypts as well.
	as, err := s.PopAssigned(ctx, []queue.Assignment{{Intention: 1, PartitionID: res.PartitionID, Group: queue.DefaultGroup,
		Limit: 10, Total: 10, AutoAck: true}})
	require.NoError(t, err)
	require.NotNil(t, as[1])
	assert.JSONEq(t, secret, string(as[1].Messages[0].Data))

	wrong, err := queue.New(queue.Config{Pool: plain.Pool(), EncryptionKey: bytes.Repeat([]byte{8}, 32)})
	require.NoError(t, err)
	assert.ErrorContains(t, wrong.CheckEncryption(ctx), "key check value differs")
	assert.ErrorContains(t, plain.CheckEncryption(ctx), "have encryptionEnabled but no encryption key")
}
