package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
)

// SSE timings.
const (
	// SSEHeartbeatDefault is the interval of heartbeat comments, well
	// under the read timeouts of proxies in between.
	SSEHeartbeatDefault = 15 * time.Second
	// SSEResumeGraceDefault is how long the leases of a closed stream stay
	// held for its browser to come back (to any instance) with Last-Event-ID
	// before they are given to other consumers.
	SSEResumeGraceDefault = 10 * time.Second
	SSELeaseCheckDefault  = 2 * time.Second
	// sseRetryMin and sseRetryMax bound the reconnect delay sent in retry:
	// with jitter, so that a crowd of browsers does not come back at once.
	sseRetryMin     = 1000 * time.Millisecond
	sseRetryMax     = 3000 * time.Millisecond
	sseWriteTimeout = 10 * time.Second
)

// sseStream is one EventSource connection: a standing intention whose
// deliveries are written as events. It has no goroutine of its own while
// idle: deliveries start a writer, timers send heartbeats and check leases,
// and one goroutine waits for the client to close.
type sseStream struct {
	s       *Server
	group   string
	autoAck bool
	in      *poller.Intention

	write     func([]byte) bool // one event or comment to the client, with a deadline
	closeConn func()            // ends a taken-over connection; nil on the ResponseWriter path
	ctx       context.Context   // for the lease check; ends with the stream
	stop      context.CancelFunc
	ended     chan struct{} // closed by end
	endOnce   sync.Once
	busy      sync.WaitGroup // writers and timer callbacks under way

	wmu      sync.Mutex // one write at a time
	finished bool       // under wmu: nothing more is written

	mu       sync.Mutex
	cancel   func()             // withdraws the intention
	queued   []*queue.PopResult // deliveries not yet written, bounded by the credit
	writing  bool               // a writer goroutine runs
	checking bool               // the lease check is armed
	draining bool
	hb       *time.Timer
	check    *time.Timer
	expiry   *time.Timer // ends the stream when its token expires; nil without one
	expires  time.Time   // the token's exp plus the auth leeway; zero when it does not expire
	closed   bool
	inflight map[inflightKey]sseHeld         // written, not yet acknowledged
	marks    map[string]*queue.LeaseMark     // partition id → lease and highest offset written
	order    []string                        // partition ids of marks, oldest first
	byKey    map[string]map[inflightKey]bool // partition id → its in-flight keys
}

// inflightKey is a message an SSE stream holds (its group is the stream's).
type inflightKey struct{ partitionID, transactionID string }

type sseHeld struct {
	leaseID          string
	offset           int64
	queue, partition string
}

// retryLater answers 200 with only a retry: delay, so that EventSource
// comes back (here or elsewhere) rather than giving up.
func retryLater(w http.ResponseWriter) {
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(retryLine() + "\n"))
}

// retryLine is a retry: field with a jittered delay, so that a crowd of
// browsers does not come back at once.
func retryLine() string {
	d := sseRetryMin + rand.N(sseRetryMax-sseRetryMin) // #nosec G404 -- jitter, not a secret
	return "retry: " + strconv.FormatInt(d.Milliseconds(), 10) + "\n"
}

