package admin

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/internal/httpapi"
	"github.com/heraldmq/herald/queue"
)

// traceRoutes registers the routes of traces: record and read notes attached to messages.
func (s *service) traceRoutes() {
	s.routes.Handle("POST /api/v1/traces", "traces_record", auth.RoleReadWrite, s.handleRecordTrace)
	s.routes.Read("GET /api/v1/traces/names", "traces_names", auth.RoleReadOnly, s.handleTraceNames)
	s.routes.Read("GET /api/v1/traces/by-name/{name}", "traces_by_name", auth.RoleReadOnly, s.handleTracesByName)
	s.routes.Read("GET /api/v1/traces/{partitionId}/{transactionId}", "traces_of_message", auth.RoleReadOnly, s.handleTracesOf)
}

// The answers' items, keys in the reference server's (sorted) order.
type (
	traceJSON struct {
		ConsumerGroup string      `json:"consumer_group"`
		CreatedAt     string      `json:"created_at"`
		Data          httpapi.Raw `json:"data"`
		EventType     string      `json:"event_type"`
		ID            string      `json:"id"`
		TraceNames    []string    `json:"trace_names"`
		WorkerID      string      `json:"worker_id"`
	}
	namedTraceJSON struct {
		ConsumerGroup  string      `json:"consumer_group"`
		CreatedAt      string      `json:"created_at"`
		Data           httpapi.Raw `json:"data"`
		EventType      string      `json:"event_type"`
		ID             string      `json:"id"`
		MessagePayload httpapi.Raw `json:"message_payload"`
		PartitionID    string      `json:"partition_id"`
		PartitionName  string      `json:"partition_name"`
		QueueName      string      `json:"queue_name"`
		TraceNames     []string    `json:"trace_names"`
		TransactionID  string      `json:"transaction_id"`
		WorkerID       string      `json:"worker_id"`
	}
	traceNameJSON struct {
		LastSeen     string `json:"last_seen"`
		MessageCount int64  `json:"message_count"`
		TraceCount   int64  `json:"trace_count"`
		TraceName    string `json:"trace_name"`
	}
	tracePaginationJSON struct {
		Limit  int `json:"limit"`
		Offset int `json:"offset"`
	}
)

// handleRecordTrace records a trace about one message: 201 with its id,
// 404 when the message does not exist.
func (s *service) handleRecordTrace(w http.ResponseWriter, r *http.Request) error {
	obj, err := httpapi.ReadObject(r)
	if err != nil {
		return err
	}
	var t queue.NewTrace
	for _, f := range []struct {
		key string
		dst *string
	}{{"transactionId", &t.TransactionID}, {"partitionId", &t.PartitionID},
		{"consumerGroup", &t.Group}, {"eventType", &t.EventType}} {
		// consumerGroup and eventType: null or absent is the default.
		if *f.dst, _, err = httpapi.StringField(obj, f.key); err != nil {
			return httpapi.BadRequestf("%v", err)
		}
	}
	if t.TransactionID == "" || t.PartitionID == "" {
		return httpapi.BadRequest("transactionId and partitionId are required")
	}
	data, ok := obj["data"]
	if !ok {
		return httpapi.BadRequest("data is required")
	}
	t.Data = data
	if t.Names, err = traceNamesField(obj["traceNames"]); err != nil {
		return err
	}
	t.PartitionID, err = s.Hide(r.Context(), auth.RightsFrom(r.Context()), t.PartitionID) // not found, as an unknown one
	if err != nil {
		return err
	}
	res, err := s.Store.RecordTrace(r.Context(), t)
	if err != nil {
		return err
	}
	if !res.Found {
		return httpapi.Status(http.StatusNotFound, "Message not found")
	}
	httpapi.WriteJSON(w, http.StatusCreated, map[string]any{"success": true, "traceId": res.ID})
	return nil
}

// traceNamesField reads traceNames: a string (one name), an array of
// strings, or null/absent (none).
func traceNamesField(raw json.RawMessage) ([]string, error) {
	if httpapi.IsNull(raw) {
		return nil, nil
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return []string{one}, nil
	}
	var names []string
	if err := json.Unmarshal(raw, &names); err != nil {
		return nil, httpapi.BadRequestf("traceNames must be a string or an array of strings")
	}
	return names, nil
}

