package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/heraldmq/herald/internal/httpapi"
	"github.com/heraldmq/herald/queue"
)

func (s *Server) handleConfigure(w http.ResponseWriter, r *http.Request) error {
	obj, err := httpapi.ReadObject(r)
	if err != nil {
		return err
	}
	name, ok, err := httpapi.StringField(obj, "queue")
	if err != nil || !ok || name == "" {
		return httpapi.BadRequest("queue is required")
	}
	if r := rightsOf(r.Context()); r != nil && !r.MayProduce(name, "") {
		return httpapi.Forbiddenf("this token may configure only queues it may produce to whole: not %s", name)
	}
	req := queue.ConfigureRequest{Queue: name}
	if req.Namespace, _, err = httpapi.StringField(obj, "namespace"); err != nil {
		return httpapi.BadRequestf("%v", err)
	}
	if req.Task, _, err = httpapi.StringField(obj, "task"); err != nil {
		return httpapi.BadRequestf("%v", err)
	}
	mode, _, err := httpapi.StringField(obj, "mode")
	if err != nil || (mode != "" && mode != "merge" && mode != "replace") {
		return httpapi.BadRequestf("mode must be merge or replace")
	}
	req.Replace = mode == "replace"
	if raw := obj["options"]; !httpapi.IsNull(raw) {
		// Named options change; the others keep their stored values
		// (defaults for a new queue, or with mode "replace").
		if _, ok := httpapi.ObjectOf(raw); !ok {
			return httpapi.BadRequestf("options must be an object")
		}
		req.Options = raw
	}
	res, err := s.store.Configure(r.Context(), req)
	if err != nil {
		return err
	}
	if f := s.cfg.OnQueueConfigured; f != nil {
		f(res.Info()) // other instances cache the new settings
	}
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{
		"configured": true, "queueId": res.QueueID, "partitionId": res.PartitionID, "queue": res.Queue,
		"namespace": res.Namespace, "task": res.Task, "options": sortedObject(res.Options),
	})
	return nil
}

// sortedObject re-encodes v through a map so its keys come out sorted, as the
// reference server writes them.
func sortedObject(v any) map[string]any {
	b, _ := json.Marshal(v)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return m
}

func (s *Server) handleDeleteQueue(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("queue")
	if r := rightsOf(r.Context()); r != nil && !r.MayProduce(name, "") {
		return httpapi.Forbiddenf("this token may delete only queues it may produce to whole: not %s", name)
	}
	existed, err := s.store.DeleteQueue(r.Context(), name)
	if err != nil {
		return err
	}
	if f := s.cfg.OnQueueDeleted; f != nil {
		f(name) // other instances drop what they cached of it
	}
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{"deleted": true, "existed": existed, "queue": name})
	return nil
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
	out := extendJSON{Error: httpapi.Nullable(res.Error), LeaseID: res.LeaseID, Success: res.Success}
	if res.Success {
		t := httpapi.FormatMilli(res.ExpiresAt)
		out.ExpiresAt = &t
	}
	return out
}

func (s *Server) handleLeaseExtend(w http.ResponseWriter, r *http.Request) error {
	seconds := 0
	// The body is optional: {} and an empty body both mean the queue's lease time.
	if r.ContentLength != 0 {
		obj, err := httpapi.ReadObject(r)
		if err != nil {
			if br, ok := err.(*httpapi.Error); !ok || br.Msg != httpapi.ErrTextEmptyBody {
				return err
			}
		}
		if obj != nil {
			if seconds, _, err = httpapi.IntField(obj, "seconds"); err != nil {
				return httpapi.BadRequest(fmt.Sprintf("seconds must be an integer between 0 and %d (a day)", queue.MaxLeaseSeconds))
			}
		}
	}
	leaseID := r.PathValue("leaseId")
	lease, err := s.hideLease(r.Context(), rightsOf(r.Context()), leaseID)
	if err != nil {
		return err
	}
	res, err := s.store.ExtendLease(r.Context(), lease, seconds, holderOf(r.Context()))
	if err != nil {
		return err
	}
	res.LeaseID = leaseID // the id asked about, hidden or not
	status := http.StatusOK
	if res.Error == queue.ErrTextLeaseForeign {
		status = http.StatusForbidden
	}
	httpapi.WriteJSON(w, status, []extendJSON{extendResultJSON(res)})
	return nil
}

func (s *Server) handleTransaction(w http.ResponseWriter, r *http.Request) error {
	obj, err := httpapi.ReadObject(r)
	if err != nil {
		return err
	}
	arr, ok := httpapi.ArrayField(obj, "operations")
	if !ok || len(arr) == 0 {
		return httpapi.BadRequest("operations array cannot be empty")
	}
	ops, err := s.parseTxOps(r, arr)
	if err != nil {
		return err
	}
	leases, err := txLeases(obj)
	if err != nil {
		return err
	}
	required, err := s.hideLeases(r.Context(), rightsOf(r.Context()), leases)
	if err != nil {
		return err
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
		return err
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
	out := map[string]any{"transactionId": res.TransactionID, "success": res.Success, "results": txResultsJSON(res.Results)}
	if !res.Success {
		out["error"] = res.Error
	} else {
		s.afterTransaction(ops, res.Results)
	}
	status := http.StatusOK
	if res.Forbidden {
		status = http.StatusForbidden
	}
	httpapi.WriteJSON(w, status, out)
	return nil
}

// txResultsJSON is the results of a transaction, one per operation.
func txResultsJSON(rs []queue.TxOpResult) []map[string]any {
	results := make([]map[string]any, len(rs))
	for i, or := range rs {
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
				"error": httpapi.Nullable(a.Error), "transactionId": a.TransactionID}
		}
	}
	return results
}

