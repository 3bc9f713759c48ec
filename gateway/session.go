package gateway

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
)

// Close codes of a Disconnect: 4000–4499 allow a reconnect, 4500–4999 do
// not. The numbers are the protocol (docs/clients.md, close codes): append only.
const (
	CloseShuttingDown  = 4000 // the server is draining: reconnect (elsewhere)
	CloseSlowConsumer  = 4001 // the client did not read its frames in time: reconnect
	CloseProtocolError = 4500 // frames that are not the protocol: do not retry as is
	CloseUnauthorized  = 4501 // no valid token (or it expired): get a new token first
	CloseForbidden     = 4503 // the token's role may not subscribe
)

// Disconnect is why the server ends a client connection. A WebSocket gets
// Code and Reason as its close frame; an SSE stream gets a jittered retry:
// when Reconnect is true (EventSource then comes back by itself) and
// otherwise a last event: disconnect with {"code","reason"}.
type Disconnect struct {
	Code      int
	Reason    string
	Reconnect bool // the client should come back (elsewhere), as it is
}

// A slow consumer is a client that does not take what its session writes:
// a write (a frame, an event) of which its socket has taken nothing for
// SlowConsumerAfter (a large write counts by the writePiece), or a write
// queue that reaches its bound (a WebSocket's 1,024 frames). From that
// moment it is sent nothing more, its leases are given back at once, and
// its close (4001; on SSE event: disconnect and a retry:) waits up to
// SlowConsumerCloseGrace behind what the socket already holds before the
// connection is closed: a client that is slow but still reading gets the
// code, one that reads nothing is disconnected all the same, at most
// SlowConsumerAfter + SlowConsumerCloseGrace (8 s) after its socket stopped
// taking bytes. The transports' write deadlines (10 s a piece) are a
// backstop beyond that.
const (
	// SlowConsumerAfter: a socket only stays full this long when its
	// client does not read (a browser reads as bytes come, however busy
	// its page), and the whole close (8 s) stays within 10 s.
	SlowConsumerAfter = 5 * time.Second
	// SlowConsumerCloseGrace is how long the close of a slow consumer may
	// wait for the socket: the write under way, then the close frame or
	// the last event.
	SlowConsumerCloseGrace = 3 * time.Second
	// writePiece: a write of more is made in pieces of this size, each
	// progress for the slow-consumer watch, so that a large frame that a
	// client on a slow link takes steadily is not taken for a stall.
	writePiece = 16 << 10
)

var (
	disconnectShutdown     = Disconnect{CloseShuttingDown, "server shutting down", true}
	disconnectSlowConsumer = Disconnect{CloseSlowConsumer, "client reads too slowly", true}
	disconnectBadFrames    = Disconnect{CloseProtocolError, "too many malformed frames", false}
	disconnectTokenExpired = Disconnect{CloseUnauthorized, "token expired", false}
)

// transport is a session's connection: it encodes and writes what the
// session queues and ends the connection. A WebSocket and an SSE stream are
// transports; reading, pings and heartbeats are theirs too.
type transport interface {
	// write writes one queued item: a reply frame, or a delivery
	// (it.res) of subscription it.sub. Only the session's writer calls it,
	// one item at a time. false when the connection failed.
	write(it outItem) bool
	// close ends the connection, first writing d (a close frame, a last
	// event) under a short deadline when d is not nil; for a slow consumer
	// (CloseSlowConsumer) a write may be under way, blocked on the client:
	// it and d get SlowConsumerCloseGrace in all. The session calls it
	// once, from whichever goroutine ends it (see doc.go), with the
	// session's mutex not held.
	close(d *Disconnect)
}

// outItem is one entry of a session's write queue.
type outItem struct {
	frame any              // a reply; nil for a delivery
	sub   *subscription    // the delivery's subscription
	res   *queue.PopResult // the delivery
}

