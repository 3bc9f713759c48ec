package client

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"time"
)

// Message is one delivered message.
type Message struct {
	ID            string          `json:"id"`
	TransactionID string          `json:"transactionId"`
	PartitionID   string          `json:"partitionId"`
	LeaseID       string          `json:"leaseId"` // empty with AutoAck
	Queue         string          `json:"queue"`
	Partition     string          `json:"partition"`
	ConsumerGroup string          `json:"consumerGroup"`
	Data          json.RawMessage `json:"data"`
	ProducerSub   *string         `json:"producerSub"`
	TraceID       *string         `json:"traceId"`
	CreatedAt     time.Time       `json:"createdAt"`
	RetryCount    int             `json:"retryCount"`
	Offset        int64           `json:"offset"` // position in the partition
	// EventID names the message's position in a follow (Client.Follow):
	// follow again From it to get the messages after it. Empty in a
	// subscription.
	EventID string `json:"eventId,omitempty"`

	cn  *conn
	sub *Subscription
}

// Ack statuses.
const (
	StatusCompleted = "completed"
	StatusFailed    = "failed" // redelivered until the queue's retry limit, then dead-lettered
	StatusRetry     = "retry"  // redelivered without counting an attempt
	StatusDLQ       = "dlq"    // dead-lettered now
)

// ErrLeaseLost means an ack came too late: the connection that received
// the message ended (its lease was given back) or the lease expired. The
// message is or will be delivered again.
var ErrLeaseLost = errors.New("herald: lease lost; the message will be delivered again")

// ErrAckUnknown means the ack was sent but the connection ended before the
// server answered: it may have been applied (the message is done) or not
// (the lease was given back with the connection, and the message will be
// delivered again). Either way nothing is lost; a handler that must not
// run twice keys its work on the transactionId.
var ErrAckUnknown = errors.New("herald: connection lost before the ack's answer; it may or may not have been applied")

// Ack marks the message completed. In manual-ack mode a handler calls it
// (or Nack) for every message.
func (m *Message) Ack(ctx context.Context) error { return m.settle(ctx, StatusCompleted, "") }

// Nack marks the message failed with reason: it is delivered again until
// the queue's retry limit, then dead-lettered with reason.
func (m *Message) Nack(ctx context.Context, reason string) error {
	return m.settle(ctx, StatusFailed, reason)
}

// Settle acknowledges with any status (StatusCompleted, StatusFailed,
// StatusRetry, StatusDLQ).
func (m *Message) Settle(ctx context.Context, status, reason string) error {
	return m.settle(ctx, status, reason)
}

func (m *Message) settle(ctx context.Context, status, reason string) error {
	if m.LeaseID == "" {
		return nil // autoAck: nothing to acknowledge
	}
	if m.cn == nil || !m.cn.alive() {
		return ErrLeaseLost
	}
	f, err := m.cn.sendAcks(ctx, []ack{{m, status, reason}})
	switch {
	case errors.Is(err, errConnLost):
		return ErrLeaseLost // never sent; the lease went with the connection
	case errors.Is(err, errNoAnswer):
		return ErrAckUnknown
	}
	if err != nil {
		return err
	}
	var res []struct {
		Success bool    `json:"success"`
		Error   *string `json:"error"`
	}
	if err := json.Unmarshal(f.Results, &res); err != nil || len(res) != 1 {
		return errors.New("herald: malformed ack_result")
	}
	if !res[0].Success {
		return ErrLeaseLost
	}
	return nil
}

// How an ack the server answers "unavailable" (its database is away: a
// failover, a restart) is sent again: after ackRetryMin, doubling to
// ackRetryMax, for up to ackRetryFor. The server answers a repeated ack
// of a message already acknowledged with success, so an ack that was
// applied before its answer was lost is safe to send again.
const (
	ackRetryMin = 100 * time.Millisecond
	ackRetryMax = 2 * time.Second
	ackRetryFor = 30 * time.Second
)

// sendAcks sends acks in one frame and waits for the answer, sending them
// again while the server answers "unavailable" (bounded by ackRetryFor
// and ctx). The last answer and error are returned.
func (cn *conn) sendAcks(ctx context.Context, acks []ack) (frame, error) {
	backoff := ackRetryMin
	deadline := time.Now().Add(ackRetryFor)
	for {
		f, err := cn.request(ctx, ackFrame(acks), nil)
		var se *ServerError
		if !errors.As(err, &se) || se.Code != "unavailable" || time.Now().Add(backoff).After(deadline) {
			return f, err
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return f, err
		case <-cn.gone:
			t.Stop()
			return f, err
		}
		backoff = min(backoff*2, ackRetryMax)
	}
}

type ack struct {
	m              *Message
	status, reason string
}

func ackFrame(acks []ack) map[string]any {
	items := make([]map[string]any, len(acks))
	for i, a := range acks {
		it := map[string]any{"transactionId": a.m.TransactionID, "partitionId": a.m.PartitionID,
			"leaseId": a.m.LeaseID, "consumerGroup": a.m.ConsumerGroup, "status": a.status}
		if a.reason != "" {
			it["error"] = a.reason
		}
		items[i] = it
	}
	return map[string]any{"type": "ack", "items": items}
}

