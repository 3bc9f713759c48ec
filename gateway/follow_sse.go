package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/heraldmq/herald/queue"
)

// handleFollow serves GET /api/v1/follow/queue/{queue}[/partition/{partition}]:
// a long-poll when the request has after= or wait=, else an SSE stream.
func (s *Server) handleFollow(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	if q.Has("after") || q.Has("wait") {
		return s.handleFollowPoll(w, r)
	}
	return s.handleFollowSSE(w, r)
}

// followCheck reads and checks a follow request's target and rights
// (consume rights on the queue or the partition, as a subscription).
func (s *Server) followCheck(r *http.Request) (queue.FollowTarget, error) {
	t, err := followTarget(r.PathValue("queue"), r.PathValue("partition"))
	if err != nil {
		return t, err
	}
	if err := checkConsume(rightsOf(r.Context()), &queue.PopRequest{Queue: t.Queue, Partition: t.Partition}); err != nil {
		return t, err
	}
	return t, nil
}

// followStream is an SSE follow: events whose ids are follow positions,
// written by one writer from a bounded buffer the hub fills. Idle, it has
// no goroutine but the one parked in a read until the client leaves.
type followStream struct {
	s     *Server
	queue string
	raw   func([]byte) bool   // one write to the client, with a deadline
	rawv  func([][]byte) bool // one gathered write (writev) of frames, with a deadline
	// tryRaw writes frames without waiting (nil when the connection has no
	// file descriptor): rest is what the socket did not take, as one frame.
	tryRaw    func(frames [][]byte) (rest [][]byte, err error)
	closeConn func()
	sseDeadline

	wmu    sync.Mutex  // one write at a time
	broken bool        // under wmu: a write failed, perhaps within an event
	hb     *time.Timer // the heartbeat; under mu

	mu       sync.Mutex
	out      [][]byte // events waiting for the writer: the hub's shared frames, a gap's own
	queued   int      // messages in out
	waiting  int      // messages queued or being written: bounded by FollowBuffer
	writing  bool
	finished bool
	gapSent  queue.FollowPos // the highest gap mark told
	f        *follower
	done     chan struct{}
	wg       sync.WaitGroup // the writer and timer callbacks under way
}

// sseFollowEvents renders items (and a gap first) as SSE events.
func (st *followStream) events(items []followItem, gone *queue.FollowPos) []byte {
	var b bytes.Buffer
	if gone != nil && gone.Compare(st.gapSent) > 0 {
		st.gapSent = *gone
		b.Write(gapEvent(st.queue, *gone, items))
	}
	for _, it := range items {
		b.Write(it.sse)
	}
	return b.Bytes()
}

// gapJSON tells a follower that retention deleted messages after its
// position: goneThrough is the highest position deleted, nextEventId the
// first message still stored after its position (null: none yet).
type gapJSON struct {
	GoneThrough string  `json:"goneThrough"`
	NextEventID *string `json:"nextEventId"`
}

func gapOf(q string, gone queue.FollowPos, items []followItem) gapJSON {
	g := gapJSON{GoneThrough: queue.EncodeFollowID(q, gone)}
	if len(items) > 0 {
		g.NextEventID = &items[0].id
	}
	return g
}

// gapEvent is event: gap. When no stored message lies between the
// follower and the mark, its id moves the follower's Last-Event-ID past
// the deleted messages, so a reconnect is not told again.
func gapEvent(q string, gone queue.FollowPos, items []followItem) []byte {
	data, _ := json.Marshal(gapOf(q, gone, items))
	var b bytes.Buffer
	b.WriteString("event: gap\n")
	if len(items) == 0 || items[0].pos.Compare(gone) > 0 {
		b.WriteString("id: " + queue.EncodeFollowID(q, gone) + "\n")
	}
	b.WriteString("data: ")
	b.Write(data)
	b.WriteString("\n\n")
	return b.Bytes()
}

// deliver queues items for the writer (a followSink; under the hub's
// mutex: it does not block).
func (st *followStream) deliver(items []followItem, gone *queue.FollowPos, batch *followBatch) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.finished {
		return true // leaving: the hub is told by leave
	}
	if st.waiting+len(items) > st.s.cfg.FollowBuffer {
		return false
	}
	if gone != nil && gone.Compare(st.gapSent) > 0 {
		st.gapSent = *gone
		st.out = append(st.out, gapEvent(st.queue, *gone, items))
	}
	// The frames are the hub's, rendered once for every follower.
	for i := range items {
		st.out = append(st.out, items[i].sse)
	}
	st.queued += len(items)
	st.waiting += len(items)
	if !st.writing {
		st.writing = true
		st.wg.Add(1)
		if batch != nil && st.tryRaw != nil {
			batch.add(st)
		} else {
			st.s.stacks.goDo(st.write)
		}
	}
	return true
}

