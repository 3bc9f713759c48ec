package gateway

import (
	"net/http"
	"time"

	"github.com/heraldmq/herald/internal/httpapi"
	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
)

// longPollMargin is the most a long-poll answers before its timeout.
const longPollMargin = 250 * time.Millisecond

// messageJSON is one delivered message, in the reference server's key order.
type messageJSON struct {
	ConsumerGroup string      `json:"consumerGroup"`
	CreatedAt     string      `json:"createdAt"`
	Data          httpapi.Raw `json:"data"`
	ID            string      `json:"id"`
	LeaseID       string      `json:"leaseId"`
	Partition     string      `json:"partition"`
	PartitionID   string      `json:"partitionId"`
	ProducerSub   *string     `json:"producerSub"`
	Queue         string      `json:"queue"`
	RetryCount    int         `json:"retryCount"`
	TraceID       *string     `json:"traceId"`
	TransactionID string      `json:"transactionId"`
}

func messageOf(m queue.Message) messageJSON {
	return messageJSON{ConsumerGroup: m.Group, CreatedAt: httpapi.FormatMicro(m.CreatedAt), Data: httpapi.Raw(m.Data), ID: m.ID,
		LeaseID: m.LeaseID, Partition: m.Partition, PartitionID: m.PartitionID, ProducerSub: httpapi.Nullable(m.ProducerSub),
		Queue: m.Queue, RetryCount: m.RetryCount, TraceID: httpapi.Nullable(m.TraceID), TransactionID: m.TransactionID}
}

// streamMessageJSON is a message delivered over WebSocket or SSE: the pop
// shape plus its offset in the partition (a Herald addition).
type streamMessageJSON struct {
	messageJSON
	Offset int64 `json:"offset"`
}

func streamMessageOf(m queue.Message) streamMessageJSON {
	return streamMessageJSON{messageJSON: messageOf(m), Offset: m.Offset}
}

type popJSON struct {
	ConsumerGroup     string        `json:"consumerGroup"`
	LeaseID           string        `json:"leaseId"`
	Messages          []messageJSON `json:"messages"`
	Partition         string        `json:"partition"`
	PartitionID       string        `json:"partitionId"`
	PartitionsClaimed int           `json:"partitionsClaimed"`
	Queue             string        `json:"queue"`
	Success           bool          `json:"success"`
}

// parsePopRequest reads the pop query parameters shared by every pop route
// (and, later, by SSE and WebSocket subscriptions).
func parsePopRequest(r *http.Request) (queue.PopRequest, bool, time.Duration, error) {
	q := r.URL.Query()
	req := queue.PopRequest{
		Queue:            r.PathValue("queue"),
		Partition:        r.PathValue("partition"),
		Namespace:        q.Get("namespace"),
		Task:             q.Get("task"),
		Group:            q.Get("consumerGroup"),
		SubscriptionMode: q.Get("subscriptionMode"),
		SubscriptionFrom: q.Get("subscriptionFrom"),
	}
	if req.Queue == "" && req.Namespace == "" && req.Task == "" {
		return req, false, 0, httpapi.BadRequestf("namespace or task is required (or use /api/v1/pop/queue/{queue})")
	}
	// Values above a bound are clamped, not refused: the reference server
	// takes any number, and clients pass user settings through.
	var err error
	if req.Batch, err = httpapi.ClampedParam(q.Get("batch"), "batch", 1, queue.MaxBatch); err != nil {
		return req, false, 0, err
	}
	if req.Batch == 0 && q.Get("autopilot") == "true" {
		// Autopilot clients leave the batch to the server.
		req.Batch = AutopilotBatchDefault
	}
	if req.Partitions, err = httpapi.ClampedParam(q.Get("partitions"), "partitions", 1, queue.MaxPartitions); err != nil {
		return req, false, 0, err
	}
	timeoutMS, err := httpapi.ClampedParam(q.Get("timeout"), "timeout", 0, int(PopTimeoutMax/time.Millisecond))
	if err != nil {
		return req, false, 0, err
	}
	timeout := PopTimeoutDefault
	if q.Get("timeout") != "" {
		timeout = time.Duration(timeoutMS) * time.Millisecond
	}
	wait, err := httpapi.BoolParam(q.Get("wait"), "wait")
	if err != nil {
		return req, false, 0, err
	}
	if req.AutoAck, err = httpapi.BoolParam(q.Get("autoAck"), "autoAck"); err != nil {
		return req, false, 0, err
	}
	return req, wait, timeout, nil
}