// handleTracesOf lists the traces of one message, oldest first.
func (s *service) handleTracesOf(w http.ResponseWriter, r *http.Request) error {
	pid, txid := r.PathValue("partitionId"), r.PathValue("transactionId")
	pid, err := s.Hide(r.Context(), auth.RightsFrom(r.Context()), pid) // no traces, as of an unknown one
	if err != nil {
		return err
	}
	traces, err := s.Store.TracesOf(r.Context(), pid, txid)
	if err != nil {
		return err
	}
	out := make([]traceJSON, len(traces))
	for i, t := range traces {
		out[i] = traceJSON{ConsumerGroup: t.Group, CreatedAt: httpapi.FormatMilli(t.CreatedAt), Data: httpapi.Raw(t.Data),
			EventType: t.EventType, ID: t.ID, TraceNames: t.Names, WorkerID: t.WorkerID}
	}
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{"traces": out})
	return nil
}

// handleTracesByName lists the traces carrying a name, oldest first, a page
// at a time (limit, offset), optionally within [from, to).
func (s *service) handleTracesByName(w http.ResponseWriter, r *http.Request) error {
	qry := queue.TraceQuery{Name: r.PathValue("name")}
	var err error
	if qry.Limit, qry.Offset, qry.PartitionMatch, err = tracePage(r); err != nil {
		return err
	}
	if err := httpapi.FromTo(r.URL.Query(), &qry.From, &qry.To); err != nil {
		return err
	}
	page, err := s.Store.TracesByName(r.Context(), qry)
	if err != nil {
		return err
	}
	out := make([]namedTraceJSON, len(page.Traces))
	for i, t := range page.Traces {
		out[i] = namedTraceJSON{ConsumerGroup: t.Group, CreatedAt: httpapi.FormatMilli(t.CreatedAt), Data: httpapi.Raw(t.Data),
			EventType: t.EventType, ID: t.ID, MessagePayload: httpapi.Raw(t.MessagePayload), PartitionID: t.PartitionID,
			PartitionName: t.Partition, QueueName: t.Queue, TraceNames: t.Names, TransactionID: t.TransactionID,
			WorkerID: t.WorkerID}
	}
	writeTracePage(w, page.Limit, page.Offset, page.Total, "traces", out)
	return nil
}

// handleTraceNames lists the trace names, most recently seen first.
func (s *service) handleTraceNames(w http.ResponseWriter, r *http.Request) error {
	var qry queue.TraceNamesQuery
	var err error
	if qry.Limit, qry.Offset, qry.PartitionMatch, err = tracePage(r); err != nil {
		return err
	}
	page, err := s.Store.TraceNames(r.Context(), qry)
	if err != nil {
		return err
	}
	out := make([]traceNameJSON, len(page.Names))
	for i, n := range page.Names {
		out[i] = traceNameJSON{LastSeen: httpapi.FormatMilli(n.LastSeen), MessageCount: n.Messages, TraceCount: n.Traces,
			TraceName: n.Name}
	}
	writeTracePage(w, page.Limit, page.Offset, page.Total, "trace_names", out)
	return nil
}

// tracePage reads what every trace read by name or of the names takes:
// limit (1 to queue.MaxTraceLimit; absent: 0, the store's default), offset
// (0 or more) and the partitions the request's rights let it see
// (consumeMatch).
func tracePage(r *http.Request) (limit, offset int, match string, err error) {
	q := r.URL.Query()
	if limit, err = httpapi.IntParam(q.Get("limit"), "limit", 1, queue.MaxTraceLimit); err != nil {
		return 0, 0, "", err
	}
	if offset, err = httpapi.IntParam(q.Get("offset"), "offset", 0, 1<<30); err != nil {
		return 0, 0, "", err
	}
	return limit, offset, consumeMatch(auth.RightsFrom(r.Context())), nil
}

// writeTracePage answers a page of a trace read: its pagination, the total
// and the items under key (the keys sort as the reference server's do).
func writeTracePage[T any](w http.ResponseWriter, limit, offset int, total int64, key string, items []T) {
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{"pagination": tracePaginationJSON{limit, offset}, "total": total,
		key: items})
}

// consumeMatch is a PostgreSQL regular expression over "queue" +
// queue.PartitionMatchSep + "partition" that matches the partitions r lets
// its bearer consume (the store's PartitionMatch). Trace reads by name and
// the names list filter with it: a token limited to some partitions sees,
// and counts, only the traces on those. Rights nil (no token: auth off):
// "", no filter.
func consumeMatch(r *auth.Rights) string {
	if r == nil {
		return ""
	}
	alts := make([]string, 0, len(r.Consume))
	for _, p := range r.Consume {
		q, part, two := strings.Cut(p, "/")
		if !two {
			part = "*" // "queue": every partition of it
		}
		alts = append(alts, auth.GlobRegexp(q)+queue.PartitionMatchSep+auth.GlobRegexp(part))
	}
	if len(alts) == 0 {
		// No pattern: nothing. "queue<sep>partition" is never empty.
		return "^$"
	}
	return "^(?:" + strings.Join(alts, "|") + ")$"
}
