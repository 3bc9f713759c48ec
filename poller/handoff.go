package poller

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/heraldmq/herald/queue"
)

// The hand-off (queue.HandOff): a push on this instance leases its
// messages to the intentions waiting for them in its own transaction, so a
// subscription kept up to date, or a waiting long-poll, gets them when the
// push commits, with no wake-up, pre-flight or pop. Reserve picks the
// intentions a fast-path cycle would pick (one per group, naming the
// partition first, then the oldest) and holds their credit; the database
// leases only to a group whose row is caught up, so order and lease safety
// are the database's as for any pop. Settle delivers what was leased and
// gives the rest of the credit back. A group handed a partition is not
// assigned it again by the push's own wake-up (keyState.handed).
//
// A long-poll (a one-shot intention) is reserved whole, as a cycle's pop
// holds it (worker.hold): all its credit, so that one push, one partition,
// answers it, and serving, so that its Cancel waits for the hand-off and
// returns what it was given (with autoAck, the push consumed it) and a
// cycle does not end it at its deadline meanwhile.

// reservation is a queue.Reservation's token.
type reservation struct {
	w                *worker
	in               *Intention
	key, partitionID string
	could            int    // what the intention could take (a delivery of that many may leave more)
	held             int    // the credit it holds (Intention.reserved)
	leasing          func() // ends the reservation's mark (leasing.go) once settled
	// stream: the lease of a stream it opens (a new one, busy until its
	// delivery ends) or, extend, the one it extends (extend.go).
	stream *streamLease
	extend bool
}

// Reserve implements queue.HandOff.
func (p *Poller) Reserve(parts []queue.PushedPartition) []queue.Reservation {
	if p.paused.Load() {
		return nil // pop maintenance: the push leases to nobody
	}
	var out []queue.Reservation
	for _, pp := range parts {
		key := "q:" + pp.Queue
		w := p.workerFor(key)
		w.mu.Lock()
		ks := w.keys[key]
		if ks == nil {
			w.mu.Unlock()
			continue
		}
		eachByPreference(ks.intentions, pp.Partition, func(in *Intention) bool {
			if e := ks.streamFor(pp.PartitionID, in.Target.Group); e != nil && in.extends() {
				// Its group's lease here is a stream's: that stream
				// extends it, or nobody is handed the partition.
				if e.in != in || !in.ready() {
					return false
				}
				out = append(out, p.reserveExtend(w, e, key, pp))
				return true
			}
			// Not one whose last delivery took all it could: it is behind,
			// so its group's rows are not caught up and the statement would
			// lease nothing (under load, with five groups on 16 partitions,
			// 80 wasted reservations a push). Nor a long-poll no cycle has
			// found caught up yet (limited from its registration): what
			// waits for it across partitions is one batch for a cycle,
			// where the push would answer with its one partition's and its
			// client would come back for the rest (at 1,000 msgs/s over 16
			// partitions, its p99 went from 100 ms to 1 s under load 16).
			// autoAck ones too: the push moves their cursor instead of
			// leasing (at 200 msgs/s they waited for a poll cycle each).
			if in.inOrder() {
				// An autoAck subscription's earlier hand-off or pop is not
				// delivered yet: this push's messages would overtake it.
				// Its cycle takes them once that is delivered.
				in.missed = true
				return false
			}
			// A stream whose leases a push extends is reserved all the same:
			// the reservation lets a push racing its pop extend the lease
			// the pop takes (extend.go), and a row that is not caught up
			// costs the statement one row it leases nothing from.
			if in.limited && !in.extends() || !in.ready() {
				return false
			}
			could := min(in.Batch, in.free())
			limit := min(could, pp.Messages)
			held := limit
			if !in.Standing {
				// A long-poll answers once: the push holds all of it, as a
				// cycle's pop does (hold), until settled.
				held = in.free()
			}
			if in.counted() {
				in.serving++
			}
			in.reserved += held
			end := p.leasing.begin() // before the lease id, until settled
			t := &reservation{w: w, in: in, key: key, partitionID: pp.PartitionID, could: could, held: held, leasing: end}
			lease := queue.NewID()
			if in.extends() {
				// A push reserving before this one settles extends
				// the lease it may open, its delivery after this one's.
				t.stream = ks.noteStream(in, pp.PartitionID, lease)
			}
			out = append(out, queue.Reservation{PartitionID: pp.PartitionID, Group: in.Target.Group, LeaseID: lease,
				Limit: limit, Subject: in.Subject, AutoAck: in.AutoAck, Stream: in.Standing, Follow: in.extends(), Token: t})
			return true
		})
		w.mu.Unlock()
	}
	return out
}

