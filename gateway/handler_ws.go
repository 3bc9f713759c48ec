package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/internal/httpapi"
	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
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
	// has read it down to wsResumeAt. A client whose socket takes nothing
	// of a frame for SlowConsumerAfter, or that also leaves its replies
	// unread until wsWriteQueue, is a slow consumer: closed 4001
	// (session.go).
	wsWriteQueue = 1024
	wsHoldAt     = 64
	wsResumeAt   = 16
	// wsWriteTimeout is the deadline of each piece of a frame's write
	// (writePiece): a backstop past the slow-consumer close
	// (SlowConsumerAfter + SlowConsumerCloseGrace), which must come first
	// to send its code.
	wsWriteTimeout          = 10 * time.Second
	wsPingInterval          = 30 * time.Second
	wsReadTimeout           = 2 * wsPingInterval // a silent client is gone
	wsMalformedFramesToKill = 100                // protocol errors tolerated per connection
)

// wsWriteBuffers lends write buffers to connections while they write.
var wsWriteBuffers sync.Pool

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
	// auth
	Token string `json:"token"`
	// follow (queue, partition above), unfollow (follow_ws.go)
	From   string `json:"from"`
	Follow string `json:"follow"`
}

// wsFrameFields are wsFrame's member names, as written.
var wsFrameFields = func() []string {
	t := reflect.TypeFor[wsFrame]()
	out := make([]string, 0, t.NumField())
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		out = append(out, name)
	}
	return out
}()

// miscasedFrameField returns the first member of frame (a JSON object)
// whose name is a frame field's spelt in other case, or "". encoding/json
// reads "TYPE" as type; field names are case-sensitive, as push and ack
// items are (json_members.go), so such a frame is refused rather than
// read as something the client did not write.
func miscasedFrameField(frame []byte) string {
	found := ""
	eachMember(frame, func(name []byte, _ json.RawMessage) {
		if found != "" {
			return
		}
		for _, f := range wsFrameFields {
			if string(name) != f && strings.EqualFold(string(name), f) {
				found = string(name)
				return
			}
		}
	})
	return found
}

// wsConn is the WebSocket transport of a session: it reads and answers
// frames, writes what the session queues, and pings. The session owns the
// subscriptions, their deliveries and the write queue (session.go).
type wsConn struct {
	ss     *session
	ws     *websocket.Conn
	claims auth.Claims // when auth is on

	pmu     sync.Mutex
	pinger  *time.Timer
	stopped bool // under pmu: ping no more

	// Ack frames are applied in the background, so that the acks of one
	// connection sent back to back share transactions (queueAck keeps
	// their order); any other frame, and the end of the connection, waits
	// for them first. acking bounds how many are in flight.
	acks   sync.WaitGroup
	acking chan struct{}

	fl *wsFollows // the connection's follows (follow_ws.go); nil until the first
}

// wsAcksInFlight bounds a connection's ack frames being applied at once;
// the reader waits past it.
const wsAcksInFlight = 64

