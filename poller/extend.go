package poller

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/heraldmq/herald/queue"
)

// A stream that holds a partition keeps receiving it: while one of this
// instance's streams (a standing intention) holds a partition's lease for
// its group, a push here to that partition extends the lease over its
// messages (queue.Reservation.Extend) instead of waiting for the acks that
// would end it and a pop that would lease again. The database extends only
// a live lease that covers every earlier message of the partition, so the
// lease is always exactly what the stream was sent, and a nack or its
// expiry gives back from the first unacked message, as for any lease.
//
// keyState.streams remembers, per (partition, group), the lease a stream
// of the key holds: set when a delivery under a new lease begins (a pop's,
// or the push hand-off that leases it, from its reservation on), forgotten
// when the lease is released here. Deliveries under one lease go to the
// stream in offset order: two pushes in flight extend it one after the
// other (the partition's lock orders them), but their answers race, so a
// delivery that comes before the one it follows waits (parked) and is
// handed on by it.

// streamKey is a (partition id, group) a stream may hold a lease of.
type streamKey struct{ partitionID, group string }

// streamLease is the lease a stream holds on one partition, and the order
// of its deliveries. Guarded by the owning worker's mutex.
type streamLease struct {
	in          *Intention
	partitionID string
	lease       string
	// next is the offset the next delivery under the lease starts at;
	// 0 until the first is under way (a hand-off that may lease it).
	next int64
	busy bool // a delivery under it is under way: the next one waits
	// parked: deliveries of extensions that came before the one they
	// follow, handed on in order as it ends.
	parked []parkedDelivery
	// reserving: pushes in flight reserved to extend it (reserveExtend
	// until Settle); delivered counts the deliveries under it that ended.
	// An idle following lease is given back only with neither changed
	// (FollowIdle).
	reserving int
	delivered uint64
	// abandoned: a hand-off under it was lost (worker.abandon); it is
	// being given back, and nothing more is delivered under it.
	abandoned bool
	// gap: an extension of it whose push's answer was lost may have
	// handed it messages the stream never got; they are read back and
	// delivered under it (worker.fill) before anything after them.
	gap bool
	// stale: next when a read (fill) found nothing to move it on while a
	// parked delivery waited beyond it (0: none); the next read for that
	// wait is a second later, not at once.
	stale int64
	// tail: a read up to the lease's end is owed once nothing is parked.
	tail bool
}

// parkedDelivery is an extension's delivery waiting for its turn.
type parkedDelivery struct {
	e    *streamLease
	res  *queue.PopResult
	pl   plan
	done func()    // ends the statement's leasing mark once delivered
	at   time.Time // when it was parked (how long a read-back kept it)
}

// streamFor returns the lease a stream of ks holds on (partition, group),
// or nil. Called with the worker's mutex.
func (ks *keyState) streamFor(partitionID, group string) *streamLease {
	if e := ks.streams[streamKey{partitionID, groupName(group)}]; e != nil && !e.in.gone {
		return e
	}
	return nil
}

// noteStream records that in's delivery under lease on partitionID is
// under way (or, for a hand-off, may be): the entry is busy until it ends.
// Called with the worker's mutex.
func (ks *keyState) noteStream(in *Intention, partitionID, lease string) *streamLease {
	if ks.streams == nil {
		ks.streams = map[streamKey]*streamLease{}
	}
	e := &streamLease{in: in, partitionID: partitionID, lease: lease, busy: true}
	ks.streams[streamKey{partitionID, groupName(in.Target.Group)}] = e
	return e
}

