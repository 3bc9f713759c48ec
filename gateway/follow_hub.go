package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/heraldmq/herald/queue"
)

// Follow streams: one message to many clients, read once per instance.
//
// A followHub serves every follower of one queue on this instance (a
// partition's followers are the queue hub's, filtered). On a wake-up (a
// push here, NOTIFY, syncnet, the logical stream: Server.WakeFollowers) it
// reads what is new from PostgreSQL once (queue.Store.ReadFollow) and hands
// it to each follower's bounded buffer in memory; an idle hub sends no query
// but a slow safety sweep. A follower that starts behind the hub catches up
// with reads of its own, then joins: the hub keeps the last followRing
// messages it read, so a joiner whose position is within them gets the
// rest from memory, with no gap and no duplicate. A follower whose buffer
// is full when the hub hands it messages is closed as a slow consumer
// (4001) and resumes by its last id; nobody waits for it.

const (
	// followRing is how many of the messages it read last a hub keeps for
	// followers joining from behind.
	followRing = 1024
	// followHubBatch bounds one hub read; a full one is followed by another.
	followHubBatch = 500
	// followCatchUpBatch bounds one read of a follower catching up.
	followCatchUpBatch = 200

	// The hub's safety sweep (a lost wake-up): 100 ms after a read that
	// found messages, doubling while idle up to 5 s, as the poller's.
	followSweepMin = 100 * time.Millisecond
	followSweepMax = 5 * time.Second
	// followHeldMin..Max: the wait before reading again when messages wait
	// behind an open transaction (nothing wakes the hub when it ends).
	followHeldMin = 5 * time.Millisecond
	followHeldMax = time.Second
	// followReadTimeout bounds a hub's read.
	followReadTimeout = 10 * time.Second
)

// FollowBufferDefault is how many messages a follow stream may have
// waiting to be written before it is closed as a slow consumer
// (Config.FollowBuffer): as many as a hub's ring, so a follower closed as
// slow that comes back at once rejoins from memory.
const FollowBufferDefault = followRing

// followItem is one message as followers get it: its position, its JSON
// (the message with its event id) and its SSE event, rendered once per hub
// read and shared, never changed, by every follower it is handed to.
type followItem struct {
	pos       queue.FollowPos
	partition string // its partition's name
	data      []byte // the message JSON (followMessageJSON)
	id        string // its event id
	sse       []byte // event: message, id: and data: lines, and the blank line
}

// followMessageJSON is a followed message: the stream message shape (the
// same as subscribe's, with an empty consumerGroup and leaseId) and its
// event id, the position to resume after it.
type followMessageJSON struct {
	streamMessageJSON
	EventID string `json:"eventId"`
}

const (
	sseMessageHead = "event: message\nid: "
	sseDataHead    = "\ndata: "
)

// renderFollow renders messages of queue q once.
func renderFollow(q string, msgs []queue.FollowMessage) []followItem {
	out := make([]followItem, len(msgs))
	for i, m := range msgs {
		id := queue.EncodeFollowID(q, m.Pos)
		data, _ := json.Marshal(followMessageJSON{streamMessageJSON: streamMessageOf(m.Message), EventID: id})
		sse := make([]byte, 0, len(sseMessageHead)+len(id)+len(sseDataHead)+len(data)+2)
		sse = append(append(append(append(append(sse, sseMessageHead...), id...), sseDataHead...), data...), "\n\n"...)
		out[i] = followItem{pos: m.Pos, partition: m.Partition, data: data, id: id, sse: sse}
	}
	return out
}

// followSink is a follower's transport. deliver is called with the hub's
// mutex held: it must not block. It queues items (already filtered: after
// the follower's position, of its partition) and, when gone is set, a gap
// first; false when its buffer is full (the hub then drops it and calls
// slow on another goroutine). A sink that must start a write may add
// itself to batch, when there is one, rather than start a goroutine: the
// batch writes each chunk as it fills, the last once the hub has handed
// the read out.
type followSink interface {
	deliver(items []followItem, gone *queue.FollowPos, batch *followBatch) bool
	slow()
}

// followFlushChunk is how many streams of a batch are written in one go.
const followFlushChunk = 256