// sessionOptions are what differs between transports.
type sessionOptions struct {
	// maxSubs bounds the subscriptions; zero means no bound.
	maxSubs int
	// The write queue: past holdAt items the subscriptions lease nothing
	// (poller Hold) until the writer is down to resumeAt; at maxQueue the
	// client is disconnected as a slow consumer. Zero: no hold, no bound
	// (the credit bounds it: only deliveries are queued). Either way a
	// write waiting SlowConsumerAfter on the client disconnects it.
	holdAt, resumeAt, maxQueue int
	// keepForResume keeps the leases of deliveries written and not acked
	// when the session ends for Config.SSEResumeGrace, so that a client
	// resuming with a token (here or elsewhere) finds them; false gives
	// them back at once.
	keepForResume bool
	// chain is an SSE stream's place in its chain (sse_chain.go): what it
	// keeps for a resume is given back at once when its page is back on a
	// newer stream.
	chain chainRef
	// leaseCheck, when positive, is how often the session looks up the
	// leases of its unacknowledged deliveries (acks posted to other
	// instances, leases expired) while it has some.
	leaseCheck time.Duration
	// flushOnDrain writes what is queued before a drain closes the
	// connection.
	flushOnDrain bool
	// expires, when set, ends the session with 4501 (token expired).
	expires time.Time
	// partitionSettled, when set, is told that the session no longer holds
	// anything unacknowledged of a partition. Called with the session's
	// mutex held: it must not block or call back into the session.
	partitionSettled func(partitionID string)
}

var (
	errDraining    = errors.New("the server is shutting down: subscribe elsewhere")
	errTooManySubs = errors.New("too many subscriptions")
)

// session is one client connection behind any transport: its
// subscriptions (each a standing poller intention with credit), the
// deliveries not yet acknowledged, the bounded write queue and its one
// writer, the release of leases when it ends, drain and typed closes.
// doc.go states its goroutines and lock order.
type session struct {
	s    *Server
	t    transport
	opts sessionOptions
	ctx  context.Context // ends with the session: its store calls
	stop context.CancelFunc
	done chan struct{}  // closed when close has given everything back
	held atomic.Bool    // the write queue is past holdAt: lease nothing
	wg   sync.WaitGroup // the writer, timer callbacks and close, while under way
	// writeSince is when the write under way began or last made progress
	// (UnixNano), zero when the writer is not in the transport: the
	// slow-consumer watch reads it. Only the writer's goroutine writes it.
	writeSince atomic.Int64

	mu       sync.Mutex
	subs     map[string]*subscription
	nextSub  int
	inflight map[deliveryKey]delivery // delivered, not yet acknowledged
	parts    map[string]int           // partition id → its deliveries in inflight
	// givenBack: (lease, partition) pairs a nack of this connection gave
	// back (queueAck): a nack of another delivery under one of them is
	// answered here. Cleared past givenBackMax.
	givenBack map[[2]string]bool
	out       []outItem     // the write queue, oldest first; nil when idle
	writing   bool          // a writer goroutine runs
	emptied   chan struct{} // closed by the writer when out empties (waitWritten)
	full      bool          // the write queue overflowed: closing
	draining  bool
	closed    bool
	checking  bool        // the lease check is armed
	check     *time.Timer // the lease check
	expiry    *time.Timer // ends the session when its token expires
	watch     *time.Timer // the slow-consumer watch, armed while a writer runs
}

// subscription is one standing intention of a session. It is the holder of
// its deliveries in Server.deliveries.
type subscription struct {
	ss     *session
	id     string
	group  string
	in     *poller.Intention
	cancel func() // withdraws in; nil until started
}

// delivery is one unacknowledged message of a session (keyed by
// deliveryKey: the same message delivered to two subscriptions is two).
type delivery struct {
	sub                     *subscription
	queue, partition, group string
	offset                  int64
	// acked: an ack of this connection names it and is on its way to the
	// store; its credit was given back then (queueAck), so whatever
	// forgets it later gives none.
	acked bool
}