// beginStreams notes the leases that begin with a pop's delivery to a
// stream: a push from now on may extend them, and its delivery waits for
// this one. It returns the entries whose order this delivery holds
// (endStreams).
func (w *worker) beginStreams(in *Intention, res *queue.PopResult) []*streamLease {
	if !in.extends() || res.LeaseID == "" {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	ks := w.keys[in.key]
	if ks == nil || in.gone {
		return nil
	}
	var out []*streamLease
	for pid := range lastOffsets(res) {
		if e := ks.streams[streamKey{pid, groupName(in.Target.Group)}]; e != nil && e.in == in && e.lease == res.LeaseID {
			e.busy = true // noted when its pop began (beforePop): what is parked behind it stays
			out = append(out, e)
			continue
		}
		out = append(out, ks.noteStream(in, pid, res.LeaseID))
	}
	return out
}

// streamPop is a lease a pop for a stream is about to take on a
// partition, noted before the pop (beforePop).
type streamPop struct {
	intention int
	e         *streamLease
}

// beforePop notes, before a pop runs, the leases it may take for streams
// on partitions where none is noted: a push meanwhile extends the lease
// once the pop committed it (its delivery parked behind the pop's), where
// it would otherwise find the row leased and hand nothing, and every push
// after it would find the lease short of the partition's end. Called with
// the worker's mutex; afterPop settles them.
func (w *worker) beforePop(as []queue.Assignment, of func(int) *Intention) []streamPop {
	var out []streamPop
	for _, a := range as {
		in := of(a.Intention)
		if !in.extends() || a.LeaseID == "" || in.gone {
			continue
		}
		ks := w.keys[in.key]
		if ks == nil || ks.streamFor(a.PartitionID, in.Target.Group) != nil {
			continue
		}
		out = append(out, streamPop{a.Intention, ks.noteStream(in, a.PartitionID, a.LeaseID)})
	}
	return out
}

// afterPop forgets the leases beforePop noted that the pop did not take
// (got holds what it took; nil when it failed). The others stay busy until
// their delivery (beginStreams). One a push extended meanwhile (parked
// behind the pop's delivery) was taken by a pop whose answer was lost: its
// lease is given back with the pop's (orphans), so what is parked is
// dropped (worker.abandon) and comes again by a pop.
func (w *worker) afterPop(pre []streamPop, got map[int]*queue.PopResult) {
	if len(pre) == 0 {
		return
	}
	var dones []func()
	w.mu.Lock()
	for _, sp := range pre {
		if res := got[sp.intention]; res != nil && res.LeaseID == sp.e.lease {
			if _, took := lastOffsets(res)[sp.e.partitionID]; took {
				continue
			}
		}
		dones = append(dones, w.abandon(sp.e.in.key, sp.e)...)
	}
	w.mu.Unlock()
	for _, done := range dones {
		done()
	}
}

// endStreams ends the deliveries under es, which res held: the next
// delivery under each starts after res's last offset of its partition. It
// returns the parked deliveries now due, each marked under way (deliver
// them, then endStreams again).
func (w *worker) endStreams(es []*streamLease, res *queue.PopResult) []parkedDelivery {
	if len(es) == 0 {
		return nil
	}
	last := lastOffsets(res)
	w.mu.Lock()
	defer w.mu.Unlock()
	var due []parkedDelivery
	for _, e := range es {
		e.busy = false
		e.delivered++
		if off, ok := last[e.partitionID]; ok && off >= e.next {
			e.next = off + 1
		}
		if d, ok := e.take(); ok {
			due = append(due, d)
			continue
		}
		w.fillIfDue(e.in.key, e)
	}
	return due
}

// cut removes from res, a delivery under e's lease, the messages before
// next (delivered already by a read, worker.fill), giving their credit
// back, and reports whether nothing is left. Called with the worker's
// mutex.
func (e *streamLease) cut(res *queue.PopResult) (empty bool) {
	if e.next == 0 || len(res.Messages) == 0 || res.Messages[0].Offset >= e.next {
		return false
	}
	n := 0
	for n < len(res.Messages) && res.Messages[n].Offset < e.next {
		n++
	}
	e.in.credit += n
	res.Messages = res.Messages[n:]
	return len(res.Messages) == 0
}

// fillIfDue starts reading back a gap of e's lease (fill) when one is
// known, or when a parked delivery waits for offsets no push under way
// can bring (none reserved, none delivering: a push whose answer was lost,
// or whose statement committed after its answer was): e becomes busy until
// the read's delivery ends. Called with the worker's mutex.
func (w *worker) fillIfDue(key string, e *streamLease) {
	if e.busy || e.abandoned {
		return
	}
	before := int64(0)
	for _, d := range e.parked {
		if off := d.res.Messages[0].Offset; before == 0 || off < before {
			before = off
		}
	}
	switch {
	case e.gap:
	case e.tail && before == 0:
	case before == 0 || e.reserving > 0 || e.next == 0 || before == e.next || e.stale == e.next:
		return
	}
	// A read up to a parked delivery leaves one up to the lease's end owed
	// once nothing is parked: the lost statement may have committed after
	// the one parked.
	e.tail = before > 0
	e.gap, e.busy = false, true
	after := e.next - 1
	if !w.p.bg.start(func(ctx context.Context) { w.fill(ctx, key, e, after, before) }) {
		e.busy = false // the poller stopped: the lease lapses with its lease time
	}
}

// fill reads back the messages e's lease holds after offset after and
// before offset before (0: up to its end), which a push whose answer was
// lost handed it, and delivers them under it, then what is parked behind
// them. While the database is away it retries with back-off, up to
// orphanRecheck; a lease that ended meanwhile (or a database away that
// long) is abandoned and given back, so what it holds comes again by a
// pop. If the push never committed, the read finds nothing. The poller's
// stop (ctx) ends it where it is: the lease lapses with its lease time.
func (w *worker) fill(ctx context.Context, key string, e *streamLease, after, before int64) {
	p := w.p
	backoff := orphanRetryMin
	giveUp := time.Now().Add(orphanRecheck)
	var (
		res     *queue.PopResult
		through int64
		held    bool
	)
	for {
		rctx, cancel := context.WithTimeout(ctx, queryTimeout)
		var err error
		res, through, held, err = p.store.ReadLease(rctx, e.partitionID, e.in.Target.Group, e.lease, after, before, queue.MaxBatch)
		cancel()
		if err == nil {
			break
		}
		if f := readBackFailed.Load(); f != nil {
			(*f)()
		}
		if ctx.Err() != nil {
			return
		}
		if time.Now().After(giveUp) {
			p.log.Warn().Err(err).Str("lease", e.lease).Msg("reading back a lost hand-off's messages failed; giving the lease back")
			held = false
			break
		}
		if !sleep(ctx, backoff) {
			return
		}
		backoff = min(backoff*2, orphanRetryMax)
	}
	if !held {
		w.mu.Lock()
		dones := w.abandon(key, e)
		w.mu.Unlock()
		for _, done := range dones {
			done()
		}
		p.orphaned(key, e.lease) // if it is still there; wakes the key
		p.held.Remove(hintKey{e.partitionID, groupName(e.in.Target.Group)})
		return
	}
	if res == nil {
		res = &queue.PopResult{}
	}
	w.mu.Lock()
	e.in.charge(res)
	if through >= e.next {
		e.next = through + 1
	} else if len(e.parked) > 0 {
		// Nothing moved it on, and a delivery may wait beyond it: a
		// statement whose answer was lost may commit later (a server
		// that froze), so read again in a second, not at once.
		e.stale = e.next
		time.AfterFunc(orphanRetryMax, func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			if e.stale == e.next {
				e.stale = 0
				w.fillIfDue(key, e)
			}
		})
	}
	if res.More {
		e.gap = true // the rest after this delivery
	}
	w.mu.Unlock()
	if len(res.Messages) > 0 {
		p.metrics.handoffs.Inc()
		w.deliverOne(context.Background(), e.in, res, true, plan{total: len(res.Messages), partitions: 1})
	}
	w.handOnAfterRead(context.Background(), e, res, after, before)
}