func (s *Server) handlePop(w http.ResponseWriter, r *http.Request) error {
	req, wait, timeout, err := parsePopRequest(r)
	if err == nil {
		err = checkConsume(rightsOf(r.Context()), &req)
	}
	req.Subject = subjectOf(r.Context())
	if err != nil {
		return err
	}
	if s.maint.pop.Load() {
		// Pop maintenance: empty at once, even for wait=true; no query,
		// no lease.
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	// While draining nothing new may wait: a long-poll is sent elsewhere.
	if wait && s.isDraining() {
		refuseDraining(w)
		return nil
	}
	if !wait {
		if !req.AutoAck {
			req.LeaseID = queue.NewID()
		}
		res, err := s.store.Pop(r.Context(), req)
		if err != nil {
			if queue.OutcomeUnknown(err) {
				// Its commit may have landed: given back, not left
				// leased to nobody until it expires.
				s.poller.GiveBack(req.LeaseID, req.Queue)
			}
			return err
		}
		s.metrics.history.PopRequest(req.Queue, len(res.Messages) == 0)
		if len(res.Messages) == 0 {
			w.WriteHeader(http.StatusNoContent)
			return nil
		}
		s.poller.LeasesTaken(res)
		s.writePop(w, res)
		return nil
	}
	return s.longPoll(w, r, req, timeout)
}

// longPoll registers the request as an intention and waits for the poller
// to lease messages for it. It holds no database connection meanwhile; the
// only goroutine is the request's own.
func (s *Server) longPoll(w http.ResponseWriter, r *http.Request, req queue.PopRequest, timeout time.Duration) error {
	if err := req.Validate(); err != nil {
		return err
	}
	popOn := s.maint.popStarted() // closed if pop maintenance starts while it waits
	unpark := s.metrics.history.Park(req.Queue)
	defer unpark()
	waiter := s.poller.Wait(poller.Intention{
		Target: queue.Target{Queue: req.Queue, Namespace: req.Namespace, Task: req.Task, Partition: req.Partition, QueueMatch: req.QueueMatch,
			Group: req.Group, SubscriptionMode: req.SubscriptionMode, SubscriptionFrom: req.SubscriptionFrom},
		Batch: req.Batch, Partitions: req.Partitions, AutoAck: req.AutoAck, Subject: req.Subject,
		Deadline: time.Now().Add(timeout),
	})
	// Answer a little before the client's own timeout: Queen's Go client
	// sets its HTTP timeout equal to the pop timeout and counts a client-side
	// timeout against the server's health.
	timer := time.NewTimer(timeout - min(timeout/20, longPollMargin))
	defer timer.Stop()
	select {
	case res := <-waiter.C():
		s.metrics.history.PopRequest(req.Queue, false)
		if r.Context().Err() == nil {
			s.writePop(w, res)
			return nil
		}
		s.releaseFor(r, res) // the client left while we were waking up
		return nil
	case <-timer.C:
	case <-s.draining:
	case <-popOn:
	case <-r.Context().Done():
	}
	res := waiter.Cancel()
	s.metrics.history.PopRequest(req.Queue, res == nil)
	if res == nil {
		if r.Context().Err() == nil {
			w.WriteHeader(http.StatusNoContent)
		}
		return nil
	}
	if r.Context().Err() == nil {
		s.writePop(w, res) // delivered just as the wait ended: still ours
		return nil
	}
	s.releaseFor(r, res)
	return nil
}

// releaseFor gives back, at once rather than at lease expiry, messages
// leased for a long-poll whose client left.
func (s *Server) releaseFor(r *http.Request, res *queue.PopResult) {
	s.poller.Release(r.Context(), res.LeaseID, res.Messages)
}

// CountGivenUp counts what a pop gave up on or skipped: messages it
// dead-lettered (or dropped, on a queue that keeps no dead letter of them)
// after their lease expired once too often or their payload failed to
// decrypt, and those it skipped as older than their queue's ttl. The store
// tells it of every pop's, whichever path popped (queue.Config.OnGivenUp:
// internal/server wires it), so each is counted once.
func (s *Server) CountGivenUp(res *queue.PopResult) {
	s.countGivenUp(res.DeadLettered, res.Dropped)
	for q, n := range res.Expired {
		s.metrics.expired.WithLabelValues(q).Add(float64(n))
	}
}

func (s *Server) writePop(w http.ResponseWriter, res *queue.PopResult) {
	out := popJSON{ConsumerGroup: res.Group, LeaseID: res.LeaseID, Messages: make([]messageJSON, len(res.Messages)),
		Partition: res.Partition, PartitionID: res.PartitionID, PartitionsClaimed: res.PartitionsClaimed,
		Queue: res.Queue, Success: true}
	for i, m := range res.Messages {
		out.Messages[i] = messageOf(m)
		s.metrics.popped.WithLabelValues(m.Queue, m.Group).Inc()
	}
	s.metrics.history.Popped(res.Messages)
	httpapi.WriteJSON(w, http.StatusOK, out)
}