// handleWS serves a WebSocket connection: a register step (the checks an
// HTTP answer can refuse, returned to the adapter; the upgrade; the token's
// verdict as a close code a browser can read) and the connection's own
// goroutine (serveWS), after which this handler returns.
func (s *Server) handleWS(w http.ResponseWriter, r *http.Request) error {
	if !auth.CheckOrigin(r, s.allowedOrigins) {
		return httpapi.Status(http.StatusForbidden, "origin not allowed")
	}
	if s.isDraining() {
		refuseDraining(w)
		return nil
	}
	full := s.wsSessions.len() >= s.cfg.MaxWSConnections
	if full {
		s.conns.refused.WithLabelValues(refusedWSMax).Inc()
		w.Header().Set("Retry-After", "5")
		return httpapi.Status(http.StatusServiceUnavailable, "too many WebSocket connections; retry later or elsewhere")
	}
	var claims auth.Claims
	var authErr error
	if s.cfg.Auth != nil {
		claims, authErr = s.checkToken(r, auth.RoleReadOnly, auth.Upgrades)
	}
	// A small read buffer of its own (the HTTP server's 4 KiB one is let go;
	// larger payloads are read past it) and write buffers lent only while
	// writing: idle connections are cheap.
	up := websocket.Upgrader{Subprotocols: []string{WSSubprotocol}, CheckOrigin: func(*http.Request) bool { return true },
		ReadBufferSize: 512, WriteBufferSize: 4096, WriteBufferPool: &wsWriteBuffers}
	ws, err := up.Upgrade(w, r, nil)
	if err != nil {
		return nil // the upgrader has answered
	}
	ws.SetReadLimit(WSReadLimitDefault)
	switch {
	case errors.Is(authErr, auth.ErrForbidden):
		// A browser cannot read the status of a refused upgrade; it can
		// read a close code.
		wsClose(ws, &Disconnect{Code: CloseForbidden, Reason: authErr.Error()})
		return nil
	case authErr != nil:
		wsClose(ws, &Disconnect{Code: CloseUnauthorized, Reason: authErr.Error()})
		return nil
	case s.isDraining():
		wsClose(ws, &disconnectShutdown)
		return nil
	}
	c := &wsConn{ws: ws, claims: claims}
	c.ss = newSession(s, sessionOptions{maxSubs: WSMaxSubscriptions,
		holdAt: wsHoldAt, resumeAt: wsResumeAt, maxQueue: wsWriteQueue, leaseCheck: s.cfg.WSLeaseCheck, expires: claims.Expires})
	c.ss.t = c
	if !s.wsSessions.add(c.ss, s.isDraining) {
		// Drain began during the upgrade; it lists the sessions under the
		// set's lock, so one added after that would never be drained.
		wsClose(ws, &disconnectShutdown)
		return nil
	}
	s.metrics.wsConns.Inc()
	// The connection lives on in a goroutine of its own, and this handler
	// returns: the HTTP server's goroutine, buffers and request go, and an
	// idle connection costs one small goroutine. Pings come from a timer,
	// frames from the session's writer, started when there are some.
	s.streamWG.Add(1)
	go s.serveWS(c)
	return nil
}

// serveWS is a connection's goroutine: it reads frames until the
// connection fails, then tears the connection down.
func (s *Server) serveWS(c *wsConn) {
	defer s.streamWG.Done()
	c.ss.start()
	ctx, cancel := context.WithCancel(context.Background())
	c.pmu.Lock()
	c.pinger = time.AfterFunc(wsPingInterval, c.ping)
	c.pmu.Unlock()
	c.reader(ctx)
	c.endFollows()
	c.acks.Wait() // the acks it read are applied, before leases are let go
	cancel()
	c.pmu.Lock()
	c.stopped = true
	c.pinger.Stop()
	c.pmu.Unlock()
	c.ss.close(nil)
	c.ss.wait()
	s.wsSessions.remove(c.ss)
	s.metrics.wsConns.Dec()
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
				c.ss.close(&Disconnect{Code: websocket.CloseMessageTooBig, Reason: "frame larger than " + strconv.Itoa(WSReadLimitDefault) + " bytes"})
			}
			return
		}
		_ = c.ws.SetReadDeadline(time.Now().Add(wsReadTimeout))
		ok := true
		// The deep calls of handling a frame (JSON, SQL) would grow this
		// long-lived goroutine's stack for good: they run on a kept one.
		c.ss.s.stacks.do(func() {
			var f wsFrame
			// A text frame must be UTF-8 (RFC 6455 §5.6); JSON decoding
			// would silently replace bad bytes in names.
			if ok = kind == websocket.TextMessage && utf8.Valid(data) && json.Unmarshal(data, &f) == nil; ok {
				if name := miscasedFrameField(data); name != "" {
					c.ss.send(wsError(f.ID, "bad_request", "unknown field "+strconv.Quote(name)+
						": frame field names are case-sensitive"))
					return
				}
				c.handle(ctx, &f)
			}
		})
		if !ok {
			c.ss.s.metrics.wsBadFrames.Inc()
			if bad++; bad > wsMalformedFramesToKill {
				c.ss.close(&disconnectBadFrames)
				return
			}
			c.ss.send(wsError(nil, "bad_frame", "frames are JSON text objects with a type"))
		}
	}
}