func (s *Server) handleSSE(w http.ResponseWriter, r *http.Request) {
	req, _, _, err := parsePopRequest(r)
	if err == nil {
		err = req.Validate()
	}
	if err != nil {
		s.fail(w, err)
		return
	}
	q := r.URL.Query()
	maxInFlight, err := clampedParam(q.Get("maxInFlight"), "maxInFlight", 1, queue.MaxBatch*10)
	if err != nil {
		s.fail(w, err)
		return
	}
	if maxInFlight == 0 {
		maxInFlight = WSMaxInFlightDefault
	}
	batch := req.Batch
	if batch == 0 {
		batch = WSBatchDefault
	}
	batch = min(batch, maxInFlight)
	token := r.Header.Get("Last-Event-ID")
	if token == "" {
		token = q.Get("lastEventId")
	}
	marks, err := decodeToken(token)
	if err != nil {
		writeError(w, http.StatusBadRequest, "Last-Event-ID is not a resume token of this server")
		return
	}
	if req.Group == "" {
		req.Group = queue.DefaultGroup
	}

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	rc := http.NewResponseController(w)

	// Overloaded or draining: 200 and a retry: delay, so the browser comes
	// back later (elsewhere); any other status makes EventSource give up.
	s.sseMu.Lock()
	full := s.sseCount >= s.cfg.MaxSSEConnections
	if !full {
		s.sseCount++
	}
	s.sseMu.Unlock()
	if full || s.isDraining() {
		if !full {
			s.sseDone()
		}
		s.metrics.sseRefused.Inc()
		retryLater(w)
		return
	}
	handedOff := false // to the stream's own goroutine, which then counts it done
	defer func() {
		if !handedOff {
			s.sseDone()
		}
	}()

	// Everything up to the token was received: acknowledge it, and give the
	// rest of those leases back so this stream receives them again first.
	if len(marks) > 0 && !req.AutoAck {
		res, err := s.store.ResumeLeases(r.Context(), req.Group, marks)
		if err != nil {
			s.log.Error().Err(err).Msg("resuming an SSE stream")
			retryLater(w)
			return
		}
		for i, m := range res {
			if m.Matched {
				s.metrics.sseResumedAcks.Add(float64(m.Acked))
				s.afterRelease(poller.SourceRelease, m.Queue, m.Partition, marks[i].PartitionID, req.Group)
			}
		}
	}

	st := &sseStream{s: s, group: req.Group, autoAck: req.AutoAck,
		ended: make(chan struct{})} // its maps are made on first use: idle streams stay small
	if c, ok := claimsOf(r.Context()); ok && !c.Expires.IsZero() {
		// The stream lasts as long as its token would be accepted on HTTP.
		st.expires = c.Expires.Add(s.cfg.Auth.Leeway)
	}
	st.in = &poller.Intention{
		Target: queue.Target{Queue: req.Queue, Namespace: req.Namespace, Task: req.Task, Partition: req.Partition,
			Group: req.Group, SubscriptionMode: req.SubscriptionMode, SubscriptionFrom: req.SubscriptionFrom},
		Batch: batch, Partitions: max(req.Partitions, streamPartitions(batch, maxInFlight)), Credit: maxInFlight, AutoAck: req.AutoAck, Standing: true,
		Deliver: st.deliver,
	}

	first := []byte(retryLine() + ": connected\n\n")
	if conn, ok := takeOver(w, first); ok {
		// The handler returns: the HTTP server's goroutine and buffers go.
		// One goroutine waits for the client to close and tears down.
		handedOff = true
		if conn == nil {
			s.sseDone() // gone before the first byte
			return
		}
		st.write = func(b []byte) bool {
			_ = conn.SetWriteDeadline(time.Now().Add(sseWriteTimeout))
			_, err := conn.Write(b)
			return err == nil
		}
		st.closeConn = func() { _ = conn.Close() }
		s.streamWG.Add(1)
		s.startSSE(st)
		go func() {
			defer s.streamWG.Done()
			defer s.sseDone()
			var b [1]byte
			for { // an EventSource sends nothing after its request: this ends with the connection
				if _, err := conn.Read(b[:]); err != nil {
					break
				}
			}
			st.end()
			st.busy.Wait()
		}()
		return
	}
	// Not an HTTP/1 connection (HTTP/2): stream through the ResponseWriter,
	// which must not be written after the handler returns.
	w.WriteHeader(http.StatusOK)
	st.write = func(b []byte) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(sseWriteTimeout))
		if _, err := w.Write(b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !st.write(first) {
		return
	}
	s.startSSE(st)
	select {
	case <-st.ended:
	case <-r.Context().Done():
	}
	st.end()
	st.busy.Wait()
}

// startSSE registers the stream: its intention, its heartbeat, and its
// place in the drain.
func (s *Server) startSSE(st *sseStream) {
	st.ctx, st.stop = context.WithCancel(context.Background())
	s.metrics.sseStreams.Inc()
	st.mu.Lock()
	st.cancel = s.poller.Register(st.in)
	st.hb = time.AfterFunc(s.cfg.SSEHeartbeat, st.beat)
	if !st.expires.IsZero() {
		st.expiry = time.AfterFunc(time.Until(st.expires), st.expire)
	}
	st.mu.Unlock()
	s.sseMu.Lock()
	s.sseStreams[st] = true
	s.sseMu.Unlock()
	if s.isDraining() {
		go st.drain(s.spread()) // the drain began as the stream did
	}
}

