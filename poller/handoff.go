package poller

import (
	"context"
	"sync/atomic"

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
			if in.limited || !in.ready() {
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
			out = append(out, queue.Reservation{PartitionID: pp.PartitionID, Group: in.Target.Group, LeaseID: queue.NewID(),
				Limit: limit, Subject: in.Subject, AutoAck: in.AutoAck, Stream: in.Standing, Token: &reservation{w: w, in: in,
					key: key, partitionID: pp.PartitionID, could: could, held: held, leasing: end}})
			return true
		})
		w.mu.Unlock()
	}
	return out
}

// Settle implements queue.HandOff.
func (p *Poller) Settle(r queue.Reservation, res *queue.PopResult) {
	t, ok := r.Token.(*reservation)
	if !ok {
		return
	}
	defer t.leasing()
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
	w.mu.Unlock()
	if look {
		w.signal()
	}
	if res == nil {
		if r.OutcomeUnknown && !r.AutoAck { // an autoAck hand-off holds no lease to give back
			p.orphaned(t.key, r.LeaseID)
		}
		return
	}
	if f := afterSettle.Load(); f != nil {
		(*f)()
	}
	p.metrics.handoffs.Inc()
	w.deliver(context.Background(), in, res, true, plan{total: t.could, partitions: 1})
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