// flushNow writes what waits without blocking (a hub's batch, the writing
// flag set for it): what the socket does not take at once, or a write
// under way (a heartbeat), leaves the rest to the stream's own writer.
func (st *followStream) flushNow() {
	for {
		st.mu.Lock()
		if st.endTurnLocked() {
			st.mu.Unlock()
			st.wg.Done()
			return
		}
		if !st.wmu.TryLock() { // does not wait: no lock order with wmu → mu
			st.mu.Unlock()
			st.s.stacks.goDo(st.write)
			return
		}
		batch, n := st.out, st.queued
		st.out, st.queued = nil, 0
		st.mu.Unlock()
		var rest [][]byte
		err := errBrokenStream
		if !st.broken {
			rest, err = st.tryRaw(batch)
			st.broken = err != nil
		}
		st.wmu.Unlock()
		if err != nil {
			st.close(nil)
			st.wg.Done()
			return
		}
		st.mu.Lock()
		if rest != nil {
			st.out = append(rest, st.out...)
			st.queued += n
			st.mu.Unlock()
			st.s.stacks.goDo(st.write)
			return
		}
		st.waiting -= n
		st.mu.Unlock()
	}
}

// endTurnLocked ends the writer's turn when nothing waits or the stream
// has finished (what waits then is dropped), and says so: the next event
// queued starts a new turn. Called with st.mu by the writer (write or
// flushNow).
func (st *followStream) endTurnLocked() bool {
	if len(st.out) > 0 && !st.finished {
		return false
	}
	st.out, st.writing, st.waiting, st.queued = nil, false, 0, 0
	return true
}

// slow ends the stream as a slow consumer: EventSource comes back with its
// Last-Event-ID (a retry: line), here or elsewhere.
func (st *followStream) slow() { st.close(&disconnectSlowConsumer) }

// write is the stream's writer while events wait: it takes all of them
// and writes them in one gathered write.
func (st *followStream) write() {
	defer st.wg.Done()
	var spare [][]byte
	for {
		st.mu.Lock()
		if st.endTurnLocked() {
			st.mu.Unlock()
			return
		}
		batch, n := st.out, st.queued
		st.out, st.queued = spare[:0], 0
		st.mu.Unlock()
		ok := st.sendFrames(batch)
		clear(batch) // no hold on the frames
		spare = batch
		if !ok {
			st.close(nil)
			return
		}
		st.mu.Lock()
		st.waiting -= n
		st.mu.Unlock()
	}
}

// sendFrames writes frames unless the stream has finished.
func (st *followStream) sendFrames(frames [][]byte) bool {
	st.wmu.Lock()
	defer st.wmu.Unlock()
	if st.isFinished() || st.broken {
		return false
	}
	st.broken = !st.rawv(frames)
	return !st.broken
}

// send writes b unless the stream has finished.
func (st *followStream) send(b []byte) bool {
	st.wmu.Lock()
	defer st.wmu.Unlock()
	return !st.isFinished() && st.writeLocked(b)
}

// isFinished reads finished (under st.mu, taken and let go here: a writer
// asks holding wmu, and the order is wmu → mu).
func (st *followStream) isFinished() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.finished
}

// errBrokenStream stands for a write not tried: one failed before.
var errBrokenStream = errors.New("an earlier write failed")

// writeLocked writes b unless a write failed before: bytes after a failed
// write could end up within its event. Called with wmu.
func (st *followStream) writeLocked(b []byte) bool {
	if st.broken {
		return false
	}
	st.broken = !st.raw(b)
	return !st.broken
}

// close ends the stream once: d's last bytes (sseLastBytes), the hub
// left, the connection closed. For a slow consumer, the write under way
// (its client's socket is full) and the last event get
// SlowConsumerCloseGrace together, as a subscription's (sseStream.close).
func (st *followStream) close(d *Disconnect) {
	slow := d != nil && d.Code == CloseSlowConsumer
	st.mu.Lock()
	if st.finished {
		st.mu.Unlock()
		return
	}
	st.finished = true
	f := st.f
	if slow {
		st.closingSlow()
	}
	st.mu.Unlock()
	if f != nil {
		f.hub.leave(f)
	}
	// Otherwise the last bytes only if no write is stuck (a writer may
	// wait out its deadline): closing the connection unblocks it, and
	// EventSource reconnects on a close as on a retry:, with the id of its
	// last complete event.
	if slow {
		st.wmu.Lock()
	}
	if slow || st.wmu.TryLock() {
		if b := sseLastBytes(d); b != nil {
			st.writeLocked(b)
		}
		st.wmu.Unlock()
	}
	st.mu.Lock()
	if st.hb != nil {
		st.hb.Stop()
	}
	st.mu.Unlock()
	if st.closeConn != nil {
		st.closeConn()
	}
	close(st.done)
}

