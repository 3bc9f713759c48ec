package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/heraldmq/herald/queue"
)

func (s *Server) handleConfigure(w http.ResponseWriter, r *http.Request) {
	obj, err := readObject(r)
	if err != nil {
		s.fail(w, err)
		return
	}
	name, ok, err := stringField(obj, "queue")
	if err != nil || !ok || name == "" {
		writeError(w, http.StatusBadRequest, "queue is required")
		return
	}
	if r := rightsOf(r.Context()); r != nil && !r.MayProduce(name, "") {
		s.fail(w, forbidden("this token may configure only queues it may produce to whole: not %s", name))
		return
	}
	req := queue.ConfigureRequest{Queue: name}
	if req.Namespace, _, err = stringField(obj, "namespace"); err != nil {
		s.fail(w, badRequestf("%v", err))
		return
	}
	if req.Task, _, err = stringField(obj, "task"); err != nil {
		s.fail(w, badRequestf("%v", err))
		return
	}
	mode, _, err := stringField(obj, "mode")
	if err != nil || (mode != "" && mode != "merge" && mode != "replace") {
		s.fail(w, badRequestf("mode must be merge or replace"))
		return
	}
	req.Replace = mode == "replace"
	if raw := obj["options"]; !isNull(raw) {
		// Named options change; the others keep their stored values
		// (defaults for a new queue, or with mode "replace").
		if _, ok := objectOf(raw); !ok {
			s.fail(w, badRequestf("options must be an object"))
			return
		}
		req.Options = raw
	}
	res, err := s.store.Configure(r.Context(), req)
	if err != nil {
		s.fail(w, err)
		return
	}
	if f := s.cfg.OnQueueConfigured; f != nil {
		f(res.Info()) // other instances cache the new settings
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"configured": true, "queueId": res.QueueID, "partitionId": res.PartitionID, "queue": res.Queue,
		"namespace": res.Namespace, "task": res.Task, "options": sortedObject(res.Options),
	})
}

// sortedObject re-encodes v through a map so its keys come out sorted, as the
// reference server writes them.
func sortedObject(v any) map[string]any {
	b, _ := json.Marshal(v)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return m
}

func (s *Server) handleDeleteQueue(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("queue")
	if r := rightsOf(r.Context()); r != nil && !r.MayProduce(name, "") {
		s.fail(w, forbidden("this token may delete only queues it may produce to whole: not %s", name))
		return
	}
	existed, err := s.store.DeleteQueue(r.Context(), name)
	if err != nil {
		s.fail(w, err)
		return
	}
	if f := s.cfg.OnQueueDeleted; f != nil {
		f(name) // other instances drop what they cached of it
	}
	writeJSON(w, http.StatusOK, map[string]any{"deleted": true, "existed": existed, "queue": name})
}

type extendJSON struct {
	Error     *string `json:"error"`
	ExpiresAt *string `json:"expiresAt"`
	Index     int     `json:"index"`
	LeaseID   string  `json:"leaseId"`
	Success   bool    `json:"success"`
}

// extendResultJSON is a lease extension's answer, for HTTP and the
// WebSocket renew alike.
func extendResultJSON(res *queue.ExtendResult) extendJSON {
	out := extendJSON{Error: nullable(res.Error), LeaseID: res.LeaseID, Success: res.Success}
	if res.Success {
		t := formatMilli(res.ExpiresAt)
		out.ExpiresAt = &t
	}
	return out
}

func (s *Server) handleLeaseExtend(w http.ResponseWriter, r *http.Request) {
	seconds := 0
	// The body is optional: {} and an empty body both mean the queue's lease time.
	if r.ContentLength != 0 {
		obj, err := readObject(r)
		if err != nil {
			if br, ok := err.(*badRequest); !ok || br.msg != "Empty request body" {
				s.fail(w, err)
				return
			}
		}
		if obj != nil {
			if seconds, _, err = intField(obj, "seconds"); err != nil {
				writeError(w, http.StatusBadRequest, fmt.Sprintf("seconds must be an integer between 0 and %d (a day)", queue.MaxLeaseSeconds))
				return
			}
		}
	}
	leaseID := r.PathValue("leaseId")
	lease, err := s.hideLease(r.Context(), rightsOf(r.Context()), leaseID)
	if err != nil {
		s.fail(w, err)
		return
	}
	res, err := s.store.ExtendLease(r.Context(), lease, seconds, holderOf(r.Context()))
	if err != nil {
		s.fail(w, err)
		return
	}
	res.LeaseID = leaseID // the id asked about, hidden or not
	status := http.StatusOK
	if res.Error == queue.ErrTextLeaseForeign {
		status = http.StatusForbidden
	}
	writeJSON(w, status, []extendJSON{extendResultJSON(res)})
}