// takeOver hijacks an HTTP/1 connection and writes the stream's response
// head and first bytes itself. The body ends when the connection closes.
func takeOver(w http.ResponseWriter, first []byte) (net.Conn, bool) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return nil, false
	}
	var head bytes.Buffer
	head.WriteString("HTTP/1.1 200 OK\r\n")
	hdr := w.Header().Clone()
	hdr.Set("Connection", "close")
	_ = hdr.Write(&head)
	head.WriteString("\r\n")
	head.Write(first)
	_ = brw                               // nothing buffered matters: an EventSource sends nothing more
	_ = conn.SetReadDeadline(time.Time{}) // the HTTP server's request deadlines no longer apply
	_ = conn.SetWriteDeadline(time.Now().Add(sseWriteTimeout))
	if _, err := conn.Write(head.Bytes()); err != nil {
		_ = conn.Close()
		return nil, true // taken over, and already gone
	}
	return conn, true
}

// deliver runs on a poller worker: it must not block. The credit bounds
// the queue.
func (st *sseStream) deliver(res *queue.PopResult) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return false
	}
	st.queued = append(st.queued, res)
	if !st.writing {
		st.writing = true
		st.busy.Add(1)
		go st.flush()
	}
	return true
}

// enter marks a timer callback under way; false once the stream closed.
func (st *sseStream) enter() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return false
	}
	st.busy.Add(1)
	return true
}

// send writes b unless the stream has finished.
func (st *sseStream) send(b []byte) bool {
	st.wmu.Lock()
	defer st.wmu.Unlock()
	return !st.finished && st.write(b)
}

// flush is the stream's writer while deliveries are queued.
func (st *sseStream) flush() {
	defer st.busy.Done()
	for {
		st.mu.Lock()
		q := st.queued
		st.queued = nil
		if len(q) == 0 || st.closed {
			st.writing = false
			st.mu.Unlock()
			return
		}
		st.mu.Unlock()
		if !st.writeDeliveries(q) {
			st.mu.Lock()
			st.writing = false
			st.mu.Unlock()
			st.end()
			return
		}
	}
}

// writeDeliveries writes deliveries as events; false when a write failed.
func (st *sseStream) writeDeliveries(q []*queue.PopResult) bool {
	for _, res := range q {
		b, ok := st.events(res)
		if !ok || !st.send(b) {
			return false
		}
		for _, m := range res.Messages {
			st.s.metrics.popped.WithLabelValues(m.Queue, m.Group).Inc()
		}
		if st.autoAck {
			st.s.poller.AddCredit(st.in, len(res.Messages)) // written: room for more
		}
	}
	if !st.autoAck {
		st.armCheck()
	}
	return true
}

// beat writes a heartbeat comment and arms the next.
func (st *sseStream) beat() {
	if !st.enter() {
		return
	}
	defer st.busy.Done()
	if !st.send([]byte(": heartbeat\n\n")) {
		st.end()
		return
	}
	st.mu.Lock()
	if !st.closed {
		st.hb.Reset(st.s.cfg.SSEHeartbeat)
	}
	st.mu.Unlock()
}

// armCheck starts the lease check: it runs only while messages are in
// flight, so an idle stream wakes for nothing but its heartbeat.
func (st *sseStream) armCheck() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.checking || st.closed {
		return
	}
	st.checking = true
	if st.check == nil {
		st.check = time.AfterFunc(st.s.cfg.SSELeaseCheck, st.checkTick)
	} else {
		st.check.Reset(st.s.cfg.SSELeaseCheck)
	}
}

func (st *sseStream) checkTick() {
	if !st.enter() {
		return
	}
	defer st.busy.Done()
	more := st.checkLeases(st.ctx)
	st.mu.Lock()
	if more && !st.closed {
		st.check.Reset(st.s.cfg.SSELeaseCheck)
	} else {
		st.checking = false
	}
	st.mu.Unlock()
}

// expire ends the stream when its token expires, as a WebSocket is closed
// with 4501: nothing more is leased to it, its last event says why, and
// what it holds goes back as for any closed stream. An EventSource then
// reconnects with the same token and is refused 401, so it stops.
func (st *sseStream) expire() {
	if !st.enter() {
		return
	}
	defer st.busy.Done()
	st.mu.Lock()
	cancel := st.cancel
	st.mu.Unlock()
	cancel()
	st.sendLast(disconnectEvent(CloseUnauthorized, "token expired"))
	st.end()
}

// disconnectEvent is the SSE form of a typed close: the WebSocket close
// code and reason as event: disconnect.
func disconnectEvent(code int, reason string) []byte {
	data, _ := json.Marshal(struct {
		Code   int    `json:"code"`
		Reason string `json:"reason"`
	}{code, reason})
	return []byte("event: disconnect\ndata: " + string(data) + "\n\n")
}

