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
