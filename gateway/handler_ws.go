package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"

	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
)

// WebSocket close codes: 4000–4499 allow a reconnect, 4500–4999 do not.
const (
	CloseShuttingDown  = 4000 // the server is draining: reconnect (elsewhere)
	CloseSlowConsumer  = 4001 // the client did not read its frames in time: reconnect
	CloseProtocolError = 4500 // frames that are not the protocol: do not retry as is
	CloseUnauthorized  = 4501 // no valid token (or it expired): get a new token first
	CloseForbidden     = 4503 // the token's role may not subscribe
)

// WebSocket limits and timings.
const (
	WSSubprotocol        = "herald.v1"
	WSReadLimitDefault   = 1 << 20 // bytes per frame
	WSMaxInFlightDefault = 100     // unacked messages per subscription
	WSBatchDefault       = 10      // messages per deliver frame
	WSMaxSubscriptions   = 100     // per connection
	// The writer's queue: past wsHoldAt frames the connection's
	// subscriptions lease nothing more (credit held at 0) until the client
	// has read it down to wsResumeAt; only a client that also stops reading
	// its replies reaches wsWriteQueue and is disconnected (4001).
	wsWriteQueue            = 1024
	wsHoldAt                = 64
	wsResumeAt              = 16
	wsWriteTimeout          = 10 * time.Second
	wsPingInterval          = 30 * time.Second
	wsReadTimeout           = 2 * wsPingInterval // a silent client is gone
	wsMalformedFramesToKill = 100                // protocol errors tolerated per connection
)

// wsWriteBuffers lends write buffers to connections while they write.
var wsWriteBuffers sync.Pool

// checkOrigin applies Config.AllowedOrigins to browser upgrades.
func (s *Server) checkOrigin(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" || len(s.cfg.AllowedOrigins) == 0 {
		return true
	}
	return slices.Contains(s.cfg.AllowedOrigins, origin)
}

// wsFrame is every client frame; fields unused by a type stay zero.
type wsFrame struct {
	Type string          `json:"type"`
	ID   json.RawMessage `json:"id,omitempty"`

	// subscribe
	Queue            string `json:"queue"`
	Partition        string `json:"partition"`
	ConsumerGroup    string `json:"consumerGroup"`
	Batch            int    `json:"batch"`
	MaxInFlight      int    `json:"maxInFlight"`
	AutoAck          bool   `json:"autoAck"`
	SubscriptionMode string `json:"subscriptionMode"`
	SubscriptionFrom string `json:"subscriptionFrom"`
	// unsubscribe, deliver
	Sub string `json:"sub"`
	// ack, push
	Items json.RawMessage `json:"items"`
	// renew
	LeaseID string `json:"leaseId"`
	Seconds int    `json:"seconds"`
}

// wsConn is one WebSocket connection: its subscriptions and the messages
// delivered to them and not yet acknowledged.
type wsConn struct {
	s    *Server
	ws   *websocket.Conn
	done chan struct{}

	claims  Claims      // when auth is on
	held    atomic.Bool // the write queue is past wsHoldAt: lease nothing
	pinger  *time.Timer
	writers sync.WaitGroup // the writer, while one runs

	mu       sync.Mutex
	out      []any // frames for the writer, oldest first; a slice, so an idle connection holds no buffer
	writing  bool  // a writer goroutine runs
	subs     map[string]*wsSub
	inflight map[deliveryKey]inflightMsg // delivered, not yet acknowledged
	nextSub  int
	closed   bool
	draining bool
}

type wsSub struct {
	c      *wsConn
	id     string
	group  string
	in     *poller.Intention
	cancel func()
}

// inflightMsg is one delivery of the connection, keyed by deliveryKey: the
// same message delivered to two subscriptions (two groups) is two entries.
type inflightMsg struct {
	sub              *wsSub
	queue, partition string
}

// settled is called by afterAck when a delivery of sub was acknowledged on
// this instance, by this connection or any other path (a holder).
func (sub *wsSub) settled(k deliveryKey) {
	c := sub.c
	c.mu.Lock()
	m, ok := c.inflight[k]
	ok = ok && m.sub == sub
	if ok {
		delete(c.inflight, k)
	}
	c.mu.Unlock()
	if ok {
		c.s.poller.AddCredit(sub.in, 1)
	}
}