// take returns the parked delivery that starts at next, marking e busy.
// A parked delivery a read (worker.fill) delivered already is cut to what
// follows it, or dropped. Called with the worker's mutex.
func (e *streamLease) take() (parkedDelivery, bool) {
	if e.busy {
		return parkedDelivery{}, false
	}
	keep := e.parked[:0]
	for _, d := range e.parked {
		if e.cut(d.res) {
			d.done()
			continue
		}
		keep = append(keep, d)
	}
	clear(e.parked[len(keep):])
	e.parked = keep
	for i, d := range e.parked {
		if d.res.Messages[0].Offset == e.next {
			e.parked = append(e.parked[:i], e.parked[i+1:]...)
			e.busy = true
			return d, true
		}
	}
	return parkedDelivery{}, false
}

// streamReleased forgets the lease a stream held on (partition, group): a
// push no longer extends it. What is parked under it is still handed on in
// order by the delivery under way (its acks are refused if the lease ended,
// and the messages come back from the first unacked one).
func (p *Poller) streamReleased(queueName, partitionID, group string) {
	key := "q:" + queueName
	w := p.workerFor(key)
	w.mu.Lock()
	if ks := w.keys[key]; ks != nil {
		delete(ks.streams, streamKey{partitionID, groupName(group)})
	}
	w.mu.Unlock()
}

