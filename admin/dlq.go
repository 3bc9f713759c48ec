package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/internal/httpapi"
	"github.com/heraldmq/herald/queue"
)

// The dead-letter routes: the listing (the reference server's, with
// Herald's filters), one dead letter, and Herald's own replay and purge.
// Replay and purge are admin acts; with a rights claim they reach only
// the queues and partitions the token may consume.

// dlqRoutes registers the dead-letter routes.
func (s *service) dlqRoutes() {
	s.routes.Read("GET /api/v1/dlq", "dlq", auth.RoleReadOnly, s.handleDLQ)
	s.routes.Read("GET /api/v1/dlq/{id}", "dlq_one", auth.RoleReadOnly, s.handleDLQOne)
	s.routes.Handle("POST /api/v1/dlq/replay", "dlq_replay", auth.RoleAdmin, s.handleDLQReplay)
	s.routes.Handle("POST /api/v1/dlq/purge", "dlq_purge", auth.RoleAdmin, s.handleDLQPurge)
}

type dlqMessageJSON struct {
	ConsumerGroup string      `json:"consumerGroup"`
	CreatedAt     string      `json:"createdAt"`
	Data          httpapi.Raw `json:"data"`
	ErrorMessage  *string     `json:"errorMessage"`
	FailedAt      string      `json:"failedAt"`
	ID            string      `json:"id"`    // the message's id, as the reference server's
	DLQID         string      `json:"dlqId"` // the dead letter's own id (replay, purge and GET /dlq/{dlqId} name it)
	Partition     string      `json:"partition"`
	PartitionID   string      `json:"partitionId"`
	ProducerSub   *string     `json:"producerSub"`
	Queue         string      `json:"queue"`
	RetryCount    int         `json:"retryCount"`
	TraceID       *string     `json:"traceId"`
	TransactionID string      `json:"transactionId"`
}

func dlqJSON(d queue.DeadLetter) dlqMessageJSON {
	return dlqMessageJSON{ConsumerGroup: d.Group, CreatedAt: httpapi.FormatMilli(d.CreatedAt), Data: httpapi.Raw(d.Data),
		ErrorMessage: httpapi.Nullable(d.ErrorMessage), FailedAt: httpapi.FormatMilli(d.FailedAt), ID: d.ID, DLQID: d.RowID,
		Partition: d.Partition, PartitionID: d.PartitionID, ProducerSub: httpapi.Nullable(d.ProducerSub), Queue: d.Queue,
		RetryCount: d.RetryCount, TraceID: httpapi.Nullable(d.TraceID), TransactionID: d.TransactionID}
}

func (s *service) handleDLQ(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	limit, err := httpapi.IntParam(q.Get("limit"), "limit", 1, queue.MaxDLQLimit)
	if err != nil {
		return err
	}
	offset, err := httpapi.IntParam(q.Get("offset"), "offset", 0, 1<<30)
	if err != nil {
		return err
	}
	qry := queue.DLQQuery{Queue: q.Get("queue"), Group: q.Get("consumerGroup"), Partition: q.Get("partition"),
		Error: q.Get("error"), Limit: limit, Offset: offset}
	if r := auth.RightsFrom(r.Context()); r != nil && (qry.Queue == "" || !r.MayConsume(qry.Queue, qry.Partition)) {
		return httpapi.Forbiddenf("this token may read the dead letters of queues (and partitions) it may consume only: name them")
	}
	if err := httpapi.FromTo(q, &qry.From, &qry.To); err != nil {
		return err
	}
	page, err := s.Store.DLQ(r.Context(), qry)
	if err != nil {
		return err
	}
	msgs := make([]dlqMessageJSON, len(page.Messages))
	for i, d := range page.Messages {
		msgs[i] = dlqJSON(d)
	}
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{"messages": msgs, "total": page.Total,
		"pagination": map[string]int{"limit": page.Limit, "offset": page.Offset}})
	return nil
}

// parseDLQID reads a dead letter's id: a positive decimal integer.
func parseDLQID(v string) (int64, bool) {
	id, err := strconv.ParseInt(v, 10, 64)
	return id, err == nil && id > 0 && strconv.FormatInt(id, 10) == v
}