func (s *Server) handleWS(w http.ResponseWriter, r *http.Request) {
	if !s.checkOrigin(r) {
		writeError(w, http.StatusForbidden, "origin not allowed")
		return
	}
	s.wsMu.Lock()
	full := len(s.wsConns) >= s.cfg.MaxWSConnections
	s.wsMu.Unlock()
	if full {
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusServiceUnavailable, "too many WebSocket connections; retry later or elsewhere")
		return
	}
	var claims Claims
	var authErr error
	if s.cfg.Auth != nil {
		claims, authErr = s.checkToken(r, RoleReadOnly)
	}
	// A small read buffer of its own (the HTTP server's 4 KiB one is let go;
	// larger payloads are read past it) and write buffers lent only while
	// writing: idle connections are cheap.
	up := websocket.Upgrader{Subprotocols: []string{WSSubprotocol}, CheckOrigin: func(*http.Request) bool { return true },
		ReadBufferSize: 512, WriteBufferSize: 4096, WriteBufferPool: &wsWriteBuffers}
	ws, err := up.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader has answered
	}
	ws.SetReadLimit(WSReadLimitDefault)
	c := &wsConn{s: s, ws: ws, done: make(chan struct{}),
		subs: map[string]*wsSub{}, inflight: map[deliveryKey]inflightMsg{}, claims: claims}
	switch {
	case errors.Is(authErr, errForbidden):
		// A browser cannot read the status of a refused upgrade; it can
		// read a close code.
		c.closeWith(CloseForbidden, authErr.Error())
		return
	case authErr != nil:
		c.closeWith(CloseUnauthorized, authErr.Error())
		return
	case s.isDraining():
		c.closeWith(CloseShuttingDown, "server shutting down")
		return
	}
	s.wsMu.Lock()
	s.wsConns[c] = true
	s.wsMu.Unlock()
	s.metrics.wsConns.Inc()
	// The connection lives on in a goroutine of its own, and this handler
	// returns: the HTTP server's goroutine, buffers and request go, and an
	// idle connection costs one small goroutine. Pings come from a timer,
	// frames from a writer started when there are some.
	s.streamWG.Add(1)
	go func() {
		defer s.streamWG.Done()
		if !claims.Expires.IsZero() {
			t := time.AfterFunc(time.Until(claims.Expires), func() { c.closeWith(CloseUnauthorized, "token expired") })
			defer t.Stop()
		}
		ctx, cancel := context.WithCancel(context.Background())
		c.pinger = time.AfterFunc(wsPingInterval, c.ping)
		c.reader(ctx)
		cancel()
		c.pinger.Stop()
		c.shutdown()
		c.writers.Wait()
		s.wsMu.Lock()
		delete(s.wsConns, c)
		s.wsMu.Unlock()
		s.metrics.wsConns.Dec()
	}()
}

// reader handles frames until the connection fails.
func (c *wsConn) reader(ctx context.Context) {
	_ = c.ws.SetReadDeadline(time.Now().Add(wsReadTimeout))
	c.ws.SetPongHandler(func(string) error { return c.ws.SetReadDeadline(time.Now().Add(wsReadTimeout)) })
	bad := 0
	for {
		kind, data, err := c.ws.ReadMessage()
		if err != nil {
			if err == websocket.ErrReadLimit {
				c.closeWith(websocket.CloseMessageTooBig, "frame larger than "+strconv.Itoa(WSReadLimitDefault)+" bytes")
			}
			return
		}
		_ = c.ws.SetReadDeadline(time.Now().Add(wsReadTimeout))
		ok := true
		onStack(func() {
			var f wsFrame
			// A text frame must be UTF-8 (RFC 6455 §5.6); JSON decoding
			// would silently replace bad bytes in names.
			if ok = kind == websocket.TextMessage && utf8.Valid(data) && json.Unmarshal(data, &f) == nil; ok {
				c.handle(ctx, &f)
			}
		})
		if !ok {
			c.s.metrics.wsBadFrames.Inc()
			if bad++; bad > wsMalformedFramesToKill {
				c.closeWith(CloseProtocolError, "too many malformed frames")
				return
			}
			c.send(wsError(nil, "bad_frame", "frames are JSON text objects with a type"))
		}
	}
}

