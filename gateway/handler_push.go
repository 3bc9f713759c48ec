package gateway

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/internal/httpapi"
	"github.com/heraldmq/herald/queue"
)

// pushQueued and pushDuplicate are the two shapes of a push result. Fields are
// in the reference server's (sorted) order; note the snake_case keys.
type pushQueued struct {
	Index         int     `json:"index"`
	MessageID     string  `json:"message_id"`
	PartitionID   string  `json:"partition_id"`
	QueueName     string  `json:"queueName"`
	Status        string  `json:"status"`
	TraceID       *string `json:"trace_id"`
	TransactionID string  `json:"transaction_id"`
}

type pushDuplicate struct {
	Index         int    `json:"index"`
	MessageID     string `json:"message_id"`
	QueueName     string `json:"queueName"`
	Status        string `json:"status"`
	TransactionID string `json:"transaction_id"`
}

// pushRejected is an item refused because its queue is full (maxSize).
type pushRejected struct {
	Error         string `json:"error"`
	Index         int    `json:"index"`
	QueueName     string `json:"queueName"`
	Status        string `json:"status"`
	TransactionID string `json:"transaction_id"`
}

func pushResultJSON(r queue.PushResult) any {
	if r.Status == queue.StatusRejected {
		return pushRejected{Error: r.Error, Index: r.Index, QueueName: r.Queue, Status: string(r.Status),
			TransactionID: r.TransactionID}
	}
	if r.Status == queue.StatusDuplicate {
		return pushDuplicate{Index: r.Index, MessageID: r.MessageID, QueueName: r.Queue,
			Status: string(r.Status), TransactionID: r.TransactionID}
	}
	return pushQueued{Index: r.Index, MessageID: r.MessageID, PartitionID: r.PartitionID, QueueName: r.Queue,
		Status: string(r.Status), TraceID: httpapi.Nullable(r.TraceID), TransactionID: r.TransactionID}
}

func (s *Server) handlePush(w http.ResponseWriter, r *http.Request) error {
	obj, err := httpapi.ReadObject(r)
	if err != nil {
		return err
	}
	arr, ok := httpapi.ArrayField(obj, "items")
	if !ok {
		return httpapi.BadRequest("items array is required")
	}
	items, err := parsePushItems(arr)
	if err != nil {
		return err
	}
	if err := checkProduce(rightsOf(r.Context()), items); err != nil {
		return err
	}
	stampProducer(r.Context(), items)
	if s.maint.push.Load() {
		return s.bufferPush(w, items)
	}
	results, err := s.store.Push(r.Context(), items)
	if err != nil {
		return err
	}
	s.afterPush(results)
	out := make([]any, len(results))
	for i, res := range results {
		out[i] = pushResultJSON(res)
	}
	httpapi.WriteJSON(w, http.StatusCreated, out)
	return nil
}

// stampProducer records the authenticated subject as every item's
// producerSub; a body cannot claim to be someone else.
func stampProducer(ctx context.Context, items []queue.PushItem) {
	if c, ok := auth.ClaimsFrom(ctx); ok {
		stampSubject(items, c.Subject)
	}
}

func stampSubject(items []queue.PushItem, sub string) {
	for i := range items {
		items[i].ProducerSub = sub
	}
}

// parsePushItems checks each item's field types, answering with the reference
// server's messages.
func parsePushItems(arr []json.RawMessage) ([]queue.PushItem, error) {
	items := make([]queue.PushItem, len(arr))
	for i, raw := range arr {
		var f pushItemJSON
		if !f.decode(raw) {
			return nil, httpapi.BadRequestf("Each item must be an object")
		}
		q, present, err := httpapi.StringValue(f.Queue, "queue")
		if err != nil || !present {
			return nil, httpapi.BadRequestf("Queue must be a string")
		}
		it := queue.PushItem{Queue: q}
		if it.Partition, _, err = httpapi.StringValue(f.Partition, "partition"); err != nil {
			return nil, httpapi.BadRequestf("Partition must be a string")
		}
		if it.TransactionID, _, err = httpapi.StringValue(f.TransactionID, "transactionId"); err != nil {
			return nil, httpapi.BadRequestf("TransactionId must be a string")
		}
		if it.TraceID, _, err = httpapi.StringValue(f.TraceID, "traceId"); err != nil {
			return nil, httpapi.BadRequestf("TraceId must be a string")
		}
		it.Payload = f.Payload // JSON null stays null ("null"); absent stays nil ({})
		items[i] = it
	}
	return items, nil
}

// pushItemJSON holds the fields of a push item, undecoded: a struct, not a
// map per item.
type pushItemJSON struct {
	Queue, Partition, TransactionID, TraceID, Payload json.RawMessage
}

// pushItemNames are the members of a push item that pushItemJSON holds.
var pushItemNames = []string{"queue", "partition", "transactionId", "traceId", "payload"}

// decode reads a push item's fields from raw, a JSON object, matching
// names exactly (see eachMember); false when raw is not an object.
func (f *pushItemJSON) decode(raw json.RawMessage) bool {
	return membersInto(raw, pushItemNames, &f.Queue, &f.Partition, &f.TransactionID, &f.TraceID, &f.Payload)
}

// RetryAfterUnavailable is the Retry-After (seconds) of a 503 answered
// because the database is unreachable (httpapi.RetryAfterUnavailable).
const RetryAfterUnavailable = httpapi.RetryAfterUnavailable

// ErrTextUnavailable is the error of that 503, on HTTP and in WebSocket
// error frames (code "unavailable").
const ErrTextUnavailable = httpapi.ErrTextUnavailable