func (s *service) handleDLQOne(w http.ResponseWriter, r *http.Request) error {
	id, ok := parseDLQID(r.PathValue("id"))
	if !ok {
		return httpapi.BadRequest("id must be a dead letter's id (a positive integer)")
	}
	d, err := s.Store.DeadLetterByID(r.Context(), id)
	if errors.Is(err, queue.ErrNotFound) {
		return httpapi.Status(http.StatusNotFound, "Dead letter not found")
	}
	if err != nil {
		return err
	}
	if !auth.RightsFrom(r.Context()).MayConsume(d.Queue, d.Partition) {
		// As if it did not exist: another tenant's ids are not confirmed.
		return httpapi.Status(http.StatusNotFound, "Dead letter not found")
	}
	httpapi.WriteJSON(w, http.StatusOK, dlqJSON(*d))
	return nil
}

// dlqAct is a parsed replay or purge body.
type dlqAct struct {
	sel queue.DLQSelection
	ids []string // ids mode: the ids as asked, each once, in order
}

// parseDLQAct reads {"ids": ["12", …]} or {"filter": {…}, "limit": n}.
// Every field is checked: an unknown one is refused, as a typo in a
// destructive act must not widen it.
func parseDLQAct(r *http.Request) (*dlqAct, error) {
	obj, err := httpapi.ReadObject(r)
	if err != nil {
		return nil, err
	}
	for k := range obj {
		if k != "ids" && k != "filter" && k != "limit" {
			return nil, httpapi.BadRequestf("unknown field %q: the body is {\"ids\": [...]} or {\"filter\": {...}, \"limit\": n}", k)
		}
	}
	rawIDs, rawFilter := obj["ids"], obj["filter"]
	act := &dlqAct{}
	switch {
	case !httpapi.IsNull(rawIDs) && !httpapi.IsNull(rawFilter):
		return nil, httpapi.BadRequestf("give either ids or filter, not both")
	case !httpapi.IsNull(rawIDs):
		if !httpapi.IsNull(obj["limit"]) {
			return nil, httpapi.BadRequestf("limit goes with filter; ids name their dead letters")
		}
		var ids []json.RawMessage
		if err := json.Unmarshal(rawIDs, &ids); err != nil {
			return nil, httpapi.BadRequestf("ids must be an array of dead-letter ids (strings)")
		}
		if len(ids) == 0 || len(ids) > queue.MaxDLQSelection {
			return nil, httpapi.BadRequestf("ids must hold 1 to %d ids", queue.MaxDLQSelection)
		}
		seen := make(map[int64]bool, len(ids))
		act.sel.IDs = make([]int64, 0, len(ids))
		for _, raw := range ids {
			var v string
			if err := json.Unmarshal(raw, &v); err != nil {
				return nil, httpapi.BadRequestf("ids must be an array of dead-letter ids (strings)")
			}
			id, ok := parseDLQID(v)
			if !ok {
				return nil, httpapi.BadRequestf("bad id %q: a dead letter's id is a positive integer", v)
			}
			if !seen[id] {
				seen[id] = true
				act.sel.IDs = append(act.sel.IDs, id)
				act.ids = append(act.ids, v)
			}
		}
	case !httpapi.IsNull(rawFilter):
		if err := parseDLQFilter(rawFilter, &act.sel.Filter); err != nil {
			return nil, err
		}
		if !httpapi.IsNull(obj["limit"]) {
			n, _, err := httpapi.IntField(obj, "limit")
			if err != nil || n < 1 || n > queue.MaxDLQSelection {
				return nil, httpapi.BadRequestf("limit must be an integer between 1 and %d", queue.MaxDLQSelection)
			}
			act.sel.Limit = n
		}
	default:
		return nil, httpapi.BadRequestf("give ids (an array of dead-letter ids) or filter (an object)")
	}
	return act, nil
}