// sendLast writes b as the stream's last bytes: nothing is written after it.
func (st *sseStream) sendLast(b []byte) {
	st.wmu.Lock()
	defer st.wmu.Unlock()
	if !st.finished {
		st.write(b)
		st.finished = true
	}
}

// drain stops leasing to the stream now and closes it after delay (a
// random point of the drain window, so that browsers do not all reconnect
// at once), writing first what was already leased for it.
func (st *sseStream) drain(delay time.Duration) {
	st.mu.Lock()
	if st.draining || st.closed {
		st.mu.Unlock()
		return
	}
	st.draining = true
	cancel := st.cancel
	st.mu.Unlock()
	cancel()
	time.AfterFunc(delay, func() {
		if !st.enter() {
			return
		}
		defer st.busy.Done()
		st.mu.Lock()
		q := st.queued
		st.queued = nil
		st.mu.Unlock()
		if st.writeDeliveries(q) {
			st.send([]byte(retryLine() + "\n"))
		}
		st.end()
	})
}

// end finishes the stream once: no more writes or leases, timers stopped,
// leases released (or kept for a resume: close), connection closed.
func (st *sseStream) end() {
	st.endOnce.Do(func() {
		st.wmu.Lock()
		st.finished = true
		st.wmu.Unlock()
		st.mu.Lock()
		st.hb.Stop()
		if st.check != nil {
			st.check.Stop()
		}
		if st.expiry != nil {
			st.expiry.Stop()
		}
		st.mu.Unlock()
		st.stop()
		st.s.sseMu.Lock()
		delete(st.s.sseStreams, st)
		st.s.sseMu.Unlock()
		st.s.metrics.sseStreams.Dec()
		st.close()
		if st.closeConn != nil {
			st.closeConn()
		}
		close(st.ended)
	})
}

// events renders a delivery as SSE events and records each message as in
// flight; the id of each event is the resume token after it. false once the
// stream closed.
func (st *sseStream) events(res *queue.PopResult) ([]byte, bool) {
	var b bytes.Buffer
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return nil, false
	}
	for _, m := range res.Messages {
		data, _ := json.Marshal(streamMessageOf(m))
		if st.marks == nil {
			st.inflight, st.marks, st.byKey = map[inflightKey]sseHeld{}, map[string]*queue.LeaseMark{}, map[string]map[inflightKey]bool{}
		}
		if !st.autoAck && m.LeaseID != "" {
			k := inflightKey{m.PartitionID, m.TransactionID}
			st.inflight[k] = sseHeld{leaseID: m.LeaseID, offset: m.Offset, queue: m.Queue, partition: m.Partition}
			if st.byKey[m.PartitionID] == nil {
				st.byKey[m.PartitionID] = map[inflightKey]bool{}
			}
			st.byKey[m.PartitionID][k] = true
			st.s.deliveries.hold(deliveryKey{m.LeaseID, m.PartitionID, m.TransactionID}, st)
		}
		mk := st.marks[m.PartitionID]
		if mk == nil {
			mk = &queue.LeaseMark{PartitionID: m.PartitionID}
			st.marks[m.PartitionID] = mk
			st.order = append(st.order, m.PartitionID)
		}
		mk.LeaseID, mk.Through = m.LeaseID, m.Offset
		b.WriteString("event: message\nid: ")
		b.WriteString(st.tokenLocked())
		b.WriteString("\ndata: ")
		b.Write(data) // JSON has no raw newlines
		b.WriteString("\n\n")
	}
	if st.autoAck {
		// Nothing to resume: an autoAck token only keeps its partitions'
		// positions, and only the newest matter.
		for len(st.order) > sseMaxTokenEntries/2 {
			delete(st.marks, st.order[0])
			st.order = st.order[1:]
		}
	}
	return b.Bytes(), true
}

func (st *sseStream) tokenLocked() string {
	marks := make([]queue.LeaseMark, 0, len(st.order))
	for _, pid := range st.order {
		marks = append(marks, *st.marks[pid])
	}
	return encodeToken(marks)
}

