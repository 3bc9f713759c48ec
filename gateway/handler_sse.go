package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/internal/httpapi"
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
	// WSLeaseCheckDefault: a busy connection costs one lookup per 30 s per
	// consumer group; a lease expires after its queue's leaseTime (300 s by
	// default) anyway.
	WSLeaseCheckDefault = 30 * time.Second
	// sseRetryMin and sseRetryMax bound the reconnect delay sent in retry:
	// with jitter, so that a crowd of browsers does not come back at once.
	sseRetryMin = 1000 * time.Millisecond
	sseRetryMax = 3000 * time.Millisecond
)

// sseWriteTimeout is the deadline of each piece of a write (writePiece): a
// backstop past the slow-consumer close (SlowConsumerAfter +
// SlowConsumerCloseGrace), which must come first to send its event. A
// variable for the tests.
var sseWriteTimeout = 10 * time.Second

// sseStream is the SSE transport of a session with one subscription: it
// writes deliveries as events whose ids are resume tokens, and heartbeats.
// It has no goroutine of its own while idle: the session's writer writes
// deliveries, timers send heartbeats and check leases, and one goroutine
// waits for the client to close.
type sseStream struct {
	ss      *session
	autoAck bool

	raw       func([]byte, func()) bool // events or a comment to the client, in pieces told to the func, by st.deadline()
	closeConn func()                    // ends a taken-over connection; nil on the ResponseWriter path
	sseDeadline

	wmu      sync.Mutex // one write at a time
	finished bool       // under wmu: nothing more is written
	broken   bool       // under wmu: a write failed, perhaps within an event
	hb       *time.Timer

	tmu    sync.Mutex                  // the resume token; after session.mu
	origin streamOrigin                // the chain's, in every token
	marks  map[string]*queue.LeaseMark // partition id → lease and highest offset written
	order  []string                    // partition ids of marks, oldest first
	chain  chainRef                    // its place in its chain (sse_chain.go)
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

// sseRequest is a subscription stream's request, read and checked.
type sseRequest struct {
	req         queue.PopRequest
	maxInFlight int
	batch       int
	marks       []queue.LeaseMark // the resume token, partitions the bearer may not consume hidden
	origin      streamOrigin      // the resume token's chain; zero: none (a first stream, or a version 1 token)
}

// handleSSE serves a subscription as an event stream, in the shape of
// Mercure's: a register step (read and check the request, resume, open the
// stream: all that may answer an HTTP error, returned to the adapter) and
// one wait (a goroutine parked in a read, or one select), until the stream
// ends.
func (s *Server) handleSSE(w http.ResponseWriter, r *http.Request) error {
	p, err := s.readSSERequest(r)
	if err != nil {
		return err
	}
	setEventStreamHeaders(w.Header())
	// Overloaded or draining: 200 and a retry: delay, so the browser comes
	// back later (elsewhere); any other status makes EventSource give up.
	if ok, full := s.admitSSE(w); !ok {
		if full {
			s.conns.refused.WithLabelValues(refusedSSEMax).Inc()
		}
		return nil
	}
	handedOff := false // to the stream's own goroutine, which then counts it done
	defer func() {
		if !handedOff {
			s.sseDone()
		}
	}()
	if ok, err := s.resumeSSE(w, r, &p); !ok {
		return err
	}
	st, sub, err := s.openSSE(r, &p)
	if err != nil { // a new session has no subscription and is not draining
		st.ss.close(nil)
		retryLater(w)
		return nil
	}
	// The newest stream of its chain (after its marks took, in resumeSSE):
	// what the chain's closed streams kept for a resume comes back at once.
	s.resumedChain(st.chain)
	first := []byte(retryLine() + ": connected\n\n")
	if conn, ok := takeOver(w, first); ok {
		// The handler returns: the HTTP server's goroutine and buffers go.
		// One goroutine waits for the client to close and tears down.
		handedOff = true
		if conn == nil {
			st.ss.close(nil)
			s.sseDone() // gone before the first byte
			return nil
		}
		st.overConn(conn)
		s.startSSE(st, sub)
		s.whenClosed(conn, func() { s.endSSE(st) })
		return nil
	}
	// Not an HTTP/1 connection (HTTP/2): stream through the ResponseWriter,
	// which must not be written after the handler returns.
	w.WriteHeader(http.StatusOK)
	st.overWriter(w)
	if !st.raw(first, nil) {
		st.ss.close(nil)
		return nil
	}
	s.startSSE(st, sub)
	untilDone(r, st.ss.done, func() { s.endSSE(st) })
	return nil
}

// readSSERequest reads and checks a subscription stream's request: the
// subscription, its rights (403: EventSource does not retry it), its
// bounds, and the resume token.
func (s *Server) readSSERequest(r *http.Request) (sseRequest, error) {
	var p sseRequest
	req, _, _, err := parsePopRequest(r)
	if err == nil {
		err = req.Validate()
	}
	if err == nil {
		err = checkConsume(rightsOf(r.Context()), &req)
	}
	if err != nil {
		return p, err
	}
	q := r.URL.Query()
	if p.maxInFlight, err = httpapi.ClampedParam(q.Get("maxInFlight"), "maxInFlight", 1, queue.MaxBatch*10); err != nil {
		return p, err
	}
	if p.maxInFlight == 0 {
		p.maxInFlight = WSMaxInFlightDefault
	}
	p.batch = req.Batch
	if p.batch == 0 {
		p.batch = WSBatchDefault
	}
	p.batch = min(p.batch, p.maxInFlight)
	token := r.Header.Get("Last-Event-ID")
	if token == "" {
		token = q.Get("lastEventId")
	}
	if p.origin, p.marks, err = decodeToken(token); err != nil {
		return p, httpapi.BadRequest("Last-Event-ID is not a resume token of this server")
	}
	if rights := rightsOf(r.Context()); rights != nil && len(p.marks) > 0 {
		// A resume acks what the token covers: only on partitions this
		// bearer may consume (another's token, learned out of band, acks
		// nothing).
		ids := make([]string, len(p.marks))
		for i, m := range p.marks {
			ids[i] = m.PartitionID
		}
		names, err := s.visible(r.Context(), rights, ids)
		if err != nil {
			return p, err
		}
		for i := range p.marks {
			p.marks[i].PartitionID = hidePartition(p.marks[i].PartitionID, names)
		}
	}
	if req.Group == "" {
		req.Group = queue.DefaultGroup
	}
	p.req = req
	return p, nil
}

// resumeSSE acknowledges everything up to the resume token, and gives the
// rest of those leases back so this stream receives them again first. It
// returns false when the stream must not start: with the error to answer,
// or nil when it has answered (a retry:).
func (s *Server) resumeSSE(w http.ResponseWriter, r *http.Request, p *sseRequest) (bool, error) {
	if len(p.marks) == 0 || p.req.AutoAck {
		return true, nil
	}
	res, err := s.store.ResumeLeases(r.Context(), p.req.Group, p.marks, holderOf(r.Context()))
	if errors.Is(err, queue.ErrForeign) {
		// Another subject's token, learned out of band: a terminal
		// answer (EventSource gives up on any status but 200).
		return false, err
	}
	if err != nil {
		s.log.Error().Err(err).Msg("resuming an SSE stream")
		retryLater(w)
		return false, nil
	}
	for i, m := range res {
		if m.Matched {
			s.metrics.sseResumedAcks.Add(float64(m.Acked))
			s.afterRelease(poller.SourceRelease, m.Queue, m.Partition, p.marks[i].PartitionID, p.req.Group)
		}
	}
	return true, nil
}

// openSSE makes the stream's session and its subscription (not started).
func (s *Server) openSSE(r *http.Request, p *sseRequest) (*sseStream, *subscription, error) {
	req := &p.req
	st := &sseStream{autoAck: req.AutoAck, origin: p.origin}
	if st.origin == (streamOrigin{}) {
		st.origin = newOrigin() // a chain starts
	}
	st.chain = s.joinChain(chainKey(st.origin, holderOf(r.Context())))
	opts := sessionOptions{keepForResume: true, leaseCheck: s.cfg.SSELeaseCheck, flushOnDrain: true,
		partitionSettled: st.forget, chain: st.chain}
	if c, ok := auth.ClaimsFrom(r.Context()); ok && !c.Expires.IsZero() {
		// The stream lasts as long as its token would be accepted on HTTP.
		opts.expires = c.Expires.Add(s.cfg.Auth.Leeway)
	}
	st.ss = newSession(s, opts)
	st.ss.t = st
	sub, err := st.ss.subscribe(&poller.Intention{
		Target: queue.Target{Queue: req.Queue, Namespace: req.Namespace, Task: req.Task, Partition: req.Partition, QueueMatch: req.QueueMatch,
			Group: req.Group, SubscriptionMode: req.SubscriptionMode, SubscriptionFrom: req.SubscriptionFrom},
		Batch: p.batch, Partitions: max(req.Partitions, streamPartitions(p.maxInFlight)), Credit: p.maxInFlight, AutoAck: req.AutoAck,
		Subject: subjectOf(r.Context()),
	})
	return st, sub, err
}

// overConn makes the stream write to a taken-over connection (streamConn).
func (st *sseStream) overConn(conn net.Conn) {
	sc := newStreamConn(conn, &st.until)
	st.raw = func(b []byte, progress func()) bool {
		return writePieces(b, func(piece []byte) error {
			sc.extend()
			_, err := sc.Write(piece)
			return err
		}, progress) == nil
	}
	st.setDeadline = sc.SetWriteDeadline
	st.closeConn = func() { _ = conn.Close() }
}

// overWriter makes the stream write through the ResponseWriter (HTTP/2),
// each piece with its deadline, flushed.
func (st *sseStream) overWriter(w http.ResponseWriter) {
	rc := http.NewResponseController(w)
	st.raw = func(b []byte, progress func()) bool {
		err := writePieces(b, func(piece []byte) error {
			_ = rc.SetWriteDeadline(st.deadline())
			_, err := w.Write(piece)
			return err
		}, progress)
		return err == nil && rc.Flush() == nil
	}
	st.setDeadline = rc.SetWriteDeadline
}

// setEventStreamHeaders sets the headers of an event stream's 200.
func setEventStreamHeaders(h http.Header) {
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
}

// admitSSE counts a new event stream in (sseDone counts it out), unless
// the server has MaxSSEConnections of them (full) or is draining: then it
// answers 200 with only a retry: and counts the refusal.
func (s *Server) admitSSE(w http.ResponseWriter) (ok, full bool) {
	s.sseMu.Lock()
	full = s.sseCount >= s.cfg.MaxSSEConnections
	if !full {
		s.sseCount++
	}
	s.sseMu.Unlock()
	if !full && !s.isDraining() {
		return true, false
	}
	if !full {
		s.sseDone()
	}
	s.metrics.sseRefused.Inc()
	retryLater(w)
	return false, full
}

// whenClosed waits, in a goroutine of the server's (streamWG), for the
// client to close a taken-over event stream's connection, then runs end
// and counts the stream out (sseDone). An EventSource sends nothing after
// its request: the read ends with the connection.
func (s *Server) whenClosed(conn net.Conn, end func()) {
	s.streamWG.Add(1)
	go func() {
		defer s.streamWG.Done()
		defer s.sseDone()
		var b [1]byte
		for {
			if _, err := conn.Read(b[:]); err != nil {
				break
			}
		}
		end()
	}()
}

// untilDone is the handler's one select of a stream served through the
// ResponseWriter: it waits for the stream to end (done) or the client to
// leave, then runs end.
func untilDone(r *http.Request, done <-chan struct{}, end func()) {
	select {
	case <-done:
	case <-r.Context().Done():
	}
	end()
}

// streamConn is the TCP connection under a taken-over stream: writes go
// to it, not to the counting wrapper (limitedConn), which hides the
// descriptor a gathered or non-blocking write needs (closing goes through
// the wrapper, which counts it). Its write deadline moves only when less
// than half of it is left (a timer change per write costs as much as a
// tenth of the write): a stuck client's write fails within
// sseWriteTimeout/2 to sseWriteTimeout; or to a slow consumer's close
// (until). The stream's write mutex guards dl.
type streamConn struct {
	net.Conn
	until *atomic.Int64 // UnixNano: a slow consumer's close set every write's deadline
	dl    time.Time
}

func newStreamConn(conn net.Conn, until *atomic.Int64) *streamConn {
	wc := conn
	if lc, ok := conn.(*limitedConn); ok {
		wc = lc.Conn
	}
	c := &streamConn{Conn: wc, until: until, dl: time.Now().Add(sseWriteTimeout)} // as takeOver set it (or just after)
	c.reportDeadline()
	return c
}

// extend moves the write deadline before a write, when it must.
func (c *streamConn) extend() {
	if u := c.until.Load(); u != 0 { // a slow consumer's close: its grace
		c.dl = time.Unix(0, u)
		_ = c.SetWriteDeadline(c.dl)
		c.reportDeadline()
		return
	}
	if now := time.Now(); c.dl.Sub(now) < sseWriteTimeout/2 {
		c.dl = now.Add(sseWriteTimeout)
		_ = c.SetWriteDeadline(c.dl)
		c.reportDeadline()
	}
}

// streamDeadlineHook, when set (tests), is told each write deadline a
// taken-over stream's connection gets.
var streamDeadlineHook atomic.Pointer[func(time.Time)]

// reportDeadline tells streamDeadlineHook the deadline, when it is set.
func (c *streamConn) reportDeadline() {
	if f := streamDeadlineHook.Load(); f != nil {
		(*f)(c.dl)
	}
}

// startSSE starts the stream: its subscription, its heartbeat, and its
// place in the drain.
func (s *Server) startSSE(st *sseStream, sub *subscription) {
	s.metrics.sseStreams.Inc()
	st.ss.start()
	st.ss.startSub(sub)
	st.wmu.Lock()
	if !st.finished {
		st.hb = time.AfterFunc(s.cfg.SSEHeartbeat, st.beat)
	}
	st.wmu.Unlock()
	s.sseSessions.add(st.ss, nil)
	if s.isDraining() {
		go st.ss.drain(s.spread()) // the drain began as the stream did
	}
}

// endSSE ends the stream, if it has not ended, and waits until nothing of it
// runs: on the ResponseWriter path the handler must not return before.
func (s *Server) endSSE(st *sseStream) {
	st.ss.close(nil)
	st.ss.wait()
	s.sseSessions.remove(st.ss)
	s.metrics.sseStreams.Dec()
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

// write writes a delivery as events (a transport); an SSE session queues
// nothing else. The pieces the socket takes are progress for the session's
// slow-consumer watch.
func (st *sseStream) write(it outItem) bool {
	if it.res == nil {
		return true
	}
	b := st.events(it.res)
	st.wmu.Lock()
	defer st.wmu.Unlock()
	return !st.finished && st.writeLocked(b, st.ss.progressed)
}

// writeLocked writes b unless a write failed before: bytes after a failed
// write could end up within its event. progress, when set, is told of each
// piece written. Called with wmu.
func (st *sseStream) writeLocked(b []byte, progress func()) bool {
	if st.broken {
		return false
	}
	st.broken = !st.raw(b, progress)
	return !st.broken
}

// sseDeadline is the deadline of an event stream's writes (a
// subscription's or a follow's), which a slow consumer's close moves up.
type sseDeadline struct {
	until       atomic.Int64          // UnixNano: a slow consumer's close set every write's deadline
	setDeadline func(time.Time) error // moves the deadline of the write under way
}

// deadline is the deadline of a write that starts now.
func (d *sseDeadline) deadline() time.Time {
	if u := d.until.Load(); u != 0 {
		return time.Unix(0, u)
	}
	return time.Now().Add(sseWriteTimeout)
}

// closingSlow gives the write under way (its client's socket is full) and
// the last event SlowConsumerCloseGrace together, so that an event is
// never cut short before the last one.
func (d *sseDeadline) closingSlow() {
	until := time.Now().Add(SlowConsumerCloseGrace)
	d.until.Store(until.UnixNano())
	if d.setDeadline != nil {
		_ = d.setDeadline(until) // the write under way, which holds wmu
	}
}

// sseLastBytes is what an event stream closed for d writes last: nothing
// (d nil), a retry: line when the client should come back, else event:
// disconnect; a slow consumer gets both, so that a browser learns why
// (4001) and EventSource still comes back.
func sseLastBytes(d *Disconnect) []byte {
	switch {
	case d == nil:
		return nil
	case d.Code == CloseSlowConsumer:
		return []byte(retryLine() + string(disconnectEvent(d.Code, d.Reason)))
	case d.Reconnect:
		return []byte(retryLine() + "\n")
	default:
		return disconnectEvent(d.Code, d.Reason)
	}
}

// close writes d as the stream's last bytes (a transport: sseLastBytes).
// Nothing is written after it. A slow consumer's writer may be blocked on
// the client's full socket: that write and the last event get
// SlowConsumerCloseGrace together (closingSlow; as on a WebSocket,
// closeSlow).
func (st *sseStream) close(d *Disconnect) {
	if d != nil && d.Code == CloseSlowConsumer {
		st.closingSlow()
	}
	st.wmu.Lock()
	if !st.finished {
		if b := sseLastBytes(d); b != nil {
			st.writeLocked(b, nil)
		}
		st.finished = true
	}
	if st.hb != nil {
		st.hb.Stop()
	}
	st.wmu.Unlock()
	if st.closeConn != nil {
		st.closeConn()
	}
	st.ss.s.leaveChain(st.chain)
}

// beat writes a heartbeat comment and arms the next.
func (st *sseStream) beat() {
	if !st.ss.enter() {
		return
	}
	defer st.ss.wg.Done()
	st.wmu.Lock()
	ok := !st.finished && st.writeLocked([]byte(": heartbeat\n\n"), nil)
	if ok {
		st.hb.Reset(st.ss.s.cfg.SSEHeartbeat)
	}
	st.wmu.Unlock()
	if !ok {
		st.ss.close(nil)
	}
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

// events renders a delivery as SSE events; the id of each event is the
// resume token after it.
func (st *sseStream) events(res *queue.PopResult) []byte {
	var b bytes.Buffer
	st.tmu.Lock()
	defer st.tmu.Unlock()
	for _, m := range res.Messages {
		data, _ := json.Marshal(streamMessageOf(m))
		if st.marks == nil {
			st.marks = map[string]*queue.LeaseMark{}
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
	return b.Bytes()
}

func (st *sseStream) tokenLocked() string {
	marks := make([]queue.LeaseMark, 0, len(st.order))
	for _, pid := range st.order {
		marks = append(marks, *st.marks[pid])
	}
	return encodeToken(st.origin, marks)
}

// forget drops a partition from the token: the session holds nothing
// unacknowledged of it (sessionOptions.partitionSettled, with the session's
// mutex held).
func (st *sseStream) forget(pid string) {
	st.tmu.Lock()
	defer st.tmu.Unlock()
	if _, ok := st.marks[pid]; !ok {
		return
	}
	delete(st.marks, pid)
	for i, p := range st.order {
		if p == pid {
			st.order = append(st.order[:i:i], st.order[i+1:]...)
			break
		}
	}
}

// Close releases at once the leases that closed SSE streams still hold for
// a resume, and waits for releases under way and for WebSocket connections
// to end (Drain closes them); then it closes the push buffer (what it
// holds waits for the next start). Call it after the HTTP server has shut
// down.
func (s *Server) Close() {
	defer s.maint.closeSpool()
	defer s.stacks.close()
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