// followBatch is the SSE streams one hub read handed messages to that had
// no write under way. Writing 10,000 sockets from a few goroutines, each
// write a non-blocking one, costs much less than waking a goroutine per
// socket; a socket that does not take everything at once gets a writer
// of its own (followStream.flushNow). Each full chunk is written at once,
// while the hub hands the read to the next streams: the first followers
// are written to before the last are handed anything (no work in the
// number of followers before the first write). The chunks are written by
// at most GOMAXPROCS-1 goroutines while the hub hands out (it holds the
// last core), and by the hub too once it is done: a few long writers, not
// a goroutine per chunk, so that the scheduler still gets to the pushes
// and the reads waiting on the network between them.
type followBatch struct {
	stacks  *warmStacks
	streams []*followStream // the chunk being filled (the hub's)

	mu      sync.Mutex
	chunks  [][]*followStream // full chunks not yet being written
	writers int               // goroutines writing chunks
	wg      sync.WaitGroup
}

func newFollowBatch(stacks *warmStacks) *followBatch { return &followBatch{stacks: stacks} }

// add queues st (called with the hub's mutex): a full chunk is queued for
// the writers, and a writer started if fewer than GOMAXPROCS-1 run.
func (b *followBatch) add(st *followStream) {
	b.streams = append(b.streams, st)
	if len(b.streams) < followFlushChunk {
		return
	}
	b.mu.Lock()
	b.chunks = append(b.chunks, b.streams)
	start := b.writers < max(runtime.GOMAXPROCS(0)-1, 1)
	if start {
		b.writers++
		b.wg.Add(1)
	}
	b.mu.Unlock()
	b.streams = nil
	if start {
		b.stacks.goDo(b.write)
	}
}

// write writes queued chunks until none is left.
func (b *followBatch) write() {
	defer b.wg.Done()
	for {
		b.mu.Lock()
		if len(b.chunks) == 0 {
			b.writers--
			b.mu.Unlock()
			return
		}
		part := b.chunks[0]
		b.chunks = b.chunks[1:]
		b.mu.Unlock()
		for _, st := range part {
			st.flushNow()
		}
	}
}

// run writes the rest, this goroutine among the writers, and waits for
// them.
func (b *followBatch) run() {
	b.mu.Lock()
	if len(b.streams) > 0 {
		b.chunks = append(b.chunks, b.streams)
	}
	b.streams = nil
	b.writers++
	b.wg.Add(1)
	b.mu.Unlock()
	b.write()
	b.wg.Wait()
}

// follower is one follow of one client on a hub.
type follower struct {
	hub       *followHub
	partition string // the partition's name; "" for the whole queue
	sink      followSink
	pos       queue.FollowPos // under hub.mu: it has everything at or below it
}

// followHubs is this instance's hubs, one per followed queue.
type followHubs struct {
	s       *Server
	m       *followMetrics
	mu      sync.Mutex
	hubs    map[string]*followHub
	streams map[*followStream]bool // open SSE follow streams, for Drain
}

// followHub reads one queue for all its followers on this instance.
type followHub struct {
	hs    *followHubs
	queue string

	mu       sync.Mutex
	known    bool            // pos is known: set by the first joiner
	pos      queue.FollowPos // every message at or below it was read and handed out
	ring     []followItem    // the last messages read, oldest first
	ringFrom queue.FollowPos // ring holds every message in (ringFrom, pos]
	subs     map[*follower]struct{}
	reading  bool // a read runs
	again    bool // a wake-up came during it
	closed   bool
	timer    *time.Timer
	sweep    time.Duration // the next sweep's delay
	held     time.Duration // the wait while messages are held back; 0 when none are
}

func newFollowHubs(s *Server) (*followHubs, error) {
	hs := &followHubs{s: s, hubs: map[string]*followHub{}, streams: map[*followStream]bool{}}
	m, err := newFollowMetrics(s.reg, newFollowersCollector(s.metrics.pushed.queues, hs.followers))
	if err != nil {
		return nil, err
	}
	hs.m = m
	return hs, nil
}