func (c *wsConn) handle(ctx context.Context, f *wsFrame) {
	if f.Type != "ack" {
		c.acks.Wait() // every frame but an ack sees the acks before it applied
	}
	switch f.Type {
	case "subscribe", "ack", "renew":
		// They lease or settle messages: the reference server's read-write.
		if !c.mayWrite(f) {
			return
		}
	}
	switch f.Type {
	case "ping":
		c.ss.send(map[string]any{"type": "pong", "id": f.ID})
	case "subscribe":
		c.subscribe(f)
	case "unsubscribe":
		c.unsubscribe(f)
	case "follow":
		c.follow(f)
	case "unfollow":
		c.unfollow(f)
	case "ack":
		c.ack(ctx, f)
	case "renew":
		lease, err := c.ss.s.hideLease(ctx, c.claims.Rights, f.LeaseID)
		if err != nil {
			c.ss.send(wsStoreError(f.ID, err, "extending the lease failed"))
			return
		}
		res, err := c.ss.s.store.ExtendLease(ctx, lease, f.Seconds, c.claims.Holder())
		if err != nil {
			c.ss.send(wsStoreError(f.ID, err, "extending the lease failed"))
			return
		}
		res.LeaseID = f.LeaseID // the id asked about, hidden or not
		if res.Error == queue.ErrTextLeaseForeign {
			c.ss.s.metrics.authFailures.WithLabelValues("forbidden").Inc()
			c.ss.send(wsError(f.ID, "forbidden", res.Error))
			return
		}
		out := extendResultJSON(res)
		c.ss.send(map[string]any{"type": "renew_result", "id": f.ID, "result": out})
	case "push":
		c.push(ctx, f)
	case "auth":
		c.auth(f)
	default:
		c.ss.s.metrics.wsBadFrames.Inc()
		c.ss.send(wsError(f.ID, "unknown_type", "unknown frame type "+strconv.Quote(f.Type)))
	}
}

// wsStoreError is the error frame of a failed store call: the client's
// mistake (an input error) says what it was; a database fault says only
// what failed (the details go to the log, as on HTTP).
func wsStoreError(id json.RawMessage, err error, failed string) map[string]any {
	var br *httpapi.Error
	if errors.As(err, &br) && br.Status == http.StatusForbidden {
		return wsError(id, "forbidden", br.Msg)
	}
	if queue.IsInputError(err) {
		return wsError(id, "bad_request", err.Error())
	}
	if queue.IsUnavailable(err) {
		f := wsError(id, "unavailable", ErrTextUnavailable)
		f["retryAfter"] = RetryAfterUnavailable
		return f
	}
	return wsError(id, "internal", failed)
}

func wsError(id json.RawMessage, code, msg string) map[string]any {
	return map[string]any{"type": "error", "id": id, "code": code, "message": msg}
}

// write writes one queued item: a reply, or a delivery as a deliver frame
// (a transport).
// deliverFrame is a deliver frame, its fields in the order a map would
// give them (the bytes are as before), without a map's encoding cost.
type deliverFrame struct {
	Messages []streamMessageJSON `json:"messages"`
	Sub      string              `json:"sub"`
	Type     string              `json:"type"`
}

func (c *wsConn) write(it outItem) bool {
	f := it.frame
	if it.res != nil {
		msgs := make([]streamMessageJSON, len(it.res.Messages))
		for i, m := range it.res.Messages {
			msgs[i] = streamMessageOf(m)
		}
		f = deliverFrame{Messages: msgs, Sub: it.sub.id, Type: "deliver"}
	}
	_ = c.ws.SetWriteDeadline(time.Now().Add(wsWriteTimeout))
	// As WriteJSON, through a writer that tells the slow-consumer watch of
	// every piece the socket takes.
	w, err := c.ws.NextWriter(websocket.TextMessage)
	if err != nil {
		return false
	}
	err = json.NewEncoder(wsPieces{w: w, c: c}).Encode(f)
	return w.Close() == nil && err == nil
}

