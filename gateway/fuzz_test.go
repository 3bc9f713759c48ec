package gateway

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/heraldmq/herald/internal/httpapi"
	"github.com/heraldmq/herald/queue"
)

// FuzzRequestBodies feeds arbitrary bodies to the request decoders of push,
// ack and transaction: they must answer an error or a value, never panic,
// and every accepted push item must name a queue.
func FuzzRequestBodies(f *testing.F) {
	for _, seed := range []string{
		`{"items":[{"queue":"q","payload":{"orderId":1}}]}`,
		`{"items":[{"queue":"q","partition":"p","transactionId":"t","traceId":"8f3c1e2a-0000-4000-8000-000000000001","payload":null}]}`,
		`{"items":[]}`, `{"items":{}}`, `{"items":[1]}`, `{}`, `null`, `[]`, ``, `{not json`,
		`{"transactionId":"t","partitionId":"p","status":"failed","error":"x"}`,
		`{"acknowledgments":[{"transactionId":"t","partitionId":"p"}],"consumerGroup":"g"}`,
		`{"operations":[{"type":"push","items":[{"queue":"q"}]},{"type":"ack","transactionId":"t","partitionId":"p"}]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequest("POST", "/api/v1/push", bytes.NewReader(body))
		obj, err := httpapi.ReadObject(r)
		if err != nil {
			return
		}
		if arr, ok := httpapi.ArrayField(obj, "items"); ok {
			if items, err := parsePushItems(arr); err == nil {
				for _, it := range items {
					if it.Queue == "" && !json.Valid(body) {
						t.Fatalf("accepted an item without a queue from invalid JSON %q", body)
					}
				}
			}
		}
		_, _ = parseAck(obj, true)
		_, _ = parseAck(obj, false)
		if arr, ok := httpapi.ArrayField(obj, "acknowledgments"); ok {
			for _, raw := range arr {
				if item, ok := httpapi.ObjectOf(raw); ok {
					_, _ = parseAck(item, false)
				}
			}
		}
	})
}

// FuzzWSFrame feeds arbitrary WebSocket text frames to the frame decoders:
// a frame decodes or is refused, never panics, and every accepted ack names
// its message.
func FuzzWSFrame(f *testing.F) {
	for _, seed := range []string{
		`{"type":"subscribe","id":1,"queue":"q","batch":10,"maxInFlight":100,"autoAck":false}`,
		`{"type":"ack","id":"a","items":[{"transactionId":"t","partitionId":"p","leaseId":"l","status":"failed","error":"x"}]}`,
		`{"type":"push","items":[{"queue":"q","payload":{"n":1}}]}`,
		`{"type":"renew","leaseId":"l","seconds":30}`, `{"type":"ping"}`, `{"type":"unsubscribe","sub":"s1"}`,
		`{"type":"ack","items":[]}`, `{"type":"ack","items":{}}`, `[1]`, `{`, `null`, `{"type":5}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var fr wsFrame
		if json.Unmarshal(data, &fr) != nil {
			return
		}
		if acks, subs, err := parseWSAcks(fr.Items); err == nil {
			if len(subs) != len(acks) {
				t.Fatalf("%d subs for %d acks", len(subs), len(acks))
			}
			for _, a := range acks {
				if a.TransactionID == "" || a.PartitionID == "" {
					t.Fatalf("accepted an ack without its message: %+v", a)
				}
			}
		}
		_, _ = parseWSPush(fr.Items)
		req := queue.PopRequest{Queue: fr.Queue, Partition: fr.Partition, Group: fr.ConsumerGroup,
			SubscriptionMode: fr.SubscriptionMode, SubscriptionFrom: fr.SubscriptionFrom}
		_ = req.Validate()
	})
}