// settled is called by afterAck when a delivery of sub was acknowledged on
// this instance, by any path (a holder). It does not block.
func (sub *subscription) settled(k deliveryKey) {
	ss := sub.ss
	ss.mu.Lock()
	d, ok := ss.inflight[k]
	ok = ok && d.sub == sub
	if ok {
		ss.forgetLocked(k, d)
	}
	ss.mu.Unlock()
	if ok && !d.acked {
		ss.s.poller.AddCredit(sub.in, 1)
	}
}

// newSession returns a session of s; set its transport (t) before start.
func newSession(s *Server, opts sessionOptions) *session {
	ss := &session{s: s, opts: opts, done: make(chan struct{})}
	ss.ctx, ss.stop = context.WithCancel(context.Background())
	return ss
}

// start arms the token's expiry.
func (ss *session) start() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if !ss.opts.expires.IsZero() && !ss.closed {
		ss.expiry = time.AfterFunc(time.Until(ss.opts.expires), func() {
			if ss.enter() {
				defer ss.wg.Done()
				ss.close(&disconnectTokenExpired)
			}
		})
	}
}

// rearm moves the token's expiry to at (a fresh token came), or drops it
// when never is set.
func (ss *session) rearm(at time.Time, never bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed {
		return
	}
	if ss.expiry != nil {
		ss.expiry.Stop()
		ss.expiry = nil
	}
	ss.opts.expires = time.Time{}
	if never {
		return
	}
	ss.opts.expires = at
	ss.expiry = time.AfterFunc(time.Until(at), func() {
		if ss.enter() {
			defer ss.wg.Done()
			ss.close(&disconnectTokenExpired)
		}
	})
}

// enter marks a callback under way (wait waits for it); false once the
// session closed. The caller calls ss.wg.Done.
func (ss *session) enter() bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed {
		return false
	}
	ss.wg.Add(1)
	return true
}

// wait waits for the writer, timer callbacks and a close under way. The
// goroutine that owns the connection calls it after close.
func (ss *session) wait() { ss.wg.Wait() }

// subscribe adds a subscription for in (Target, Batch, Partitions, Credit
// and AutoAck set); start begins leasing for it, so that a transport can
// reply first.
func (ss *session) subscribe(in *poller.Intention) (*subscription, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.draining || ss.closed {
		return nil, errDraining
	}
	if ss.opts.maxSubs > 0 && len(ss.subs) >= ss.opts.maxSubs {
		return nil, errTooManySubs
	}
	if in.Target.Group == "" {
		in.Target.Group = queue.DefaultGroup
	}
	ss.nextSub++
	sub := &subscription{ss: ss, id: "s" + strconv.Itoa(ss.nextSub), group: in.Target.Group, in: in}
	in.Standing = true
	in.Deliver = func(res *queue.PopResult) bool { return ss.deliver(sub, res) }
	if ss.opts.holdAt > 0 {
		in.Hold = ss.held.Load
	}
	if ss.subs == nil {
		ss.subs = map[string]*subscription{}
	}
	ss.subs[sub.id] = sub
	return sub, nil
}

// startSub registers sub's intention. Under mu, so that a drain or close
// running meanwhile either sees its cancel func or stops it registering.
func (ss *session) startSub(sub *subscription) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if !ss.draining && !ss.closed && ss.subs[sub.id] == sub {
		sub.cancel = ss.s.poller.Register(sub.in)
	}
}

// unsubscribe ends a subscription and gives its leases back at once;
// false when there is none of that id.
func (ss *session) unsubscribe(id string) bool {
	ss.mu.Lock()
	sub := ss.subs[id]
	if sub == nil {
		ss.mu.Unlock()
		return false
	}
	delete(ss.subs, id)
	leases := map[string][]queue.Message{}
	for k, d := range ss.inflight {
		if d.sub == sub {
			ss.forgetLocked(k, d)
			addLease(leases, k, d)
		}
	}
	ss.mu.Unlock()
	if sub.cancel != nil {
		sub.cancel()
	}
	ss.release(leases)
	return true
}