// wsPieces writes a frame in pieces (writePieces), each with a fresh
// deadline and told to the session as progress.
type wsPieces struct {
	w io.Writer
	c *wsConn
}

func (p wsPieces) Write(b []byte) (int, error) {
	err := writePieces(b, func(piece []byte) error {
		_ = p.c.ws.SetWriteDeadline(time.Now().Add(wsWriteTimeout))
		_, err := p.w.Write(piece)
		return err
	}, p.c.ss.progressed)
	if err != nil {
		return 0, err
	}
	return len(b), nil
}

// close sends d as the close frame, if any, and closes the socket; the
// reader then fails and the connection's goroutine ends (a transport).
func (c *wsConn) close(d *Disconnect) {
	if d != nil && d.Code == CloseSlowConsumer {
		c.closeSlow(d)
		return
	}
	wsClose(c.ws, d)
}

// closeSlow closes a slow consumer: the frame being written (the writer
// may be blocked on the client's full socket) and then the close frame get
// SlowConsumerCloseGrace together. A frame is never cut short before the
// close frame, which would garble it: the write under way either ends in
// the grace, the close frame following it (gorilla hands its write lock to
// the waiting close frame first), or fails at the grace's end, and the
// socket is closed without one. A client that reads only slowly gets 4001
// after what its socket held; one that reads nothing is disconnected.
func (c *wsConn) closeSlow(d *Disconnect) {
	until := time.Now().Add(SlowConsumerCloseGrace)
	_ = c.ws.NetConn().SetWriteDeadline(until) // the write under way
	_ = c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(d.Code, d.Reason), until)
	_ = c.ws.Close()
}

// wsClose writes d's close frame (WriteControl may run alongside the
// writer) and closes the socket.
func wsClose(ws *websocket.Conn, d *Disconnect) {
	if d != nil {
		_ = ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(d.Code, d.Reason), time.Now().Add(time.Second))
	}
	_ = ws.Close()
}

// ping sends a WebSocket ping and arms the next; the client's pong extends
// the read deadline. WriteControl may run alongside the writer.
func (c *wsConn) ping() {
	if err := c.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(wsWriteTimeout)); err != nil {
		_ = c.ws.Close()
		return
	}
	c.pmu.Lock()
	if !c.stopped {
		c.pinger.Reset(wsPingInterval)
	}
	c.pmu.Unlock()
}

// streamPartitions is how many partitions a subscription may lease in one
// poll cycle: as many as messages it may have in flight, so that a stream
// over many partitions holding a message or two each (the mailbox pattern)
// fills its credit in one cycle rather than one batch's worth of partitions
// per cycle. The poller stops claiming once the partitions' waiting
// messages cover the credit, so over deep partitions it claims credit ÷
// batch of them.
func streamPartitions(maxInFlight int) int {
	return min(max(maxInFlight, 1), queue.MaxPartitions)
}