// reserveExtend reserves the stream of e to be handed pp's messages under
// the lease it holds, as many as its credit and batch allow (or, if that
// lease has ended, under a new one). Called with the worker's mutex.
func (p *Poller) reserveExtend(w *worker, e *streamLease, key string, pp queue.PushedPartition) queue.Reservation {
	in := e.in
	could := min(in.Batch, in.free())
	limit := min(could, pp.Messages)
	in.reserved += limit
	e.reserving++ // until settled (order)
	t := &reservation{w: w, in: in, key: key, partitionID: pp.PartitionID, could: could, held: limit,
		leasing: p.leasing.begin(), stream: e, extend: true}
	return queue.Reservation{PartitionID: pp.PartitionID, Group: in.Target.Group, LeaseID: queue.NewID(), Extend: e.lease,
		Limit: limit, Subject: in.Subject, Stream: true, Follow: true, Token: t}
}

// Settle implements queue.HandOff.
func (p *Poller) Settle(r queue.Reservation, res *queue.PopResult) {
	t, ok := r.Token.(*reservation)
	if !ok {
		return
	}
	w, in := t.w, t.in
	if in.counted() {
		// A long-poll's cancel waits until what it was given is delivered;
		// an autoAck subscription takes nothing more until then.
		defer w.doneServing(map[int]plan{0: {}}, func(int) *Intention { return in })
	}
	w.mu.Lock()
	in.reserved -= t.held // the credit it held
	in.charge(res)        // and what it was given, in the same step
	look := w.lookIfMissed(in)
	if res != nil {
		if ks := w.keys[t.key]; ks != nil {
			if ks.handed == nil {
				ks.handed = map[string]bool{}
			}
			ks.handed[t.partitionID+"\x00"+r.Group] = true
		}
	}
	parked, dropped, dones := t.order(res, r.OutcomeUnknown)
	w.mu.Unlock()
	for _, done := range dones {
		done()
	}
	if look || dropped {
		w.signal()
	}
	if parked {
		return // handed on, with its leasing mark, by the delivery it follows
	}
	defer t.leasing()
	if dropped {
		return // under a lease being given back: its messages come again by a pop
	}
	if res == nil {
		if r.OutcomeUnknown && !r.AutoAck { // an autoAck hand-off holds no lease to give back
			// The lease it may have taken, which never reached the
			// stream. The stream's it may have handed messages under
			// (Extend) stays the stream's: what it may have handed is
			// read back (order: a gap, worker.fill).
			p.orphaned(t.key, r.LeaseID)
			if t.stream != nil && !t.extend {
				// Its note would pass pushes meanwhile over until a
				// release this instance is not told of by the releaser.
				p.held.Remove(hintKey{r.PartitionID, groupName(r.Group)})
			}
		}
		return
	}
	if f := afterSettle.Load(); f != nil {
		(*f)()
	}
	p.metrics.handoffs.Inc()
	pl := plan{total: t.could, partitions: 1}
	if t.stream == nil {
		w.deliver(context.Background(), in, res, true, pl)
		return
	}
	w.deliverInOrder(context.Background(), in, res, pl, []*streamLease{t.stream})
}