// deliver runs on a poller worker: it must not block. It queues the
// delivery and holds its messages until acknowledged; false (the poller
// releases the lease) when the subscription or the session has ended.
func (ss *session) deliver(sub *subscription, res *queue.PopResult) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed || ss.full || ss.subs[sub.id] != sub || !ss.enqueueLocked(outItem{sub: sub, res: res}) {
		return false
	}
	if sub.in.AutoAck {
		return true
	}
	if ss.inflight == nil {
		ss.inflight, ss.parts = map[deliveryKey]delivery{}, map[string]int{}
	}
	for _, m := range res.Messages {
		k := deliveryKey{m.LeaseID, m.PartitionID, m.TransactionID}
		if _, dup := ss.inflight[k]; !dup {
			ss.parts[m.PartitionID]++
		}
		ss.inflight[k] = delivery{sub: sub, queue: m.Queue, partition: m.Partition, group: m.Group, offset: m.Offset}
		ss.s.deliveries.hold(k, sub)
	}
	return true
}

// send queues a reply frame; false once the session is closing.
func (ss *session) send(frame any) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return !ss.closed && !ss.full && ss.enqueueLocked(outItem{frame: frame})
}

// enqueueLocked appends it to the write queue and starts the writer. A full
// queue means the client does not read: it is disconnected with a code that
// allows a reconnect, and its leases are released, so nothing is lost.
// Called with mu.
func (ss *session) enqueueLocked(it outItem) bool {
	if ss.opts.maxQueue > 0 && len(ss.out) >= ss.opts.maxQueue {
		if !ss.full {
			ss.full = true
			ss.wg.Add(1)
			go func() { // close takes mu, and callers must not block
				defer ss.wg.Done()
				ss.close(&disconnectSlowConsumer)
			}()
		}
		return false
	}
	ss.out = append(ss.out, it)
	if ss.opts.holdAt > 0 && len(ss.out) >= ss.opts.holdAt {
		ss.held.Store(true)
	}
	if !ss.writing {
		ss.writing = true
		ss.wg.Add(1)
		// The watch looks at the writer SlowConsumerAfter from now; a
		// writer that ends before leaves it nothing to do.
		if ss.watch == nil {
			ss.watch = time.AfterFunc(SlowConsumerAfter, ss.watchWriter)
		} else {
			ss.watch.Reset(SlowConsumerAfter)
		}
		ss.s.stacks.goDo(ss.write)
	}
	return true
}

// watchWriter runs on a timer while a writer runs: a write that has waited
// SlowConsumerAfter for the client, taking nothing, marks a slow consumer,
// which is closed (4001); otherwise it looks again when the write under
// way, or the next, would have waited that long.
func (ss *session) watchWriter() {
	if !ss.enter() {
		return
	}
	defer ss.wg.Done()
	since := ss.writeSince.Load()
	waited := time.Duration(0)
	if since != 0 {
		waited = time.Since(time.Unix(0, since))
	}
	if waited >= SlowConsumerAfter {
		ss.s.log.Debug().Dur("waited", waited).Msg("closing a slow consumer")
		ss.close(&disconnectSlowConsumer)
		return
	}
	ss.mu.Lock()
	if ss.writing && !ss.closed {
		ss.watch.Reset(SlowConsumerAfter - waited)
	}
	ss.mu.Unlock()
}