// onStack runs f on a short-lived goroutine and waits for it. A connection's
// long-lived goroutine spends its life parked in a read; the deep calls of
// handling a frame (JSON, SQL) would grow its stack for good, so they run
// on a stack that goes away with them.
func onStack(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
}

func (c *wsConn) handle(ctx context.Context, f *wsFrame) {
	switch f.Type {
	case "ping":
		c.send(map[string]any{"type": "pong", "id": f.ID})
	case "subscribe":
		c.subscribe(f)
	case "unsubscribe":
		c.unsubscribe(f)
	case "ack":
		c.ack(ctx, f)
	case "renew":
		res, err := c.s.store.ExtendLease(ctx, f.LeaseID, f.Seconds)
		if queue.IsInputError(err) {
			c.send(wsError(f.ID, "bad_request", err.Error()))
			return
		}
		if err != nil {
			c.send(wsError(f.ID, "internal", "extending the lease failed"))
			return
		}
		out := extendJSON{Error: nullable(res.Error), LeaseID: res.LeaseID, Success: res.Success}
		if res.Success {
			t := formatMilli(res.ExpiresAt)
			out.ExpiresAt = &t
		}
		c.send(map[string]any{"type": "renew_result", "id": f.ID, "result": out})
	case "push":
		c.push(ctx, f)
	default:
		c.s.metrics.wsBadFrames.Inc()
		c.send(wsError(f.ID, "unknown_type", "unknown frame type "+strconv.Quote(f.Type)))
	}
}

func wsError(id json.RawMessage, code, msg string) map[string]any {
	return map[string]any{"type": "error", "id": id, "code": code, "message": msg}
}

// send queues a frame for the writer. A full queue means the client does not
// read: it is disconnected with a code that allows a reconnect, and its
// leases are released, so nothing is lost.
func (c *wsConn) send(frame any) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	if len(c.out) >= wsWriteQueue {
		c.closed = true
		close(c.done)
		go c.closeWith(CloseSlowConsumer, "client reads too slowly")
		return false
	}
	c.out = append(c.out, frame)
	if len(c.out) >= wsHoldAt {
		c.held.Store(true)
	}
	if !c.writing {
		c.writing = true
		c.writers.Add(1)
		go c.write()
	}
	return true
}

func (c *wsConn) closeWith(code int, reason string) {
	_ = c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, reason), time.Now().Add(time.Second))
	_ = c.ws.Close()
}

// ping sends a WebSocket ping and arms the next; the client's pong extends
// the read deadline. WriteControl may run alongside the writer.
func (c *wsConn) ping() {
	if err := c.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(wsWriteTimeout)); err != nil {
		_ = c.ws.Close()
		return
	}
	c.mu.Lock()
	if !c.closed {
		c.pinger.Reset(wsPingInterval)
	}
	c.mu.Unlock()
}

// write is the connection's one writer while frames are queued: started by
// send, it ends when the queue is empty.
func (c *wsConn) write() {
	defer c.writers.Done()
	for {
		c.mu.Lock()
		if len(c.out) == 0 || c.closed {
			c.out = nil // an idle connection keeps no queue
			c.writing = false
			c.mu.Unlock()
			return
		}
		f := c.out[0]
		c.out[0] = nil
		c.out = c.out[1:]
		left := len(c.out)
		c.mu.Unlock()
		_ = c.ws.SetWriteDeadline(time.Now().Add(wsWriteTimeout))
		if err := c.ws.WriteJSON(f); err != nil {
			_ = c.ws.Close() // the reader fails and shuts the connection down
			c.mu.Lock()
			c.out, c.writing = nil, false
			c.mu.Unlock()
			return
		}
		if left <= wsResumeAt && c.held.CompareAndSwap(true, false) {
			c.resumeLeasing()
		}
	}
}

// streamPartitions is how many partitions a subscription may lease in one
// delivery: enough to fill its credit with batches, so that a stream over
// many partitions is not served one partition per poll cycle.
func streamPartitions(batch, maxInFlight int) int {
	return min(max(maxInFlight/max(batch, 1), 1), queue.MaxPartitions)
}

