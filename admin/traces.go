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
	t.PartitionID, err = s.hide(r.Context(), auth.RightsFrom(r.Context()), t.PartitionID) // not found, as an unknown one
	if err != nil {
		return err
	}
	res, err := s.store.RecordTrace(r.Context(), t)
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
	pid, err := s.hide(r.Context(), auth.RightsFrom(r.Context()), pid) // no traces, as of an unknown one
	if err != nil {
		return err
	}
	traces, err := s.store.TracesOf(r.Context(), pid, txid)
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
	q := r.URL.Query()
	qry := queue.TraceQuery{Name: r.PathValue("name")}
	var err error
	if qry.Limit, qry.Offset, err = tracePage(q.Get("limit"), q.Get("offset")); err != nil {
		return err
	}
	if err := httpapi.FromTo(q, &qry.From, &qry.To); err != nil {
		return err
	}
	qry.PartitionMatch = consumeMatch(auth.RightsFrom(r.Context()))
	page, err := s.store.TracesByName(r.Context(), qry)
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
	httpapi.WriteJSON(w, http.StatusOK, struct {
		Pagination tracePaginationJSON `json:"pagination"`
		Total      int64               `json:"total"`
		Traces     []namedTraceJSON    `json:"traces"`
	}{tracePaginationJSON{page.Limit, page.Offset}, page.Total, out})
	return nil
}

// handleTraceNames lists the trace names, most recently seen first.
func (s *service) handleTraceNames(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	var qry queue.TraceNamesQuery
	var err error
	if qry.Limit, qry.Offset, err = tracePage(q.Get("limit"), q.Get("offset")); err != nil {
		return err
	}
	qry.PartitionMatch = consumeMatch(auth.RightsFrom(r.Context()))
	page, err := s.store.TraceNames(r.Context(), qry)
	if err != nil {
		return err
	}
	out := make([]traceNameJSON, len(page.Names))
	for i, n := range page.Names {
		out[i] = traceNameJSON{LastSeen: httpapi.FormatMilli(n.LastSeen), MessageCount: n.Messages, TraceCount: n.Traces,
			TraceName: n.Name}
	}
	httpapi.WriteJSON(w, http.StatusOK, struct {
		Pagination tracePaginationJSON `json:"pagination"`
		Total      int64               `json:"total"`
		TraceNames []traceNameJSON     `json:"trace_names"`
	}{tracePaginationJSON{page.Limit, page.Offset}, page.Total, out})
	return nil
}

// tracePage reads limit (1 to queue.MaxTraceLimit; absent: 0, the
// store's default) and offset (0 or more).
func tracePage(limit, offset string) (int, int, error) {
	l, err := httpapi.IntParam(limit, "limit", 1, queue.MaxTraceLimit)
	if err != nil {
		return 0, 0, err
	}
	o, err := httpapi.IntParam(offset, "offset", 0, 1<<30)
	return l, o, err
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