// beat writes a heartbeat comment and arms the next.
func (st *followStream) beat() {
	st.wmu.Lock()
	fin := st.isFinished()
	ok := !fin && st.writeLocked([]byte(": heartbeat\n\n"))
	st.wmu.Unlock()
	if !ok {
		if !fin {
			st.close(nil)
		}
		return
	}
	st.mu.Lock()
	if !st.finished {
		st.hb.Reset(st.s.cfg.SSEHeartbeat)
	}
	st.mu.Unlock()
}

// handleFollowSSE serves a follow as an event stream, in the shape of
// Mercure's: a register step (check the request, find the position, open
// the stream: all that may answer an HTTP error, returned to the adapter;
// 400 and 403 make EventSource give up, as it should), a join of the hub,
// and one wait (a goroutine parked in a read, or one select).
func (s *Server) handleFollowSSE(w http.ResponseWriter, r *http.Request) error {
	t, pos, ok, err := s.followSSEStart(w, r)
	if !ok {
		return err
	}
	setEventStreamHeaders(w.Header())
	if ok, _ := s.admitSSE(w); !ok {
		return nil
	}
	handedOff := false
	defer func() {
		if !handedOff {
			s.sseDone()
		}
	}()
	// A position of another partition is the client's mistake: found by
	// the first read, before the stream's 200.
	if t.Partition != "" && pos.PartitionID != "" {
		if _, err := s.store.ReadFollow(r.Context(), t, pos, 1); err != nil {
			if queue.IsInputError(err) {
				return err
			}
			retryLater(w)
			return nil
		}
	}
	st := &followStream{s: s, queue: t.Queue, done: make(chan struct{})}
	// An id with no data names the start: it sets the browser's
	// Last-Event-ID before any message, and dispatches no event (nor does
	// a parser that skips events without data), so that a reconnect
	// before the first message resumes after it, not at a new "now".
	first := []byte(retryLine() + ": connected\n\nid: " + queue.EncodeFollowID(t.Queue, pos) + "\n\n")
	conn, hijacked := takeOver(w, first)
	switch {
	case hijacked && conn == nil:
		return nil // gone before the first byte
	case hijacked:
		st.overConn(conn)
	default: // HTTP/2: through the ResponseWriter, until the handler returns
		w.WriteHeader(http.StatusOK)
		st.overWriter(w)
		if !st.raw(first) {
			return nil
		}
	}
	if !s.joinFollowSSE(r, t, pos, st) {
		return nil
	}
	if hijacked {
		handedOff = true
		s.whenClosed(conn, func() { s.endFollowSSE(st) })
		return nil
	}
	untilDone(r, st.done, func() { s.endFollowSSE(st) })
	return nil
}

// followSSEStart checks a follow stream's request and finds its position
// (Last-Event-ID, lastEventId= or from=). It returns false when the stream
// must not start: with the error to answer, or nil when it has answered
// (a retry:, the database failing).
func (s *Server) followSSEStart(w http.ResponseWriter, r *http.Request) (queue.FollowTarget, queue.FollowPos, bool, error) {
	t, err := s.followCheck(r)
	if err != nil {
		return t, queue.FollowPos{}, false, err
	}
	last := r.Header.Get("Last-Event-ID")
	if last == "" {
		last = r.URL.Query().Get("lastEventId")
	}
	pos, err := s.followPosition(r.Context(), t, last, r.URL.Query().Get("from"))
	if err != nil {
		if queue.IsInputError(err) {
			return t, pos, false, err
		}
		s.log.Error().Err(err).Msg("starting a follow stream")
		retryLater(w)
		return t, pos, false, nil
	}
	return t, pos, true, nil
}

// overConn makes the stream write to a taken-over connection (streamConn):
// single, gathered (writev) and, where the connection has a descriptor,
// non-blocking writes.
func (st *followStream) overConn(conn net.Conn) {
	sc := newStreamConn(conn, &st.until)
	st.raw = func(b []byte) bool {
		sc.extend()
		_, err := sc.Write(b)
		return err == nil
	}
	st.rawv = func(frames [][]byte) bool {
		sc.extend()
		if len(frames) == 1 {
			_, err := sc.Write(frames[0])
			return err == nil
		}
		bufs := net.Buffers(frames) // consumes its copy of the slice, not the frames
		_, err := bufs.WriteTo(sc.Conn)
		return err == nil
	}
	st.setDeadline = sc.SetWriteDeadline
	st.closeConn = func() { _ = conn.Close() }
	if try := tryWriter(sc.Conn); try != nil {
		st.tryRaw = func(frames [][]byte) ([][]byte, error) {
			sc.extend() // a passed deadline fails even a write that does not wait
			return try(frames)
		}
	}
}

