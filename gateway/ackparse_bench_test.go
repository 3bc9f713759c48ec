package gateway

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// BenchmarkParseWSAcks: an ack frame of 100 items, as the Go SDK sends
// them under load.
func BenchmarkParseWSAcks(b *testing.B) {
	items := make([]string, 100)
	for i := range items {
		items[i] = fmt.Sprintf(`{"transactionId":"0199a0b1-7c3e-7a10-8f00-%012d","partitionId":"0199a0b1-7c3e-7a10-8f00-000000000001","leaseId":"0199a0b1-7c3e-7a10-8f00-000000000002","status":"completed","sub":"s1"}`, i)
	}
	raw := json.RawMessage("[" + strings.Join(items, ",") + "]")
	b.ReportAllocs()
	for b.Loop() {
		acks, _, err := parseWSAcks(raw)
		if err != nil || len(acks) != 100 {
			b.Fatal(err)
		}
	}
}

// BenchmarkParsePushItems: a push of 100 items.
func BenchmarkParsePushItems(b *testing.B) {
	arr := make([]json.RawMessage, 100)
	for i := range arr {
		arr[i] = json.RawMessage(fmt.Sprintf(`{"queue":"orders","partition":"p%d","payload":{"n":%d,"text":"0123456789012345678901234567890123456789"}}`, i%16, i))
	}
	b.ReportAllocs()
	for b.Loop() {
		items, err := parsePushItems(arr)
		if err != nil || len(items) != 100 {
			b.Fatal(err)
		}
	}
}

// A push item's payload: JSON null is kept as null, an absent one as nil.
func TestParsePushItems_PayloadNullAndAbsent(t *testing.T) {
	items, err := parsePushItems([]json.RawMessage{[]byte(`{"queue":"q","payload":null}`), []byte(`{"queue":"q"}`),
		[]byte(` {"queue":"q","payload":{"a":1}}`)})
	if err != nil {
		t.Fatal(err)
	}
	if string(items[0].Payload) != "null" || items[1].Payload != nil || string(items[2].Payload) != `{"a":1}` {
		t.Fatalf("payloads %q %q %q", items[0].Payload, items[1].Payload, items[2].Payload)
	}
	for _, bad := range []string{`null`, `1`, `"x"`, `[]`} {
		if _, err := parsePushItems([]json.RawMessage{[]byte(bad)}); err == nil || !strings.Contains(err.Error(), "Each item must be an object") {
			t.Fatalf("%s: %v", bad, err)
		}
	}
}