// write is the session's one writer while items are queued: started by
// enqueueLocked, it ends when the queue is empty. A failed write ends the
// session. The hold ends as it takes an item that leaves at most resumeAt
// queued.
func (ss *session) write() {
	defer ss.wg.Done()
	for {
		ss.mu.Lock()
		if len(ss.out) == 0 || ss.closed {
			ss.out = nil // an idle connection keeps no queue
			ss.writing = false
			if ss.emptied != nil {
				close(ss.emptied)
				ss.emptied = nil
			}
			closed := ss.closed
			ss.mu.Unlock()
			if !closed && ss.held.CompareAndSwap(true, false) {
				ss.resume()
			}
			return
		}
		it := ss.out[0]
		ss.out[0] = outItem{}
		ss.out = ss.out[1:]
		left := len(ss.out)
		ss.mu.Unlock()
		if left <= ss.opts.resumeAt && ss.held.CompareAndSwap(true, false) {
			ss.resume()
		}
		ss.writeSince.Store(time.Now().UnixNano())
		ok := ss.t.write(it)
		ss.writeSince.Store(0)
		if !ok {
			ss.close(nil)
			return
		}
		if it.res != nil {
			ss.written(it)
		}
	}
}

// progressed tells the slow-consumer watch that the client's socket took a
// piece of the write under way. Only the writer's goroutine calls it, from
// within transport.write.
func (ss *session) progressed() {
	if ss.writeSince.Load() != 0 {
		ss.writeSince.Store(time.Now().UnixNano())
	}
}

// writePieces writes b in pieces of writePiece bytes, calling progress
// (when not nil) after each, so that the slow-consumer watch sees a large
// write that the client is taking.
func writePieces(b []byte, write func([]byte) error, progress func()) error {
	for len(b) > 0 {
		n := min(len(b), writePiece)
		if err := write(b[:n]); err != nil {
			return err
		}
		b = b[n:]
		if progress != nil {
			progress()
		}
	}
	return nil
}

// written follows a delivery the transport wrote: metrics, and the credit
// of an autoAck delivery (nothing to wait for) or the lease check.
func (ss *session) written(it outItem) {
	// One counter lookup per run of one queue and group.
	msgs := it.res.Messages
	for i := 0; i < len(msgs); {
		j := i + 1
		for j < len(msgs) && msgs[j].Queue == msgs[i].Queue && msgs[j].Group == msgs[i].Group {
			j++
		}
		ss.s.metrics.popped.WithLabelValues(msgs[i].Queue, msgs[i].Group).Add(float64(j - i))
		i = j
	}
	ss.s.metrics.history.Popped(msgs)
	if it.sub.in.AutoAck {
		ss.s.poller.AddCredit(it.sub.in, len(it.res.Messages))
	} else if ss.opts.leaseCheck > 0 {
		ss.armCheck()
	}
}

// resume lets the subscriptions lease again once the client has read its
// backlog.
func (ss *session) resume() {
	for _, sub := range ss.subscriptions() {
		ss.s.poller.AddCredit(sub.in, 0)
	}
}

func (ss *session) subscriptions() []*subscription {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	out := make([]*subscription, 0, len(ss.subs))
	for _, sub := range ss.subs {
		out = append(out, sub)
	}
	return out
}

// forgetLocked drops one delivery. Called with mu.
func (ss *session) forgetLocked(k deliveryKey, d delivery) {
	delete(ss.inflight, k)
	ss.s.deliveries.drop(k, d.sub)
	if n := ss.parts[k.partitionID] - 1; n > 0 {
		ss.parts[k.partitionID] = n
		return
	}
	delete(ss.parts, k.partitionID)
	if f := ss.opts.partitionSettled; f != nil {
		f(k.partitionID)
	}
}

// addLease adds delivery k to the messages of its lease in m.
func addLease(m map[string][]queue.Message, k deliveryKey, d delivery) {
	if k.leaseID != "" {
		m[k.leaseID] = append(m[k.leaseID], queue.Message{Queue: d.queue, Partition: d.partition,
			PartitionID: k.partitionID, Group: d.group})
	}
}

// release gives leases back at once and wakes their partitions: the unacked
// messages go to another consumer now, not at lease expiry.
func (ss *session) release(leases map[string][]queue.Message) {
	for lease, msgs := range leases {
		ss.s.poller.Release(context.Background(), lease, msgs)
	}
}