// hub returns q's hub, made (and announced) if it is new, with a follower
// reserved on it (unjoined: pos unset) so that it is not let go meanwhile.
func (hs *followHubs) hub(q string) *followHub {
	hs.mu.Lock()
	h := hs.hubs[q]
	fresh := h == nil
	if fresh {
		h = &followHub{hs: hs, queue: q, subs: map[*follower]struct{}{}, sweep: followSweepMin}
		hs.hubs[q] = h
	}
	hs.mu.Unlock()
	if fresh {
		hs.m.hubs.Inc()
		if f := hs.s.cfg.FollowPresence; f != nil {
			f(q, true) // other instances wake this one for q from now on
		}
	}
	return h
}

// wake marks q's hub, if any, for a read now.
func (hs *followHubs) wake(q string) {
	hs.mu.Lock()
	h := hs.hubs[q]
	hs.mu.Unlock()
	if h != nil {
		h.wake()
	}
}

// wakeAll marks every hub (a wake source reconnected: anything may have
// been missed).
func (hs *followHubs) wakeAll() {
	for _, h := range hs.all() {
		h.wake()
	}
}

// all is the hubs as they are now, read under hs.mu and returned without
// it (a hub's own lock is never taken under hs.mu here).
func (hs *followHubs) all() []*followHub {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return slices.Collect(maps.Values(hs.hubs))
}

// followers counts followers per queue (status, tests).
func (hs *followHubs) followers() map[string]int {
	out := map[string]int{}
	for _, h := range hs.all() {
		h.mu.Lock()
		if n := len(h.subs); n > 0 {
			out[h.queue] = n
		}
		h.mu.Unlock()
	}
	return out
}

// errClientGone: a follower's client went away during its catch-up.
var errClientGone = errors.New("the client went away")

// errFollowBehind: the hub is further ahead than its ring reaches back
// (or was let go meanwhile); the follower reads more before joining.
var errFollowBehind = errors.New("behind the hub's ring")

// join adds f, whose reads cover everything at or below pos, to the hub:
// the ring's messages after pos go to it at once. errFollowBehind when the
// ring does not reach back to pos.
func (h *followHub) join(f *follower, pos queue.FollowPos) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return errFollowBehind // let go meanwhile: a new hub is made
	}
	if !h.known {
		h.known, h.pos, h.ringFrom = true, pos, pos
	}
	if pos.Compare(h.ringFrom) < 0 {
		return errFollowBehind
	}
	f.pos = pos
	h.subs[f] = struct{}{}
	if pos.Compare(h.pos) < 0 {
		if !h.handLocked(f, h.ring, nil, nil) {
			return nil // already dropped as slow
		}
	}
	if !h.reading && h.timer == nil {
		h.armLocked(h.sweep)
	}
	return nil
}

// leave removes f; the hub goes with its last follower.
func (h *followHub) leave(f *follower) {
	h.mu.Lock()
	delete(h.subs, f)
	empty := len(h.subs) == 0 && !h.closed
	h.mu.Unlock()
	if empty {
		h.hs.release(h)
	}
}

// release lets h go if it still has no follower.
func (hs *followHubs) release(h *followHub) {
	hs.mu.Lock()
	h.mu.Lock()
	gone := len(h.subs) == 0 && !h.closed && hs.hubs[h.queue] == h
	if gone {
		h.closed = true
		if h.timer != nil {
			h.timer.Stop()
			h.timer = nil
		}
		delete(hs.hubs, h.queue)
	}
	h.mu.Unlock()
	hs.mu.Unlock()
	if gone {
		hs.m.hubs.Dec()
		if f := hs.s.cfg.FollowPresence; f != nil {
			f(h.queue, false)
		}
	}
}