// settle forgets in-flight messages that were acknowledged (or whose lease
// was lost) and gives their credit back. Called with mu.
func (st *sseStream) settleLocked(k inflightKey) bool {
	if _, ok := st.inflight[k]; !ok {
		return false
	}
	held := st.inflight[k]
	delete(st.inflight, k)
	st.s.deliveries.drop(deliveryKey{held.leaseID, k.partitionID, k.transactionID}, st)
	if ks := st.byKey[k.partitionID]; ks != nil {
		delete(ks, k)
		if len(ks) == 0 {
			// Nothing of that partition is held: the token need not name it.
			delete(st.byKey, k.partitionID)
			delete(st.marks, k.partitionID)
			for i, pid := range st.order {
				if pid == k.partitionID {
					st.order = append(st.order[:i:i], st.order[i+1:]...)
					break
				}
			}
		}
	}
	return true
}

// settled is called by afterAck when a delivery this stream holds was
// acknowledged on this instance (a holder).
func (st *sseStream) settled(d deliveryKey) {
	k := inflightKey{d.partitionID, d.transactionID}
	st.mu.Lock()
	ok := !st.closed && st.inflight[k].leaseID == d.leaseID && st.settleLocked(k)
	st.mu.Unlock()
	if ok {
		st.s.poller.AddCredit(st.in, 1)
	}
}

// checkLeases looks up the stream's leases: acks posted to other instances
// and expired leases give credit back. It reports whether messages are
// still in flight.
func (st *sseStream) checkLeases(ctx context.Context) bool {
	st.mu.Lock()
	if len(st.inflight) == 0 {
		st.mu.Unlock()
		return false
	}
	pids := make([]string, 0, len(st.byKey))
	for pid := range st.byKey {
		pids = append(pids, pid)
	}
	st.mu.Unlock()
	held, err := st.s.store.HeldLeases(ctx, st.group, pids)
	if err != nil {
		return true // next tick
	}
	n := 0
	st.mu.Lock()
	for k, m := range st.inflight {
		h, ok := held[k.partitionID]
		if ok && (h.Finished(m.offset) || h.LeaseID != m.leaseID) && st.settleLocked(k) {
			n++
		}
	}
	left := len(st.inflight)
	st.mu.Unlock()
	if n > 0 {
		st.s.poller.AddCredit(st.in, n)
	}
	return left > 0
}

// close ends the stream. Deliveries not written are released at once. The
// leases of messages written but not acknowledged stay held for the resume
// grace period, so a browser that reconnects with Last-Event-ID (here or
// elsewhere) neither loses them nor receives them twice; after it they go
// to other consumers.
func (st *sseStream) close() {
	st.cancel()
	st.mu.Lock()
	st.closed = true
	held := map[string][]queue.Message{}
	for k, m := range st.inflight {
		held[m.leaseID] = append(held[m.leaseID], queue.Message{Queue: m.queue, Partition: m.partition})
		st.s.deliveries.drop(deliveryKey{m.leaseID, k.partitionID, k.transactionID}, st)
	}
	st.inflight = nil
	unwritten := st.queued
	st.queued = nil
	st.mu.Unlock()
	for _, res := range unwritten {
		st.s.poller.Release(context.Background(), res.LeaseID, res.Messages)
	}
	for lease, msgs := range held {
		st.s.releaseLater(lease, msgs)
	}
}

// releaseLater gives a closed SSE stream's lease back after the resume
// grace period. Close runs whatever is still pending.
func (s *Server) releaseLater(lease string, msgs []queue.Message) {
	if lease == "" {
		return
	}
	release := func() { s.poller.Release(context.Background(), lease, msgs) }
	s.graceMu.Lock()
	defer s.graceMu.Unlock()
	if s.closed {
		release()
		return
	}
	s.graceWG.Add(1)
	var t *time.Timer
	t = time.AfterFunc(s.cfg.SSEResumeGrace, func() {
		defer s.graceWG.Done()
		s.graceMu.Lock()
		_, pending := s.grace[t]
		delete(s.grace, t)
		s.graceMu.Unlock()
		if pending {
			release()
		}
	})
	s.grace[t] = release
}

// Close releases at once the leases that closed SSE streams still hold for
// a resume, and waits for releases under way and for WebSocket connections
// to end (Drain closes them). Call it after the HTTP server has shut down.
func (s *Server) Close() {
	s.streamWG.Wait()
	s.graceMu.Lock()
	s.closed = true
	pending := s.grace
	s.grace = map[*time.Timer]func(){}
	s.graceMu.Unlock()
	for t, release := range pending {
		if t.Stop() {
			s.graceWG.Done() // its func will not run
		}
		release()
	}
	s.graceWG.Wait()
}

func (s *Server) sseDone() {
	s.sseMu.Lock()
	s.sseCount--
	s.sseMu.Unlock()
}