// SubscribeOptions say what to consume and how.
type SubscribeOptions struct {
	Queue         string
	Partition     string // empty: any partition
	ConsumerGroup string // empty: queue mode (one shared cursor)
	// Batch is the most messages per delivery; zero lets the server choose.
	Batch int
	// MaxInFlight bounds the messages delivered and not yet acknowledged;
	// zero means the server's default (100).
	MaxInFlight int
	// ManualAck leaves acknowledging to the handler (Message.Ack, Nack).
	// Otherwise a handler's nil error acknowledges the message and an
	// error fails it with the error's text.
	ManualAck bool
	// AutoAck asks the server to consider messages acknowledged as it
	// sends them: at-most-once, no acks at all.
	AutoAck          bool
	SubscriptionMode string // all (default), new
	SubscriptionFrom string
}

// Handler processes one message. Messages of a subscription are handled one
// at a time, in delivery order.
type Handler func(ctx context.Context, m *Message) error

// Subscription is one Subscribe call's state.
type Subscription struct {
	c    *Client
	opts SubscribeOptions
	msgs chan *Message

	standing

	acking sync.WaitGroup // acks sent and not yet answered (sendAcks)
}

// Subscribe consumes until ctx ends (it then returns nil), the client is
// closed (ErrClosed) or the server refuses the subscription or the client
// for good (a *ServerError or a terminal *CloseError). Across reconnects it
// subscribes again by itself.
func (c *Client) Subscribe(ctx context.Context, opts SubscribeOptions, handler Handler) error {
	if opts.Queue == "" {
		return errors.New("herald: SubscribeOptions.Queue is required")
	}
	inFlight := opts.MaxInFlight
	if inFlight <= 0 {
		inFlight = 100
	}
	s := &Subscription{c: c, opts: opts, msgs: make(chan *Message, 2*inFlight)}
	s.init()
	cn, err := c.join(func() { c.subs[s] = true })
	if err != nil {
		return err
	}
	defer s.leave()
	// The acks under way are answered before leave unsubscribes, which
	// gives back what is not acknowledged.
	defer s.acking.Wait()
	if cn != nil {
		go s.attach(ctx, cn)
	}
	var pending []ack
	flush := func() { pending = s.sendAcks(pending) }
	failedLease := ""
	for {
		var m *Message
		select {
		case <-ctx.Done():
			flush()
			return nil
		case <-s.ended:
			return s.err
		case m = <-s.msgs:
		}
		if !s.current(m.cn) || (failedLease != "" && m.LeaseID == failedLease) {
			// Its connection ended (the server gave its lease back), or an
			// earlier message of its lease failed: it comes again, in order.
			continue
		}
		if len(pending) > 0 && pending[0].m.cn != m.cn {
			pending = pending[:0]
		}
		err := handler(ctx, m)
		interrupted := err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err())
		if !opts.ManualAck && !opts.AutoAck && !interrupted {
			if err == nil {
				pending = append(pending, ack{m, StatusCompleted, ""})
			} else {
				pending = append(pending, ack{m, StatusFailed, err.Error()})
				failedLease = m.LeaseID
				flush()
			}
			if len(s.msgs) == 0 || len(pending) >= 100 || ctx.Err() != nil {
				flush()
			}
		}
		if ctx.Err() != nil {
			return nil // what is still in hand is given back by unsubscribing
		}
	}
}

// sendAcks sends the acks pending (all of one connection) and returns
// the slice emptied. Not waited for: an ack the server could not apply for
// want of its database is sent again in the background (conn.sendAcks),
// or the partition would wait for the lease to expire; one lost with its
// connection only means a redelivery. Subscribe waits for them (acking)
// before it unsubscribes.
func (s *Subscription) sendAcks(pending []ack) []ack {
	if len(pending) == 0 {
		return pending
	}
	if cn := pending[0].m.cn; cn.alive() {
		batch := slices.Clone(pending)
		s.acking.Add(1)
		go func() {
			defer s.acking.Done()
			actx, cancel := context.WithTimeout(context.Background(), ackRetryFor+writeTimeout)
			defer cancel()
			_, _ = cn.sendAcks(actx, batch)
		}()
	}
	return pending[:0]
}

// attach subscribes on cn; ctx bounds the wait for the answer.
func (s *Subscription) attach(ctx context.Context, cn *conn) {
	body := map[string]any{"type": "subscribe", "queue": s.opts.Queue, "autoAck": s.opts.AutoAck}
	for k, v := range map[string]string{"partition": s.opts.Partition, "consumerGroup": s.opts.ConsumerGroup,
		"subscriptionMode": s.opts.SubscriptionMode, "subscriptionFrom": s.opts.SubscriptionFrom} {
		if v != "" {
			body[k] = v
		}
	}
	if s.opts.Batch > 0 {
		body["batch"] = s.opts.Batch
	}
	if s.opts.MaxInFlight > 0 {
		body["maxInFlight"] = s.opts.MaxInFlight
	}
	s.mu.Lock()
	if s.cn == cn {
		s.mu.Unlock()
		return // already subscribed on it
	}
	s.cn = cn
	s.mu.Unlock()
	_, err := cn.request(ctx, body, s)
	var se *ServerError
	if errors.As(err, &se) && se.Code != "shutting_down" {
		s.end(err) // the server will never accept it as it is
	}
}

// leave unregisters the subscription; on a live connection it unsubscribes,
// which gives back what it holds.
func (s *Subscription) leave() {
	s.c.mu.Lock()
	delete(s.c.subs, s)
	s.c.mu.Unlock()
	tellLeft(s.leaving(), func(cn *conn) map[string]*Subscription { return cn.subs }, s, "unsubscribe", "sub")
}