// resumeLeasing lets the subscriptions take messages again once the client
// has read its backlog.
func (c *wsConn) resumeLeasing() {
	c.mu.Lock()
	subs := make([]*wsSub, 0, len(c.subs))
	for _, sub := range c.subs {
		subs = append(subs, sub)
	}
	c.mu.Unlock()
	for _, sub := range subs {
		c.s.poller.AddCredit(sub.in, 0)
	}
}

// drain stops leasing to the connection at once, then closes it after
// delay with a code that says: reconnect, elsewhere. Closing releases the
// leases it still holds; until then its client may ack what it processes.
func (c *wsConn) drain(delay time.Duration) {
	c.mu.Lock()
	c.draining = true
	var cancels []func()
	for _, sub := range c.subs {
		if sub.cancel != nil {
			cancels = append(cancels, sub.cancel)
		}
	}
	c.mu.Unlock()
	for _, cancel := range cancels {
		cancel()
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-c.done:
			return
		}
	}
	c.closeWith(CloseShuttingDown, "server shutting down")
}

func (c *wsConn) subscribe(f *wsFrame) {
	req := queue.PopRequest{Queue: f.Queue, Partition: f.Partition, Group: f.ConsumerGroup,
		SubscriptionMode: f.SubscriptionMode, SubscriptionFrom: f.SubscriptionFrom}
	if err := req.Validate(); err != nil || f.Queue == "" {
		msg := "queue is required"
		if err != nil {
			msg = err.Error()
		}
		c.send(wsError(f.ID, "bad_request", msg))
		return
	}
	batch, maxInFlight := f.Batch, f.MaxInFlight
	if batch <= 0 {
		batch = WSBatchDefault
	}
	if maxInFlight <= 0 {
		maxInFlight = WSMaxInFlightDefault
	}
	// Bounded as on SSE: credit is added to and counted down, and a value
	// near the int range would overflow it.
	maxInFlight = min(maxInFlight, queue.MaxBatch*10)
	batch = min(batch, maxInFlight, queue.MaxBatch)
	group := f.ConsumerGroup
	if group == "" {
		group = queue.DefaultGroup
	}
	c.mu.Lock()
	if c.draining {
		c.mu.Unlock()
		c.send(wsError(f.ID, "shutting_down", "the server is shutting down: subscribe elsewhere"))
		return
	}
	if len(c.subs) >= WSMaxSubscriptions {
		c.mu.Unlock()
		c.send(wsError(f.ID, "too_many_subscriptions", "at most "+strconv.Itoa(WSMaxSubscriptions)+" subscriptions per connection"))
		return
	}
	c.nextSub++
	sub := &wsSub{c: c, id: "s" + strconv.Itoa(c.nextSub), group: group}
	c.subs[sub.id] = sub
	c.mu.Unlock()
	sub.in = &poller.Intention{
		Target: queue.Target{Queue: f.Queue, Partition: f.Partition, Group: group,
			SubscriptionMode: f.SubscriptionMode, SubscriptionFrom: f.SubscriptionFrom},
		Batch: batch, Partitions: streamPartitions(batch, maxInFlight), Credit: maxInFlight, AutoAck: f.AutoAck, Standing: true,
		Deliver: func(res *queue.PopResult) bool { return c.deliver(sub, res) },
		Hold:    c.held.Load,
	}
	// Reply before the first delivery can be queued.
	c.send(map[string]any{"type": "subscribed", "id": f.ID, "sub": sub.id})
	// Registered under mu, so that a drain running meanwhile either sees
	// its cancel func or stops it from registering at all.
	c.mu.Lock()
	if !c.draining && !c.closed {
		sub.cancel = c.s.poller.Register(sub.in)
	}
	c.mu.Unlock()
}