// handLocked hands f the items after its position of its partition, with
// a gap first when gone is above it; false when f was dropped as slow.
// Called with h.mu.
func (h *followHub) handLocked(f *follower, items []followItem, gone *queue.FollowPos, batch *followBatch) bool {
	// items are in the queue's order: a queue's follower takes those after
	// its position as they are (shared, not copied); a partition's, its own.
	from := len(items)
	for i := range items {
		if items[i].pos.Compare(f.pos) > 0 {
			from = i
			break
		}
	}
	sel := items[from:]
	if f.partition != "" {
		var own []followItem
		for _, it := range sel {
			if it.partition == f.partition {
				own = append(own, it)
			}
		}
		sel = own
	}
	if gone != nil && (gone.Compare(f.pos) <= 0 || f.partition != "") {
		// A partition's follower learns of its own gaps from its reads;
		// the hub's mark is the queue's.
		gone = nil
	}
	if len(sel) == 0 && gone == nil {
		return true
	}
	if !f.sink.deliver(sel, gone, batch) {
		delete(h.subs, f)
		h.hs.m.slow.Inc()
		go f.sink.slow()
		return false
	}
	if n := len(sel); n > 0 {
		f.pos = sel[n-1].pos
	}
	return true
}

// wake reads now, or once more after the read under way.
func (h *followHub) wake() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	if h.reading {
		h.again = true
		return
	}
	h.startLocked()
}

func (h *followHub) startLocked() {
	if h.timer != nil {
		h.timer.Stop()
		h.timer = nil
	}
	h.reading, h.again = true, false
	h.hs.s.stacks.goDo(h.read)
}

// armLocked sets the next read d from now. Called with h.mu.
func (h *followHub) armLocked(d time.Duration) {
	if h.timer != nil {
		h.timer.Stop()
	}
	h.timer = time.AfterFunc(d, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.timer = nil
		if !h.closed && !h.reading {
			h.startLocked()
		}
	})
}

// read reads what is new once for every follower and hands it out, until
// a read comes back short with no wake-up since. One runs at a time per
// hub, on a kept goroutine (stacks).
func (h *followHub) read() {
	for {
		h.mu.Lock()
		if h.closed || !h.known {
			h.reading = false
			h.mu.Unlock()
			return
		}
		pos := h.pos
		h.again = false
		h.mu.Unlock()

		ctx, cancel := context.WithTimeout(context.Background(), followReadTimeout)
		b, err := h.hs.s.store.ReadFollow(ctx, queue.FollowTarget{Queue: h.queue}, pos, followHubBatch)
		cancel()
		h.hs.m.reads.Inc()
		items := renderFollow(h.queue, b.Messages)

		h.mu.Lock()
		if err != nil {
			h.hs.s.log.Error().Err(err).Str("queue", h.queue).Msg("reading for followers; trying again")
			h.reading = false
			if !h.closed {
				h.armLocked(time.Second)
			}
			h.mu.Unlock()
			return
		}
		if h.closed {
			h.reading = false
			h.mu.Unlock()
			return
		}
		batch := h.takeLocked(pos, items, b)
		// The rest of the batch is written once the mutex is let go (a
		// stream that fails leaves the hub); another read may start then.
		// When this hub reads again at once, the batch is written beside
		// that read, not before it: under load, the writes of 10,000
		// streams would hold the next message back for as long. Each
		// stream keeps one writer (its writing flag), so its events keep
		// their order across batches.
		if h.again || b.Full {
			h.mu.Unlock()
			h.hs.s.stacks.goDo(batch.run)
			continue
		}
		h.reading = false
		next := h.sweep
		h.sweep = min(2*h.sweep, followSweepMax)
		if h.held > 0 {
			next = h.held
		}
		h.armLocked(next)
		if f := hubSweepHook.Load(); f != nil {
			(*f)(h.queue, next)
		}
		h.mu.Unlock()
		batch.run()
		return
	}
}

// hubSweepHook, when set (tests), is called after each read of a hub
// that ends its reading (nothing more to read, no wake-up meanwhile), with
// the hub's mutex held, with the wait it armed before the next read.
var hubSweepHook atomic.Pointer[func(queue string, next time.Duration)]