func (s *Server) handleTransaction(w http.ResponseWriter, r *http.Request) {
	obj, err := readObject(r)
	if err != nil {
		s.fail(w, err)
		return
	}
	arr, ok := arrayField(obj, "operations")
	if !ok || len(arr) == 0 {
		writeError(w, http.StatusBadRequest, "operations array cannot be empty")
		return
	}
	ops := make([]queue.TxOp, len(arr))
	for i, raw := range arr {
		op, ok := objectOf(raw)
		if !ok {
			writeError(w, http.StatusBadRequest, "Each operation must be an object")
			return
		}
		typ, _, _ := stringField(op, "type")
		ops[i].Type = typ
		switch typ {
		case "push":
			items, ok := arrayField(op, "items")
			if !ok {
				writeError(w, http.StatusBadRequest, "push operation requires an items array")
				return
			}
			if ops[i].Items, err = parsePushItems(items); err != nil {
				s.fail(w, err)
				return
			}
			if err := checkProduce(rightsOf(r.Context()), ops[i].Items); err != nil {
				s.fail(w, err)
				return
			}
			stampProducer(r.Context(), ops[i].Items)
		case "ack":
			if ops[i].Ack, err = parseAck(op, true); err != nil {
				s.fail(w, err)
				return
			}
			acks := []queue.Ack{ops[i].Ack}
			if err := s.hideAcks(r.Context(), rightsOf(r.Context()), acks); err != nil {
				s.fail(w, err)
				return
			}
			ops[i].Ack = acks[0]
		default:
			writeError(w, http.StatusBadRequest, "operation type must be push or ack")
			return
		}
	}
	// Newer clients gate a transaction on key-value preconditions or add
	// timers; committing without them would break the gate, so refuse.
	for _, key := range []string{"kv", "timers"} {
		if arr, ok := arrayField(obj, key); ok && len(arr) > 0 {
			writeError(w, http.StatusBadRequest, key+" operations are not supported by this server")
			return
		}
	}
	var leases []string
	if raw := obj["requiredLeases"]; !isNull(raw) {
		if err := json.Unmarshal(raw, &leases); err != nil {
			writeError(w, http.StatusBadRequest, "requiredLeases must be an array of strings")
			return
		}
	}
	required, err := s.hideLeases(r.Context(), rightsOf(r.Context()), leases)
	if err != nil {
		s.fail(w, err)
		return
	}
	res, err := s.store.Transaction(r.Context(), ops, required, holderOf(r.Context()))
	if err != nil {
		if queue.OutcomeUnknown(err) {
			var acks []queue.Ack
			for _, op := range ops {
				if op.Type == "ack" {
					acks = append(acks, op.Ack)
				}
			}
			s.poller.AckLost(acks) // it may have committed: wake what its acks freed
		}
		s.fail(w, err)
		return
	}
	if strings.HasSuffix(res.Error, ": "+nowhere) {
		// The first lease hidden failed the check, as an unknown one does
		// (the leases before it passed): name it as it was asked.
		for i, l := range required {
			if l == nowhere && leases[i] != nowhere {
				res.Error = strings.TrimSuffix(res.Error, nowhere) + leases[i]
				break
			}
		}
	}
	results := make([]map[string]any, len(res.Results))
	for i, or := range res.Results {
		switch {
		case or.Push != nil && or.Push.Status == queue.StatusRejected:
			// The item maxSize refused, which failed the transaction: no
			// message, so no ids.
			p := or.Push
			results[i] = map[string]any{"index": or.Index, "type": "push", "success": false, "status": p.Status,
				"error": p.Error, "queueName": p.Queue, "transactionId": p.TransactionID}
		case or.Push != nil:
			p := or.Push
			results[i] = map[string]any{"index": or.Index, "type": "push", "success": true, "status": p.Status,
				"messageId": p.MessageID, "partitionId": p.PartitionID, "queueName": p.Queue, "transactionId": p.TransactionID}
		case or.Ack != nil:
			a := or.Ack
			results[i] = map[string]any{"index": or.Index, "type": "ack", "success": a.Success, "dlq": a.DLQ,
				"error": nullable(a.Error), "transactionId": a.TransactionID}
		}
	}
	out := map[string]any{"transactionId": res.TransactionID, "success": res.Success, "results": results}
	if !res.Success {
		out["error"] = res.Error
	} else {
		var pushed []queue.PushResult
		var acked []queue.AckResult
		for _, or := range res.Results {
			if or.Push != nil {
				pushed = append(pushed, *or.Push)
			}
			if or.Ack != nil {
				acked = append(acked, *or.Ack)
			}
		}
		var acks []queue.Ack // in the order of their results
		for _, op := range ops {
			if op.Type == "ack" {
				acks = append(acks, op.Ack)
			}
		}
		s.afterPush(pushed)
		s.afterAck(acks, acked)
		touched := map[string]bool{}
		for _, p := range pushed {
			touched[p.Queue] = true
		}
		for _, a := range acked {
			touched[a.Queue] = true
		}
		for q := range touched {
			if q != "" {
				s.metrics.history.transaction(q)
			}
		}
	}
	status := http.StatusOK
	if res.Forbidden {
		status = http.StatusForbidden
	}
	writeJSON(w, status, out)
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	out := map[string]any{"version": s.cfg.Version}
	// The HTTP connections admitted and open, and the cap (0: none).
	out["connections"], out["maxConnections"] = s.Connections()
	if s.cfg.Database != nil {
		restarting, restarts := s.cfg.Database()
		out["restarts"] = restarts
		if restarting { // no ping: it cannot answer, and a pool dial would only wait
			out["status"], out["database"] = "unhealthy", "restarting"
			writeJSON(w, http.StatusServiceUnavailable, out)
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.store.Ping(ctx); err != nil {
		out["status"], out["database"], out["error"] = "unhealthy", "disconnected", "database unreachable: "+err.Error()
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfterUnavailable))
		writeJSON(w, http.StatusServiceUnavailable, out)
		return
	}
	out["status"], out["database"], out["server"] = "healthy", "connected", "Herald"
	writeJSON(w, http.StatusOK, out)
}

