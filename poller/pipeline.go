package poller

import (
	"context"

	"github.com/heraldmq/herald/queue"
)

// Pipelined leases (Intention.Pipeline): a subscription that holds a
// partition's lease gets the partition's next messages as they are pushed,
// the push extending its lease over them (queue.Reservation.LeaseID), and
// not after its earlier acks. The database decides whether the lease is
// still the subscription's, live, and covers everything before the push;
// the poller keeps, per partition, the lease it last gave the
// subscription there (the id a push reserves with) and makes deliveries
// of one lease reach Deliver in offset order: two pushes' Settle calls
// may run at once, on their own goroutines, in any order.

// heldMax bounds Intention.held: past it an idle entry is forgotten, and
// its partition's next push takes a fresh lease when the group is caught
// up (as without pipelining) instead of extending.
const heldMax = 64

// heldLease is what an intention holds on one partition.
type heldLease struct {
	lease string
	// next is the offset the lease's next delivery must start at (0: not
	// known yet, until its first delivery).
	next int64
	// waiting: extensions that came before the messages they follow.
	waiting []handed
	busy    bool // a goroutine is delivering this partition's messages
}

// handed is a hand-off waiting for its turn.
type handed struct {
	res *queue.PopResult
	pl  plan
}

// holding returns in's entry for partition pid, making one. Called with
// the worker's mutex.
func (in *Intention) holding(pid string) *heldLease {
	if h := in.held[pid]; h != nil {
		return h
	}
	if in.held == nil {
		in.held = map[string]*heldLease{}
	}
	if len(in.held) >= heldMax {
		for k, h := range in.held {
			if !h.busy && len(h.waiting) == 0 {
				delete(in.held, k)
				break
			}
		}
	}
	h := &heldLease{}
	in.held[pid] = h
	return h
}

// reserveLease is the lease id a push reserves for in on partition pid:
// the one it holds there, or a new one it will hold. Called with the
// worker's mutex.
func (in *Intention) reserveLease(pid string) string {
	if !in.Pipeline || in.AutoAck {
		return queue.NewID()
	}
	h := in.holding(pid)
	if h.lease == "" {
		h.lease = queue.NewID()
	}
	return h.lease
}

// holdsLease reports whether in holds a lease on pid a push may extend.
// Called with the worker's mutex.
func (in *Intention) holdsLease(pid string) bool {
	h := in.held[pid]
	return in.Pipeline && !in.AutoAck && h != nil && h.lease != ""
}

// forgetLease drops in's lease on pid if it is lease (a push whose outcome
// is unknown may have extended it: it is given back, and never reserved
// again). What waited for it is left to the give-back. Called with the
// worker's mutex.
func (in *Intention) forgetLease(pid, lease string) {
	if h := in.held[pid]; h != nil && h.lease == lease {
		delete(in.held, pid)
	}
}

// noteLease records, after a pop's delivery to a Pipeline intention, the
// lease it now holds on each partition of res and where it ends. Called
// with the worker's mutex.
func (in *Intention) noteLease(res *queue.PopResult) (stale []handed) {
	if !in.Pipeline || in.AutoAck || res.LeaseID == "" {
		return nil
	}
	for _, m := range res.Messages {
		h := in.holding(m.PartitionID)
		if h.lease != res.LeaseID {
			stale = append(stale, h.waiting...)
			h.waiting = nil
			h.lease = res.LeaseID
		}
		if !h.busy {
			h.next = m.Offset + 1
		}
	}
	return stale
}

// deliverInOrder delivers a hand-off to a Pipeline intention in its lease's
// offset order: a hand-off that extends the lease waits for the
// deliveries before it; whoever delivers also delivers what waited for it.
func (w *worker) deliverInOrder(in *Intention, pid string, res *queue.PopResult, pl plan) {
	w.mu.Lock()
	h := in.holding(pid)
	var stale []handed
	if !res.Extends {
		// A new lease (the group was caught up): it starts here.
		if h.lease != res.LeaseID {
			stale, h.waiting = h.waiting, nil
		}
		h.lease, h.next = res.LeaseID, res.Messages[0].Offset
	}
	h.waiting = append(h.waiting, handed{res, pl})
	if h.busy {
		w.mu.Unlock()
		w.releaseStale(stale)
		return
	}
	h.busy = true
	for {
		i := -1
		for j, it := range h.waiting {
			if it.res.LeaseID == h.lease && it.res.Messages[0].Offset == h.next {
				i = j
				break
			}
		}
		if i < 0 {
			h.busy = false
			break
		}
		it := h.waiting[i]
		h.waiting = append(h.waiting[:i], h.waiting[i+1:]...)
		h.next = it.res.Messages[len(it.res.Messages)-1].Offset + 1
		w.mu.Unlock()
		w.deliver(context.Background(), in, it.res, true, it.pl)
		w.mu.Lock()
	}
	w.mu.Unlock()
	w.releaseStale(stale)
}

// releaseStale gives back hand-offs that waited for a lease the intention
// no longer holds (their messages are redelivered). Called with no lock.
func (w *worker) releaseStale(stale []handed) {
	for _, it := range stale {
		w.p.Release(context.Background(), it.res.LeaseID, it.res.Messages)
	}
}