// order keeps a stream's deliveries under one lease in offset order: an
// extension's that comes before the delivery it follows is parked
// (parked: the delivery it follows hands it on). An opening reservation
// that leased nothing forgets its lease. An extension whose push's answer
// was lost (unknown) may have handed the lease messages the stream never
// got: the lease has a gap, read back from the database and delivered
// under it before anything parked (worker.fill), so that nothing the
// stream holds is given back and delivered again. An opening reservation
// whose answer was lost may have leased anew: that lease is abandoned
// (Settle gives it back), so what is parked behind it, and any later
// delivery under it (dropped), is not delivered (its credit comes back,
// dones end their leasing marks) and comes again by a pop. What a read
// delivered already is cut from an extension's delivery (dropped if that
// is all of it). Called with the worker's mutex.
func (t *reservation) order(res *queue.PopResult, unknown bool) (parked, dropped bool, dones []func()) {
	e := t.stream
	if e == nil {
		return false, false, nil
	}
	if t.extend {
		e.reserving--
	}
	w := t.w
	if t.extend && res != nil && res.LeaseID == e.lease && !e.abandoned && e.cut(res) {
		return false, true, nil
	}
	switch {
	case e.abandoned && res != nil && res.LeaseID == e.lease:
		e.in.credit += len(res.Messages)
		return false, true, nil
	case res == nil && unknown && t.extend:
		e.gap = true
		w.fillIfDue(t.key, e)
	case res == nil && unknown:
		return false, false, w.abandon(t.key, e)
	case res == nil && !t.extend:
		e.busy = false
		w.forgetStream(t.key, e)
	case res == nil:
	case !t.extend:
	case res.LeaseID != e.lease:
		// That lease had ended: the push leased the caught-up row anew,
		// so nothing under the old one is still to come before it.
		if ks := w.keys[t.key]; ks != nil {
			t.stream = ks.noteStream(e.in, e.partitionID, res.LeaseID)
		} else {
			t.stream = nil
		}
	case e.busy || e.next == 0 || res.Messages[0].Offset != e.next:
		e.parked = append(e.parked, parkedDelivery{e: e, res: res, pl: plan{total: t.could, partitions: 1}, done: t.leasing, at: time.Now()})
		w.fillIfDue(t.key, e) // a gap no push under way can fill
		return true, false, nil
	default:
		e.busy = true
	}
	return false, false, nil
}

// abandon gives up the order of e's lease, which a lost hand-off may have
// handed messages its stream never gets: it is forgotten, and what is
// parked behind it is dropped (credit given back); it returns their
// leasing marks' ends. Called with the worker's mutex.
func (w *worker) abandon(key string, e *streamLease) (dones []func()) {
	e.abandoned, e.busy = true, false
	w.forgetStream(key, e)
	for _, d := range e.parked {
		e.in.credit += len(d.res.Messages)
		dones = append(dones, d.done)
	}
	e.parked = nil
	return dones
}

// forgetStream removes e from its key's streams, if it is still there.
// Called with the worker's mutex.
func (w *worker) forgetStream(key string, e *streamLease) {
	k := streamKey{e.partitionID, groupName(e.in.Target.Group)}
	if ks := w.keys[key]; ks != nil && ks.streams[k] == e {
		delete(ks.streams, k)
	}
}

// afterSettle is a test's hook (export_test.go): run by Settle once the
// credit a reservation held is given back and before what it leased is
// delivered; nil in a running server.
var afterSettle atomic.Pointer[func()]

// eachByPreference offers a partition to intentions in the order a push's
// hand-off gives it: byPreference's, which decideFast gives a hinted
// partition in. Called with the worker's mutex.
func eachByPreference(ins []*Intention, partition string, take func(*Intention) bool) {
	byPreference(len(ins), func(i int) (string, string, bool) {
		return ins[i].Target.Group, ins[i].Target.Partition, ins[i].gone
	}, partition, func(i int) bool { return take(ins[i]) })
}