// deliver runs on a poller worker: it must not block.
func (c *wsConn) deliver(sub *wsSub, res *queue.PopResult) bool {
	msgs := make([]streamMessageJSON, len(res.Messages))
	for i, m := range res.Messages {
		msgs[i] = streamMessageOf(m)
	}
	c.mu.Lock()
	if c.closed || c.subs[sub.id] != sub {
		c.mu.Unlock()
		return false
	}
	if !sub.in.AutoAck {
		for _, m := range res.Messages {
			k := deliveryKey{m.LeaseID, m.PartitionID, m.TransactionID}
			c.inflight[k] = inflightMsg{sub: sub, queue: m.Queue, partition: m.Partition}
			c.s.deliveries.hold(k, sub)
		}
	}
	c.mu.Unlock()
	if !c.send(map[string]any{"type": "deliver", "sub": sub.id, "messages": msgs}) {
		c.forget(res.Messages)
		return false
	}
	for _, m := range res.Messages {
		c.s.metrics.popped.WithLabelValues(m.Queue, m.Group).Inc()
	}
	if sub.in.AutoAck {
		c.s.poller.AddCredit(sub.in, len(res.Messages)) // nothing to wait for
	}
	return true
}

func (c *wsConn) forget(msgs []queue.Message) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range msgs {
		k := deliveryKey{m.LeaseID, m.PartitionID, m.TransactionID}
		if held, ok := c.inflight[k]; ok {
			delete(c.inflight, k)
			c.s.deliveries.drop(k, held.sub)
		}
	}
}

func (c *wsConn) unsubscribe(f *wsFrame) {
	c.mu.Lock()
	sub := c.subs[f.Sub]
	delete(c.subs, f.Sub)
	leases := c.takeLeases(sub)
	c.mu.Unlock()
	if sub == nil {
		c.send(wsError(f.ID, "unknown_subscription", "no subscription "+strconv.Quote(f.Sub)))
		return
	}
	if sub.cancel != nil {
		sub.cancel()
	}
	c.release(leases)
	c.send(map[string]any{"type": "unsubscribed", "id": f.ID, "sub": f.Sub})
}

// heldLease is a lease a subscription held on one partition.
type heldLease struct{ leaseID, queue, partition string }