// takeLocked hands what a read from pos found to the followers (their
// writes in the batch it returns, not yet run), keeps it in the ring, and
// moves the hub's position, sweep and held back-off. Called with mu.
func (h *followHub) takeLocked(pos queue.FollowPos, items []followItem, b queue.FollowBatch) *followBatch {
	batch := newFollowBatch(h.hs.s.stacks) // its chunks are written as they fill
	for f := range h.subs {
		h.handLocked(f, items, b.Gone, batch)
	}
	h.ring = append(h.ring, items...)
	if over := len(h.ring) - followRing; over > 0 {
		h.ringFrom = h.ring[over-1].pos
		h.ring = append([]followItem(nil), h.ring[over:]...)
	}
	h.pos = b.Covered(pos)
	if b.Gone != nil && b.Gone.Compare(h.pos) > 0 && len(items) == 0 {
		// Everything up to the deleted mark is gone or handed out.
		h.pos = *b.Gone
	}
	if len(items) > 0 || b.Gone != nil {
		h.hs.m.delivered.Add(float64(len(items)))
		h.sweep = followSweepMin
	}
	switch {
	case b.Held:
		h.held = min(max(2*h.held, followHeldMin), followHeldMax)
	default:
		h.held = 0
	}
	return batch
}

// follow runs a follower of t from pos: it reads and writes (write,
// blocking, on the caller's goroutine) what lies between pos and the hub,
// then joins the hub, which hands it the rest through sink. It returns
// the joined follower, whose leave the caller calls when it ends; with
// an error nothing is joined. A catch-up that reads a gap passes it to
// write.
func (hs *followHubs) follow(ctx context.Context, t queue.FollowTarget, pos queue.FollowPos, sink followSink,
	write func(items []followItem, gone *queue.FollowPos) error) (*follower, error) {
	f := &follower{partition: t.Partition, sink: sink}
	for tries := 0; ; tries++ {
		b, err := hs.s.store.ReadFollow(ctx, t, pos, followCatchUpBatch)
		if err != nil {
			return nil, err
		}
		hs.m.reads.Inc()
		gone := b.Gone
		if len(b.Messages) > 0 || gone != nil {
			if err := write(renderFollow(t.Queue, b.Messages), gone); err != nil {
				return nil, err
			}
		}
		// pos is where the next read starts: a message's position (a
		// partition is read by offset), or past a gap with nothing
		// stored before its mark. cover is what the follower has in the
		// queue's order, for the join.
		cover := b.Covered(pos)
		pos = b.Last(pos)
		if gone != nil && len(b.Messages) == 0 && gone.Compare(pos) > 0 {
			pos = *gone
			if gone.Compare(cover) > 0 {
				cover = *gone
			}
		}
		if t.Partition == "" {
			pos = cover
		}
		if b.Full {
			continue
		}
		h := hs.hub(t.Queue)
		f.hub = h
		err = h.join(f, cover)
		if err == nil {
			return f, nil
		}
		hs.release(h)
		if !errors.Is(err, errFollowBehind) || tries > 100 {
			return nil, err
		}
	}
}

// followTarget reads the queue and partition of a follow route.
func followTarget(queueName, partition string) (queue.FollowTarget, error) {
	if err := queue.ValidateName("queue", queueName); err != nil {
		return queue.FollowTarget{}, err
	}
	if partition != "" {
		if err := queue.ValidateName("partition", partition); err != nil {
			return queue.FollowTarget{}, err
		}
	}
	return queue.FollowTarget{Queue: queueName, Partition: partition}, nil
}

// followPosition is where a follow starts: an event id (Last-Event-ID, or
// after=), else from= (now, beginning, a time, an event id).
func (s *Server) followPosition(ctx context.Context, t queue.FollowTarget, lastID, from string) (queue.FollowPos, error) {
	if lastID = strings.TrimSpace(lastID); lastID != "" {
		return queue.DecodeFollowID(t.Queue, lastID)
	}
	fr, p, err := queue.ParseFollowFrom(t.Queue, from)
	if err != nil {
		return queue.FollowPos{}, err
	}
	if p != nil {
		return *p, nil
	}
	return s.store.FollowStart(ctx, t, fr)
}

// WakeFollowers tells this instance's followers of queue q that it may
// have new messages (a wake source: NOTIFY, syncnet, the logical stream;
// this instance's pushes call it themselves). It does not block.
func (s *Server) WakeFollowers(q string) { s.follows.wake(q) }

// WakeAllFollowers wakes every followed queue (a wake source reconnected).
func (s *Server) WakeAllFollowers() { s.follows.wakeAll() }

// Followers reports this instance's followers per queue.
func (s *Server) Followers() map[string]int { return s.follows.followers() }