// handleStats reports the caches and the state shared between instances
// (Config.SharedState), or that there is none.
func (s *Server) handleStats(w http.ResponseWriter, _ *http.Request) {
	if s.cfg.SharedState == nil {
		writeJSON(w, http.StatusOK, map[string]any{"enabled": false, "running": false, "peers": []any{}})
		return
	}
	writeJSON(w, http.StatusOK, s.cfg.SharedState())
}

// handleStatus is what the demo page shows every second: this instance,
// its wake-ups, one queue's depth and lag (?queue=), and the shared state.
func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request) {
	// time is this server's clock in ms (fractional): the page compares
	// it with its own to show the latency since push.
	out := map[string]any{"instance": s.cfg.Instance, "version": s.cfg.Version,
		"time":       float64(time.Now().UnixMicro()) / 1000,
		"intentions": s.poller.Intentions(), "streams": s.Streams(), "wakeups": s.poller.Wakeups(),
		"followers": s.Followers()} // this instance's, per queue
	if q := r.URL.Query().Get("queue"); q != "" {
		st, err := s.store.QueueStatus(r.Context(), q)
		if err != nil {
			s.fail(w, err)
			return
		}
		out["queue"] = st
	}
	if s.cfg.SharedState != nil {
		out["shared"] = s.cfg.SharedState()
	}
	writeJSON(w, http.StatusOK, out)
}

// fromTo reads the optional RFC 3339 times "from" and "to" of a listing.
func fromTo(q url.Values, from, to *time.Time) error {
	for _, f := range []struct {
		name string
		dst  *time.Time
	}{{"from", from}, {"to", to}} {
		if v := q.Get(f.name); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return badRequestf("%s must be an RFC3339 time", f.name)
			}
			*f.dst = t
		}
	}
	return nil
}