func (c *wsConn) subscribe(f *wsFrame) {
	req := queue.PopRequest{Queue: f.Queue, Partition: f.Partition, Group: f.ConsumerGroup,
		SubscriptionMode: f.SubscriptionMode, SubscriptionFrom: f.SubscriptionFrom}
	if err := req.Validate(); err != nil || f.Queue == "" {
		msg := "queue is required"
		if err != nil {
			msg = err.Error()
		}
		c.ss.send(wsError(f.ID, "bad_request", msg))
		return
	}
	if err := checkConsume(c.claims.Rights, &req); err != nil {
		// This subscription only: the connection and its others carry on.
		c.ss.s.metrics.authFailures.WithLabelValues("forbidden").Inc()
		c.ss.send(wsError(f.ID, "forbidden", err.Error()))
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
	sub, err := c.ss.subscribe(&poller.Intention{
		Target: queue.Target{Queue: f.Queue, Partition: f.Partition, Group: f.ConsumerGroup,
			SubscriptionMode: f.SubscriptionMode, SubscriptionFrom: f.SubscriptionFrom},
		Batch: batch, Partitions: streamPartitions(maxInFlight), Credit: maxInFlight, AutoAck: f.AutoAck,
		Subject: c.claims.Subject, Extend: true, // the session answers a nack of what a nack gave back (queueAck)
	})
	switch {
	case errors.Is(err, errTooManySubs):
		c.ss.send(wsError(f.ID, "too_many_subscriptions", "at most "+strconv.Itoa(WSMaxSubscriptions)+" subscriptions per connection"))
		return
	case err != nil:
		c.ss.send(wsError(f.ID, "shutting_down", err.Error()))
		return
	}
	// Reply before the first delivery can be queued.
	c.ss.send(map[string]any{"type": "subscribed", "id": f.ID, "sub": sub.id})
	c.ss.startSub(sub)
}

// auth takes a fresh token for the connection (before the old one
// expires): the same subject, rights checked again. Subscriptions and
// follows the new token no longer allows end, each with its own forbidden
// error; the
// connection then lives until the new token's exp. A token that fails
// changes nothing: the connection still ends at the old exp.
func (c *wsConn) auth(f *wsFrame) {
	a := c.ss.s.cfg.Auth
	if a == nil {
		c.ss.send(wsError(f.ID, "bad_request", "auth is off on this server"))
		return
	}
	claims, err := a.Verify(f.Token, time.Now())
	switch {
	case err != nil:
		c.ss.s.metrics.authFailures.WithLabelValues("invalid").Inc()
		c.ss.send(wsError(f.ID, "unauthorized", err.Error()))
		return
	case claims.Subject != c.claims.Subject:
		c.ss.s.metrics.authFailures.WithLabelValues("forbidden").Inc()
		c.ss.send(wsError(f.ID, "forbidden", "a fresh token must name the same subject as the connection's"))
		return
	case claims.Role < auth.RoleReadOnly:
		c.ss.send(wsError(f.ID, "forbidden", auth.RoleError{Have: claims.Role, Need: auth.RoleReadOnly}.Error()))
		return
	}
	c.claims = claims
	c.ss.rearm(claims.Expires, claims.Expires.IsZero()) // at exp, as the first token
	for _, sub := range c.ss.subscriptions() {
		t := sub.in.Target
		if err := checkConsume(claims.Rights, &queue.PopRequest{Queue: t.Queue, Partition: t.Partition}); err != nil {
			if c.ss.unsubscribe(sub.id) {
				c.ss.send(map[string]any{"type": "error", "code": "forbidden", "sub": sub.id, "message": err.Error()})
			}
		}
	}
	c.recheckFollows(claims.Rights)
	c.ss.send(map[string]any{"type": "auth_result", "id": f.ID, "expiresAt": expiresJSON(claims.Expires)})
}

// expiresJSON is an expiry as the auth_result frame gives it: RFC 3339, or
// null for a token that does not expire.
func expiresJSON(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format(time.RFC3339)
}

func (c *wsConn) unsubscribe(f *wsFrame) {
	if !c.ss.unsubscribe(f.Sub) {
		c.ss.send(wsError(f.ID, "unknown_subscription", "no subscription "+strconv.Quote(f.Sub)))
		return
	}
	c.ss.send(map[string]any{"type": "unsubscribed", "id": f.ID, "sub": f.Sub})
}

// ack settles deliveries of this connection (session.ack).
// The frame's items are matched and queued now, in frame order; they are
// applied and answered in the background (see wsConn.acks).
func (c *wsConn) ack(ctx context.Context, f *wsFrame) {
	acks, subs, err := parseWSAcks(f.Items)
	if err != nil {
		c.ss.send(wsError(f.ID, "bad_request", err.Error()))
		return
	}
	if err := c.ss.s.hideAcks(ctx, c.claims.Rights, acks); err != nil {
		c.ss.send(wsStoreError(f.ID, err, "acknowledging failed"))
		return
	}
	if c.acking == nil { // only the reader gets here
		c.acking = make(chan struct{}, wsAcksInFlight)
	}
	c.acking <- struct{}{}
	finish, err := c.ss.queueAck(ctx, acks, subs)
	if err != nil {
		<-c.acking
		c.ss.send(wsStoreError(f.ID, err, "acknowledging failed"))
		return
	}
	c.acks.Add(1)
	c.ss.s.stacks.goDo(func() {
		defer func() {
			<-c.acking
			c.acks.Done()
		}()
		out, err := finish()
		if err != nil {
			c.ss.send(wsStoreError(f.ID, err, "acknowledging failed"))
			return
		}
		c.ss.send(map[string]any{"type": "ack_result", "id": f.ID, "results": out})
	})
}

// parseWSAcks decodes the items of an ack frame, and the sub each names
// ("" when none).
func parseWSAcks(raw json.RawMessage) ([]queue.Ack, []string, error) {
	// Sized by a count of the elements first: the slices are allocated
	// once, and a frame's items are walked twice at no allocation.
	n, objects := 0, true
	if !eachElement(raw, func(json.RawMessage) { n++ }) || n == 0 {
		return nil, nil, httpapi.BadRequestf("items must be a non-empty array of acknowledgements")
	}
	items := make([]ackItemJSON, n)
	n = 0
	eachElement(raw, func(v json.RawMessage) {
		objects = objects && items[n].decode(v)
		n++
	})
	if !objects {
		return nil, nil, httpapi.BadRequestf("items must be a non-empty array of acknowledgements")
	}
	acks := make([]queue.Ack, len(items))
	subs := make([]string, len(items))
	for i := range items {
		it := &items[i]
		a, err := parseAckItem(it, false)
		if err != nil {
			return nil, nil, err
		}
		if subs[i], _, err = httpapi.StringValue(it.Sub, "sub"); err != nil {
			return nil, nil, httpapi.BadRequestf("%v", err)
		}
		acks[i] = a
	}
	return acks, subs, nil
}

// parseWSPush decodes the items of a push frame.
func parseWSPush(raw json.RawMessage) ([]queue.PushItem, error) {
	var arr []json.RawMessage
	if err := json.Unmarshal(raw, &arr); err != nil {
		return nil, httpapi.BadRequestf("items array is required")
	}
	return parsePushItems(arr)
}

// mayWrite reports whether the connection's token may send f (role
// read-write, when auth is on); if not, it answers f's forbidden error.
func (c *wsConn) mayWrite(f *wsFrame) bool {
	if c.ss.s.cfg.Auth == nil || c.claims.Role >= auth.RoleReadWrite {
		return true
	}
	c.ss.s.metrics.authFailures.WithLabelValues("forbidden").Inc()
	c.ss.send(wsError(f.ID, "forbidden", auth.RoleError{Have: c.claims.Role, Need: auth.RoleReadWrite}.Error()))
	return false
}

func (c *wsConn) push(ctx context.Context, f *wsFrame) {
	items, err := parseWSPush(f.Items)
	if err != nil {
		c.ss.send(wsError(f.ID, "bad_request", err.Error()))
		return
	}
	if c.ss.s.cfg.Auth != nil {
		if !c.mayWrite(f) {
			return
		}
		if err := checkProduce(c.claims.Rights, items); err != nil {
			c.ss.s.metrics.authFailures.WithLabelValues("forbidden").Inc()
			c.ss.send(wsError(f.ID, "forbidden", err.Error()))
			return
		}
		stampSubject(items, c.claims.Subject)
	}
	if c.ss.s.maint.push.Load() {
		c.bufferPush(f, items) // push maintenance: to disk, not to the database
		return
	}
	results, err := c.ss.s.store.Push(ctx, items)
	if err != nil {
		c.ss.send(wsStoreError(f.ID, err, "pushing failed"))
		return
	}
	c.ss.s.afterPush(results)
	out := make([]any, len(results))
	for i, res := range results {
		out[i] = pushResultJSON(res)
	}
	c.ss.send(map[string]any{"type": "push_result", "id": f.ID, "results": out})
}