// takeLeases removes the in-flight messages of sub (all subs when nil and
// the connection closes) and returns their distinct leases. Called with mu.
func (c *wsConn) takeLeases(sub *wsSub) []heldLease {
	seen := map[heldLease]bool{}
	var out []heldLease
	for k, m := range c.inflight {
		if sub != nil && m.sub != sub {
			continue
		}
		delete(c.inflight, k)
		c.s.deliveries.drop(k, m.sub)
		h := heldLease{k.leaseID, m.queue, m.partition}
		if h.leaseID != "" && !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	return out
}

// release gives leases back at once and wakes their queues: the unacked
// messages go to another consumer now, not at lease expiry.
func (c *wsConn) release(held []heldLease) {
	byLease := map[string][]queue.Message{}
	for _, h := range held {
		byLease[h.leaseID] = append(byLease[h.leaseID], queue.Message{Queue: h.queue, Partition: h.partition})
	}
	for lease, msgs := range byLease {
		c.s.poller.Release(context.Background(), lease, msgs)
	}
}

// parseWSAcks decodes the items of an ack frame, and the sub each names
// ("" when none).
func parseWSAcks(raw json.RawMessage) ([]queue.Ack, []string, error) {
	var items []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil || len(items) == 0 {
		return nil, nil, badRequestf("items must be a non-empty array of acknowledgements")
	}
	acks := make([]queue.Ack, len(items))
	subs := make([]string, len(items))
	for i, it := range items {
		a, err := parseAck(it, false)
		if err != nil {
			return nil, nil, err
		}
		if subs[i], _, err = stringField(it, "sub"); err != nil {
			return nil, nil, badRequestf("%v", err)
		}
		acks[i] = a
	}
	return acks, subs, nil
}

// parseWSPush decodes the items of a push frame.
func parseWSPush(raw json.RawMessage) ([]queue.PushItem, error) {
	var arr []json.RawMessage
	if err := json.Unmarshal(raw, &arr); err != nil {
		return nil, badRequestf("items array is required")
	}
	return parsePushItems(arr)
}

// Per-item errors of a WebSocket ack that names no delivery of this
// connection, or cannot tell which.
const (
	ErrTextNotHeld   = "Not delivered on this connection under that lease: ack it where it was delivered"
	ErrTextAmbiguous = "Delivered to several subscriptions of this connection: name its leaseId, sub or consumerGroup"
)

// resolveLocked finds the delivery of this connection an ack item names:
// by its leaseId (unique per delivery), or, without one, by the message
// and the sub or consumerGroup it names. Called with mu.
func (c *wsConn) resolveLocked(a queue.Ack, sub string) (deliveryKey, *wsSub, string) {
	fits := func(m inflightMsg) bool {
		return (sub == "" || m.sub.id == sub) && (a.Group == "" || m.sub.group == a.Group)
	}
	if a.LeaseID != "" {
		k := deliveryKey{a.LeaseID, a.PartitionID, a.TransactionID}
		if m, ok := c.inflight[k]; ok && fits(m) {
			return k, m.sub, ""
		}
		return k, nil, ErrTextNotHeld
	}
	var found deliveryKey
	var holder *wsSub
	for k, m := range c.inflight {
		if k.partitionID != a.PartitionID || k.transactionID != a.TransactionID || !fits(m) {
			continue
		}
		if holder != nil {
			return k, nil, ErrTextAmbiguous
		}
		found, holder = k, m.sub
	}
	if holder == nil {
		return found, nil, ErrTextNotHeld
	}
	return found, holder, ""
}

// ack settles deliveries of this connection. Each item is matched to one
// delivery (resolveLocked), which gives its group and lease: two
// subscriptions in two groups may hold the same message. Items that match
// none are answered with a per-item error; the others go to the store in
// one request, in order.
func (c *wsConn) ack(ctx context.Context, f *wsFrame) {
	acks, subs, err := parseWSAcks(f.Items)
	if err != nil {
		c.send(wsError(f.ID, "bad_request", err.Error()))
		return
	}
	out := make([]ackJSON, len(acks))
	var apply []queue.Ack
	var at []int // apply[j] is item at[j]
	c.mu.Lock()
	for i, a := range acks {
		k, sub, why := c.resolveLocked(a, subs[i])
		if why != "" {
			out[i] = ackJSON{Error: &why, Index: i, TransactionID: a.TransactionID}
			continue
		}
		a.Group, a.LeaseID = sub.group, k.leaseID
		apply = append(apply, a)
		at = append(at, i)
	}
	c.mu.Unlock()
	if len(apply) > 0 {
		results, err := c.s.store.Ack(ctx, apply)
		if err != nil {
			if queue.IsInputError(err) {
				c.send(wsError(f.ID, "bad_request", err.Error()))
			} else {
				c.send(wsError(f.ID, "internal", "acknowledging failed"))
			}
			return
		}
		c.s.afterAck(apply, results)
		for j, res := range results {
			res.Index = at[j]
			out[at[j]] = ackResultJSON(res)
		}
	}
	c.send(map[string]any{"type": "ack_result", "id": f.ID, "results": out})
}

func (c *wsConn) push(ctx context.Context, f *wsFrame) {
	items, err := parseWSPush(f.Items)
	if err != nil {
		c.send(wsError(f.ID, "bad_request", err.Error()))
		return
	}
	if c.s.cfg.Auth != nil {
		if c.claims.Role < RoleReadWrite {
			c.s.metrics.authFailures.WithLabelValues("forbidden").Inc()
			c.send(wsError(f.ID, "forbidden", forbiddenError{have: c.claims.Role, need: RoleReadWrite}.Error()))
			return
		}
		stampSubject(items, c.claims.Subject)
	}
	results, err := c.s.store.Push(ctx, items)
	if err != nil {
		if queue.IsInputError(err) {
			c.send(wsError(f.ID, "bad_request", err.Error()))
		} else {
			c.send(wsError(f.ID, "internal", "pushing failed"))
		}
		return
	}
	c.s.afterPush(results)
	out := make([]any, len(results))
	for i, res := range results {
		out[i] = pushResultJSON(res)
	}
	c.send(map[string]any{"type": "push_result", "id": f.ID, "results": out})
}

// shutdown ends every subscription and releases every lease the connection
// holds, so another consumer gets those messages at once.
func (c *wsConn) shutdown() {
	c.mu.Lock()
	subs := c.subs
	c.subs = map[string]*wsSub{}
	leases := c.takeLeases(nil)
	if !c.closed {
		c.closed = true
		close(c.done)
	}
	c.mu.Unlock()
	for _, sub := range subs {
		if sub.cancel != nil {
			sub.cancel()
		}
	}
	c.release(leases)
	_ = c.ws.Close()
}