// overWriter makes the stream write through the ResponseWriter (HTTP/2),
// each write with its deadline, flushed.
func (st *followStream) overWriter(w http.ResponseWriter) {
	rc := http.NewResponseController(w)
	st.raw = func(b []byte) bool {
		_ = rc.SetWriteDeadline(st.deadline())
		if _, err := w.Write(b); err != nil { //nolint:gosec // G705: text/event-stream frames the server rendered, never HTML
			return false
		}
		return rc.Flush() == nil
	}
	st.setDeadline = rc.SetWriteDeadline
	st.rawv = func(frames [][]byte) bool {
		_ = rc.SetWriteDeadline(st.deadline())
		for _, b := range frames {
			if _, err := w.Write(b); err != nil {
				return false
			}
		}
		return rc.Flush() == nil
	}
}

// joinFollowSSE catches the stream up with reads of its own, joins the
// hub, and starts its heartbeat and its place in the drain. It returns
// false when the stream ended meanwhile.
func (s *Server) joinFollowSSE(r *http.Request, t queue.FollowTarget, pos queue.FollowPos, st *followStream) bool {
	f, err := s.follows.follow(r.Context(), t, pos, st,
		func(items []followItem, gone *queue.FollowPos) error {
			if !st.send(st.eventsLocked(items, gone)) {
				return errClientGone
			}
			return nil
		})
	if err != nil {
		if !queue.IsInputError(err) && err != errClientGone {
			s.log.Error().Err(err).Msg("catching up a follow stream")
		}
		st.close(&Disconnect{Code: CloseShuttingDown, Reason: "try again", Reconnect: true})
		return false
	}
	st.mu.Lock()
	st.f = f
	fin := st.finished
	st.mu.Unlock()
	if fin { // closed (slow) while joining: it did not see f
		f.hub.leave(f)
		return false
	}
	st.mu.Lock()
	if !st.finished {
		st.hb = time.AfterFunc(s.cfg.SSEHeartbeat, st.beat)
	}
	st.mu.Unlock()
	s.follows.mu.Lock()
	s.follows.streams[st] = true
	s.follows.mu.Unlock()
	s.metrics.sseStreams.Inc()
	if s.isDraining() {
		go st.drain(s.spread())
	}
	return true
}

// endFollowSSE ends the stream, if it has not ended, and waits until
// nothing of it runs: on the ResponseWriter path the handler must not
// return before.
func (s *Server) endFollowSSE(st *followStream) {
	st.close(nil)
	st.wg.Wait()
	s.follows.mu.Lock()
	delete(s.follows.streams, st)
	s.follows.mu.Unlock()
	s.metrics.sseStreams.Dec()
}

// eventsLocked renders a catch-up's events (the writer is not running
// yet: the stream is not joined).
func (st *followStream) eventsLocked(items []followItem, gone *queue.FollowPos) []byte {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.events(items, gone)
}

// drain closes the stream at its point of the drain window with a retry:
// (EventSource reconnects elsewhere with its Last-Event-ID).
func (st *followStream) drain(after time.Duration) {
	if after > 0 {
		select {
		case <-time.After(after):
		case <-st.done:
			return
		}
	}
	st.close(&disconnectShutdown)
}

// drainFollows starts the drain of every SSE follow stream (Drain).
func (s *Server) drainFollows() {
	s.follows.mu.Lock()
	defer s.follows.mu.Unlock()
	for st := range s.follows.streams {
		go st.drain(s.spread())
	}
}

// tryWriter is a write that does not wait for a socket to take the bytes
// (one write(2) on the non-blocking descriptor); nil when conn has none
// (TLS).
func tryWriter(conn net.Conn) func(frames [][]byte) ([][]byte, error) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return func(frames [][]byte) ([][]byte, error) {
		buf := frames[0]
		if len(frames) > 1 {
			buf = bytes.Join(frames, nil)
		}
		var n int
		var werr error
		if err := rc.Write(func(fd uintptr) bool {
			n, werr = syscall.Write(int(fd), buf)
			return true // done: no waiting for the socket
		}); err != nil {
			return nil, err
		}
		if werr == syscall.EAGAIN || werr == syscall.EINTR {
			n, werr = 0, nil
		}
		if werr != nil {
			return nil, werr
		}
		if n >= len(buf) {
			return nil, nil
		}
		return [][]byte{buf[max(n, 0):]}, nil
	}
}
