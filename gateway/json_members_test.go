package gateway

import (
	"encoding/json"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// Push and ack items were decoded into structs by
// encoding/json, which matches names without regard to case: "Queue",
// "PAYLOAD" or "STATUS" were read as queue, payload and status. The
// reference server (JSON.parse) takes a name as written: a name spelt
// otherwise is an unknown field, ignored (docs/api.md, General rules).
func TestJSON_ItemFieldNamesAreCaseSensitive(t *testing.T) {
	t.Run("PushItems", func(t *testing.T) {
		items, err := parsePushItems([]json.RawMessage{
			[]byte(`{"queue":"q","PAYLOAD":{"a":1},"Partition":"p","TRANSACTIONID":"t","traceid":"x"}`),
		})
		require.NoError(t, err)
		assert.Equal(t, queue.PushItem{Queue: "q"}, items[0], "wrongly cased fields are unknown fields")
		_, err = parsePushItems([]json.RawMessage{[]byte(`{"Queue":"q","payload":1}`)})
		assert.EqualError(t, err, "Queue must be a string", "a push item whose queue is spelt Queue has none")
	})
	t.Run("AckItems", func(t *testing.T) {
		acks, subs, err := parseWSAcks(json.RawMessage(
			`[{"transactionId":"t","partitionId":"p","STATUS":"failed","LeaseId":"l","Sub":"s","ConsumerGroup":"g"}]`))
		require.NoError(t, err)
		assert.Equal(t, queue.Ack{TransactionID: "t", PartitionID: "p", Status: queue.StatusCompleted}, acks[0])
		assert.Equal(t, []string{""}, subs)
		_, _, err = parseWSAcks(json.RawMessage(`[{"TransactionId":"t","partitionId":"p"}]`))
		assert.EqualError(t, err, "Each acknowledgment must have a transactionId string")
		var it ackItemJSON // the HTTP batch's items
		require.True(t, it.decode(json.RawMessage(`{"Status":"dlq","status":"retry"}`)))
		assert.Equal(t, `"retry"`, string(it.Status))
	})
	t.Run("NamesAsJSONParseReadsThem", func(t *testing.T) {
		// Escapes spell the name they decode to; of two equal names the
		// later wins.
		items, err := parsePushItems([]json.RawMessage{[]byte(`{"\u0071ueue":"q","partition":"a","partition":"b"}`)})
		require.NoError(t, err)
		assert.Equal(t, queue.PushItem{Queue: "q", Partition: "b"}, items[0])
	})
	t.Run("NotObjects", func(t *testing.T) {
		for _, bad := range []string{`{"a":1}`, `[1]`, `[]`, `null`, `[null]`} {
			_, _, err := parseWSAcks(json.RawMessage(bad))
			assert.EqualError(t, err, "items must be a non-empty array of acknowledgements", bad)
		}
	})
}

// FuzzEachMember: on any JSON object, eachMember sees what a map decode
// keeps (names matched exactly, the last of equal names winning).
func FuzzEachMember(f *testing.F) {
	for _, s := range []string{`{}`, ` { "a" : 1 , "b":[1,{"c":"}"}],"a":"x\"y"} `, `{"\u0061":null,"A":true}`,
		`{"q":{"x":[[]]},"e":"\\"}`, `[1]`, `{"a":1}x`, `{"a"}`, `{"a":1,}`, `"x"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got := map[string]string{}
		ok := eachMember(raw, func(name []byte, v json.RawMessage) { got[string(name)] = string(v) })
		if !json.Valid(raw) || !utf8.Valid(raw) {
			return // any answer, as long as it did not panic
		}
		var want map[string]json.RawMessage
		isObject := json.Unmarshal(raw, &want) == nil && want != nil
		require.Equal(t, isObject, ok, "%s", raw)
		if !ok {
			return
		}
		require.Len(t, got, len(want))
		for k, v := range want {
			require.Equal(t, string(v), got[k], "%s: member %q", raw, k)
		}
	})
}