// afterTransaction does what follows a committed transaction's pushes and
// acks (effects.go), and counts it for each queue it touched.
func (s *Server) afterTransaction(ops []queue.TxOp, rs []queue.TxOpResult) {
	var pushed []queue.PushResult
	var acked []queue.AckResult
	for _, or := range rs {
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
			s.metrics.history.Transaction(q)
		}
	}
}

// parseTxOps reads a transaction's operations (push or ack), each checked
// against the token's rights as its own route would check it.
func (s *Server) parseTxOps(r *http.Request, arr []json.RawMessage) ([]queue.TxOp, error) {
	ops := make([]queue.TxOp, len(arr))
	var err error
	for i, raw := range arr {
		op, ok := httpapi.ObjectOf(raw)
		if !ok {
			return nil, httpapi.BadRequest("Each operation must be an object")
		}
		typ, _, _ := httpapi.StringField(op, "type")
		ops[i].Type = typ
		switch typ {
		case "push":
			items, ok := httpapi.ArrayField(op, "items")
			if !ok {
				return nil, httpapi.BadRequest("push operation requires an items array")
			}
			if ops[i].Items, err = parsePushItems(items); err != nil {
				return nil, err
			}
			if err := checkProduce(rightsOf(r.Context()), ops[i].Items); err != nil {
				return nil, err
			}
			stampProducer(r.Context(), ops[i].Items)
		case "ack":
			if ops[i].Ack, err = parseAck(op, true); err != nil {
				return nil, err
			}
			acks := []queue.Ack{ops[i].Ack}
			if err := s.hideAcks(r.Context(), rightsOf(r.Context()), acks); err != nil {
				return nil, err
			}
			ops[i].Ack = acks[0]
		default:
			return nil, httpapi.BadRequest("operation type must be push or ack")
		}
	}
	return ops, nil
}

// txLeases reads requiredLeases, refusing the kv and timers operations
// this server does not run.
func txLeases(obj map[string]json.RawMessage) ([]string, error) {
	// Newer clients gate a transaction on key-value preconditions or add
	// timers; committing without them would break the gate, so refuse.
	for _, key := range []string{"kv", "timers"} {
		if arr, ok := httpapi.ArrayField(obj, key); ok && len(arr) > 0 {
			return nil, httpapi.BadRequest(key + " operations are not supported by this server")
		}
	}
	var leases []string
	if raw := obj["requiredLeases"]; !httpapi.IsNull(raw) {
		if err := json.Unmarshal(raw, &leases); err != nil {
			return nil, httpapi.BadRequest("requiredLeases must be an array of strings")
		}
	}
	return leases, nil
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) error {
	out := map[string]any{"version": s.cfg.Version}
	// The HTTP connections admitted and open, and the cap (0: none).
	out["connections"], out["maxConnections"] = s.Connections()
	if s.cfg.Database != nil {
		restarting, restarts := s.cfg.Database()
		out["restarts"] = restarts
		if restarting { // no ping: it cannot answer, and a pool dial would only wait
			out["status"], out["database"] = "unhealthy", "restarting"
			httpapi.WriteJSON(w, http.StatusServiceUnavailable, out)
			return nil
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.store.Ping(ctx); err != nil {
		out["status"], out["database"], out["error"] = "unhealthy", "disconnected", "database unreachable: "+err.Error()
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfterUnavailable))
		httpapi.WriteJSON(w, http.StatusServiceUnavailable, out)
		return nil
	}
	out["status"], out["database"], out["server"] = "healthy", "connected", "Herald"
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

// handleStats reports the caches and the state shared between instances
// (Config.SharedState), or that there is none.
func (s *Server) handleStats(w http.ResponseWriter, _ *http.Request) error {
	if s.cfg.SharedState == nil {
		httpapi.WriteJSON(w, http.StatusOK, map[string]any{"enabled": false, "running": false, "peers": []any{}})
		return nil
	}
	httpapi.WriteJSON(w, http.StatusOK, s.cfg.SharedState())
	return nil
}

// handleStatus is what the demo page shows every second: this instance,
// its wake-ups, one queue's depth and lag (?queue=), and the shared state.
func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request) error {
	// time is this server's clock in ms (fractional): the page compares
	// it with its own to show the latency since push.
	here := s.Followers()
	all := here
	if s.cfg.ClusterFollowers != nil {
		all = s.cfg.ClusterFollowers(here)
	}
	out := map[string]any{"instance": s.cfg.Instance, "version": s.cfg.Version,
		"time":       float64(time.Now().UnixMicro()) / 1000,
		"intentions": s.poller.Intentions(), "streams": s.Streams(), "wakeups": s.poller.Wakeups(),
		"followers": here, "clusterFollowers": all} // per queue: this instance's, every instance's
	if q := r.URL.Query().Get("queue"); q != "" {
		st, err := s.store.QueueStatus(r.Context(), q)
		if err != nil {
			return err
		}
		out["queue"] = st
	}
	if s.cfg.SharedState != nil {
		out["shared"] = s.cfg.SharedState()
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}