// extends reports whether a push may extend in's leases.
func (in *Intention) extends() bool { return in.Extend && in.Standing && !in.AutoAck }

// lastOffsets gives, per partition of res's messages, the last offset.
func lastOffsets(res *queue.PopResult) map[string]int64 {
	out := map[string]int64{}
	for _, m := range res.Messages {
		out[m.PartitionID] = max(out[m.PartitionID], m.Offset)
	}
	return out
}

// FollowIdle tells that an ack left the stream lease of (partitionID,
// group) on queue queueName, partition, following its partition with all
// it covers done (queue.AckResult.Idle): unless a push hands it more
// within Config.FollowIdle, it is given back (Store.ReleaseLease, which
// waits for a push in flight on the partition) and forgotten here, rather
// than held until its lease time runs out: the partition is any
// consumer's again, and the admin views show it free.
func (p *Poller) FollowIdle(queueName, partition, partitionID, group, lease string) {
	key := "q:" + queueName
	k := streamKey{partitionID, groupName(group)}
	w := p.workerFor(key)
	w.mu.Lock()
	var e *streamLease
	if ks := w.keys[key]; ks != nil {
		e = ks.streams[k]
	}
	if e == nil || e.lease != lease {
		w.mu.Unlock()
		return
	}
	stamp := e.delivered
	w.mu.Unlock()
	time.AfterFunc(p.cfg.FollowIdle, func() {
		w.mu.Lock()
		ks := w.keys[key]
		if ks == nil || ks.streams[k] != e || e.delivered != stamp || e.busy || e.reserving > 0 || len(e.parked) > 0 {
			w.mu.Unlock()
			return // it got more, or ended: not idle
		}
		delete(ks.streams, k) // a push from now on does not extend it
		w.mu.Unlock()
		p.bg.start(func(ctx context.Context) { // not once the poller stopped: it lapses with its lease time
			ctx, cancel := context.WithTimeout(ctx, queryTimeout)
			defer cancel()
			if err := p.store.ReleaseLease(ctx, lease); err != nil {
				p.log.Warn().Err(err).Str("queue", queueName).Msg("giving back an idle following lease failed: it lapses with its lease time")
				return
			}
			p.LeaseReleased(queueName, partition, partitionID, group)
			p.Wake(SourceRelease, queueName, partition) // a push meanwhile waits for a pop
		})
	})
}

// readBackFailed is a test's hook (export_test.go); nil in a running server.
var readBackFailed atomic.Pointer[func()]