// parseDLQFilter reads a replay or purge filter: the listing's filters.
func parseDLQFilter(raw json.RawMessage, f *queue.DLQQuery) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var in struct {
		Queue         *string `json:"queue"`
		ConsumerGroup *string `json:"consumerGroup"`
		Partition     *string `json:"partition"`
		Error         *string `json:"error"`
		From          *string `json:"from"`
		To            *string `json:"to"`
	}
	if err := dec.Decode(&in); err != nil {
		return httpapi.BadRequestf("filter must be an object of queue, consumerGroup, partition, error, from, to (strings): %v", err)
	}
	str := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	f.Queue, f.Group, f.Partition, f.Error = str(in.Queue), str(in.ConsumerGroup), str(in.Partition), str(in.Error)
	for _, t := range []struct {
		name string
		v    *string
		dst  *time.Time
	}{{"from", in.From, &f.From}, {"to", in.To, &f.To}} {
		if t.v != nil && *t.v != "" {
			at, err := time.Parse(time.RFC3339Nano, *t.v)
			if err != nil {
				return httpapi.BadRequestf("filter.%s must be an RFC3339 time", t.name)
			}
			*t.dst = at
		}
	}
	return nil
}

// authorizeDLQAct narrows act to the token's rights: a filter must name a
// queue (and partition) the token may consume; ids are checked on what
// they find (queue.DLQSelection.Allow).
func authorizeDLQAct(r *http.Request, act *dlqAct) error {
	rights := auth.RightsFrom(r.Context())
	if rights == nil {
		return nil
	}
	if act.sel.IDs == nil {
		f := act.sel.Filter
		if f.Queue == "" || !rights.MayConsume(f.Queue, f.Partition) {
			return httpapi.Forbiddenf("this token may act on the dead letters of queues (and partitions) it may consume only: name them in the filter")
		}
		return nil
	}
	act.sel.Allow = rights.MayConsume
	return nil
}

// dlqItemJSON is one dead letter's outcome.
type dlqItemJSON struct {
	ID     string  `json:"id"`
	Status string  `json:"status"`
	Reason *string `json:"reason"`
}

// dlqActAnswer writes a replay's or purge's answer: the count under
// doneKey, the skipped ones by reason, and in ids mode one item per id
// asked, in the order asked.
func dlqActAnswer(w http.ResponseWriter, act *dlqAct, res *queue.DLQActResult, doneKey string) {
	n := 0
	skipped := map[string]int{}
	byID := make(map[int64]queue.DLQOutcome, len(res.Items))
	for _, o := range res.Items {
		byID[o.ID] = o
		if o.Status == queue.DLQSkipped {
			skipped[o.Reason]++
		} else {
			n++
		}
	}
	out := map[string]any{doneKey: n, "skipped": skipped}
	if act.sel.IDs != nil {
		items := make([]dlqItemJSON, len(act.ids))
		for i, id := range act.sel.IDs {
			o := byID[id]
			items[i] = dlqItemJSON{ID: act.ids[i], Status: o.Status, Reason: httpapi.Nullable(o.Reason)}
		}
		out["items"] = items
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

func (s *service) handleDLQReplay(w http.ResponseWriter, r *http.Request) error {
	return s.dlqAct(w, r, "replayed", s.Store.ReplayDeadLetters, s.Effects.AfterReplay)
}

func (s *service) handleDLQPurge(w http.ResponseWriter, r *http.Request) error {
	return s.dlqAct(w, r, "purged", s.Store.PurgeDeadLetters, s.Effects.AfterPurge)
}

// dlqAct runs a replay or a purge: the body parsed and checked against the
// token's rights, the store's act, what follows it, the answer.
func (s *service) dlqAct(w http.ResponseWriter, r *http.Request, verb string,
	run func(context.Context, queue.DLQSelection) (*queue.DLQActResult, error), after func(*queue.DLQActResult)) error {
	act, err := parseDLQAct(r)
	if err == nil {
		err = authorizeDLQAct(r, act)
	}
	if err != nil {
		return err
	}
	res, err := run(r.Context(), act.sel)
	if err != nil {
		return err
	}
	after(res)
	dlqActAnswer(w, act, res, verb)
	return nil
}
