package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/heraldmq/herald/auth"
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
		Status: string(r.Status), TraceID: nullable(r.TraceID), TransactionID: r.TransactionID}
}

func (s *Server) handlePush(w http.ResponseWriter, r *http.Request) {
	obj, err := readObject(r)
	if err != nil {
		s.fail(w, err)
		return
	}
	arr, ok := arrayField(obj, "items")
	if !ok {
		writeError(w, http.StatusBadRequest, "items array is required")
		return
	}
	items, err := parsePushItems(arr)
	if err != nil {
		s.fail(w, err)
		return
	}
	if err := checkProduce(rightsOf(r.Context()), items); err != nil {
		s.fail(w, err)
		return
	}
	stampProducer(r.Context(), items)
	if s.maint.push.Load() {
		s.bufferPush(w, items) // push maintenance: to disk, not to the database
		return
	}
	results, err := s.store.Push(r.Context(), items)
	if err != nil {
		s.fail(w, err)
		return
	}
	s.afterPush(results)
	out := make([]any, len(results))
	for i, res := range results {
		out[i] = pushResultJSON(res)
	}
	writeJSON(w, http.StatusCreated, out)
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
			return nil, badRequestf("Each item must be an object")
		}
		q, present, err := stringValue(f.Queue, "queue")
		if err != nil || !present {
			return nil, badRequestf("Queue must be a string")
		}
		it := queue.PushItem{Queue: q}
		if it.Partition, _, err = stringValue(f.Partition, "partition"); err != nil {
			return nil, badRequestf("Partition must be a string")
		}
		if it.TransactionID, _, err = stringValue(f.TransactionID, "transactionId"); err != nil {
			return nil, badRequestf("TransactionId must be a string")
		}
		if it.TraceID, _, err = stringValue(f.TraceID, "traceId"); err != nil {
			return nil, badRequestf("TraceId must be a string")
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

// decode reads a push item's fields from raw, a JSON object, matching
// names exactly (see eachMember); false when raw is not an object.
func (f *pushItemJSON) decode(raw json.RawMessage) bool {
	return eachMember(raw, func(name []byte, v json.RawMessage) {
		switch string(name) {
		case "queue":
			f.Queue = v
		case "partition":
			f.Partition = v
		case "transactionId":
			f.TransactionID = v
		case "traceId":
			f.TraceID = v
		case "payload":
			f.Payload = v
		}
	})
}

// RetryAfterUnavailable is the Retry-After (seconds) of a 503 answered
// because the database is unreachable (queue.IsUnavailable): a failover
// takes seconds, and a client that comes back sooner only adds load.
const RetryAfterUnavailable = 2

// ErrTextUnavailable is the error of that 503, on HTTP and in WebSocket
// error frames (code "unavailable").
const ErrTextUnavailable = "database unavailable: try again shortly"

// fail answers an error: client mistakes 4xx with their message; the
// database unreachable 503 with Retry-After (logged once per outage, see
// queue.OutageLog); anything else 500 with a generic text (the details go
// to the log).
func (s *Server) fail(w http.ResponseWriter, err error) {
	var br *badRequest
	switch {
	case errors.As(err, &br):
		writeError(w, br.status, br.msg)
	case queue.IsInputError(err):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, queue.ErrForeign):
		writeError(w, http.StatusForbidden, err.Error())
	case errors.Is(err, errRequestCanceled):
		// The client went away; nobody reads the answer.
		w.WriteHeader(499)
	case queue.IsUnavailable(err):
		s.metrics.history.dbError()
		s.outage.Fail(err, "request failed")
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfterUnavailable))
		writeError(w, http.StatusServiceUnavailable, ErrTextUnavailable)
	default:
		// The details (SQL, driver errors) go to the log, not to the client.
		s.metrics.history.dbError()
		s.log.Error().Err(err).Msg("request failed")
		writeError(w, http.StatusInternalServerError, "internal server error")
	}
}
