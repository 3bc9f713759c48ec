package gateway

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
)

// How a session's deliveries are settled: by its client's acks (ack), by
// acks made anywhere on this instance (subscription.settled, through
// afterAck), and by the lease check for acks made on other instances and
// leases that expired.

// Per-item errors of an ack that names no delivery of this connection, or
// cannot tell which.
const (
	ErrTextNotHeld   = "Not delivered on this connection under that lease: ack it where it was delivered"
	ErrTextAmbiguous = "Delivered to several subscriptions of this connection: name its leaseId, sub or consumerGroup"
)

// resolveLocked finds the delivery of this session an ack item names: by
// its leaseId (unique per delivery), or, without one, by the message and
// the sub or consumerGroup it names. Called with mu.
func (ss *session) resolveLocked(a queue.Ack, sub string) (deliveryKey, *subscription, string) {
	fits := func(d delivery) bool {
		return (sub == "" || d.sub.id == sub) && (a.Group == "" || d.sub.group == a.Group)
	}
	if a.LeaseID != "" {
		k := deliveryKey{a.LeaseID, a.PartitionID, a.TransactionID}
		if d, ok := ss.inflight[k]; ok && fits(d) {
			return k, d.sub, ""
		}
		return k, nil, ErrTextNotHeld
	}
	var found deliveryKey
	var holder *subscription
	for k, d := range ss.inflight {
		if k.partitionID != a.PartitionID || k.transactionID != a.TransactionID || !fits(d) {
			continue
		}
		if holder != nil {
			return k, nil, ErrTextAmbiguous
		}
		found, holder = k, d.sub
	}
	if holder == nil {
		return found, nil, ErrTextNotHeld
	}
	return found, holder, ""
}

// ack settles deliveries of this session; subs[i] is the sub item i names
// ("" for none). Each item is matched to one delivery (resolveLocked),
// which gives its group and lease: two subscriptions in two groups may hold
// the same message. Items that match none are answered with a per-item
// error; the others give their credit back at once (queueAck) and go to
// the store in one request, in order; what follows them (wake-ups, the
// end of their deliveries) is afterAck's. The error is the store's.
func (ss *session) ack(ctx context.Context, acks []queue.Ack, subs []string) ([]ackJSON, error) {
	finish, err := ss.queueAck(ctx, acks, subs)
	if err != nil {
		return nil, err
	}
	return finish()
}

// queueAck is ack in two steps: it matches the items and queues them in the
// store (queue.Store.QueueAck) now, in the order of the calls, and finish
// applies them, merged with other acks, and answers.
func (ss *session) queueAck(ctx context.Context, acks []queue.Ack, subs []string) (
	finish func() ([]ackJSON, error), err error) {
	out := make([]ackJSON, len(acks))
	var apply []queue.Ack
	var at []int // apply[j] is item at[j]
	var credit map[*subscription]int
	var nacked [][2]string // leases this call's nacks give back, noted after it (its own nacks all go)
	ss.mu.Lock()
	for i, a := range acks {
		k, sub, why := ss.resolveLocked(a, subs[i])
		if why != "" {
			out[i] = ackJSON{Error: &why, Index: i, TransactionID: a.TransactionID}
			continue
		}
		if ss.nackGivenBackLocked(a, k, &nacked) {
			// Its lease ended with that nack, and the message comes again
			// from the first one given back, as this nack asks.
			out[i] = ackJSON{Index: i, Success: true, TransactionID: a.TransactionID}
			if d := ss.inflight[k]; !d.acked {
				if credit == nil {
					credit = map[*subscription]int{}
				}
				credit[sub]++
			}
			ss.forgetLocked(k, ss.inflight[k])
			continue
		}
		a.Group, a.LeaseID = sub.group, k.leaseID
		apply = append(apply, a)
		at = append(at, i)
		if d := ss.inflight[k]; !d.acked {
			d.acked = true
			ss.inflight[k] = d
			if credit == nil {
				credit = map[*subscription]int{}
			}
			credit[sub]++
		}
	}
	if len(nacked) > 0 {
		if ss.givenBack == nil || len(ss.givenBack)+len(nacked) > givenBackMax {
			ss.givenBack = map[[2]string]bool{}
		}
		for _, lk := range nacked {
			ss.givenBack[lk] = true
		}
	}
	ss.mu.Unlock()
	// The client holds what it acked no more: its credit comes back now,
	// not when the ack's transaction commits, so that the next lease runs
	// alongside the ack instead of after it (maxInFlight bounds what the
	// client holds). The delivery stays in inflight until the store
	// answers: a close meanwhile still gives its lease back, and a pop
	// cannot lease its partition before the ack ends the lease.
	for sub, n := range credit {
		ss.s.poller.AddCredit(sub.in, n)
	}
	if len(apply) == 0 {
		return func() ([]ackJSON, error) { return out, nil }, nil
	}
	pending, err := ss.s.store.QueueAck(ctx, apply)
	if err != nil {
		return nil, err
	}
	return func() ([]ackJSON, error) {
		results, err := pending.Wait()
		if err != nil {
			if queue.OutcomeUnknown(err) {
				ss.s.poller.AckLost(apply) // it may have committed: wake what it freed
			}
			return nil, err
		}
		ss.s.afterAck(apply, results)
		for j, res := range results {
			res.Index = at[j]
			out[at[j]] = ackResultJSON(res)
		}
		return out, nil
	}, nil
}

// givenBackMax bounds a session's memory of the leases its nacks gave
// back; past it, a nack under one of them goes to the store, which refuses
// it (its lease ended), and the message comes again all the same.
const givenBackMax = 256

// nackGivenBackLocked reports whether a (delivery k) is a nack under a
// lease a nack of an earlier call of this connection gave back on k's
// partition; otherwise a nack's lease is added to nacked. A stream's
// consumer holds several deliveries of a partition under one lease
// (poller.Intention.Extend) and nacks each on its own: the first ends the
// lease, and the others' messages come again with it. Called with mu.
func (ss *session) nackGivenBackLocked(a queue.Ack, k deliveryKey, nacked *[][2]string) bool {
	if a.Status != queue.StatusFailed && a.Status != queue.StatusRetry {
		return false
	}
	lk := [2]string{k.leaseID, k.partitionID}
	if ss.givenBack[lk] {
		return true
	}
	*nacked = append(*nacked, lk)
	return false
}

// armCheck starts the lease check: it runs only while deliveries are
// unacknowledged, so an idle session wakes for nothing.
func (ss *session) armCheck() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.checking || ss.closed {
		return
	}
	ss.checking = true
	if ss.check == nil {
		ss.check = time.AfterFunc(ss.opts.leaseCheck, ss.checkTick)
	} else {
		ss.check.Reset(ss.opts.leaseCheck)
	}
}

func (ss *session) checkTick() {
	if !ss.enter() {
		return
	}
	defer ss.wg.Done()
	more := ss.checkLeases(ss.ctx)
	if f := leaseCheckDone.Load(); f != nil {
		(*f)()
	}
	ss.mu.Lock()
	if more && !ss.closed {
		ss.check.Reset(ss.opts.leaseCheck)
	} else {
		ss.checking = false
	}
	ss.mu.Unlock()
}

// checkLeases looks up the leases of the session's unacknowledged
// deliveries: acks posted to other instances and expired leases give
// credit back. It reports whether deliveries are still unacknowledged.
func (ss *session) checkLeases(ctx context.Context) bool {
	ss.mu.Lock()
	if len(ss.inflight) == 0 {
		ss.mu.Unlock()
		return false
	}
	byGroup := map[string]map[string]bool{} // group → partition ids
	// The deliveries the read judges: those made before it. One made
	// after it may be under a lease taken after it (a push's hand-off once
	// the lease the read saw ended): the read knows nothing of it, and
	// judged by it, it was forgotten as if acked elsewhere and its own
	// ack refused, its lease held, never acked, for its lease time.
	before := make(map[deliveryKey]bool, len(ss.inflight))
	for k, d := range ss.inflight {
		before[k] = true
		if byGroup[d.sub.group] == nil {
			byGroup[d.sub.group] = map[string]bool{}
		}
		byGroup[d.sub.group][k.partitionID] = true
	}
	ss.mu.Unlock()
	credit := map[*subscription]int{}
	var lapsed [][2]string // queue, partition
	for group, set := range byGroup {
		pids := make([]string, 0, len(set))
		for pid := range set {
			pids = append(pids, pid)
		}
		held, err := ss.s.store.HeldLeases(ctx, group, pids)
		if err != nil {
			return true // next tick
		}
		if f := leaseCheckRead.Load(); f != nil {
			(*f)()
		}
		ss.mu.Lock()
		for k, d := range ss.inflight {
			if d.sub.group != group {
				continue
			}
			h, ok := held[k.partitionID]
			if ok && h.Lapsed {
				lapsed = append(lapsed, [2]string{d.queue, d.partition})
				h.Lapsed = false // one wake-up a partition
				held[k.partitionID] = h
			}
			if ok && before[k] && (h.Finished(d.offset) || h.LeaseID != k.leaseID) {
				ss.forgetLocked(k, d)
				if !d.acked {
					credit[d.sub]++
				}
			}
		}
		ss.mu.Unlock()
	}
	for sub, n := range credit {
		ss.s.poller.AddCredit(sub.in, n)
	}
	for _, qp := range lapsed {
		// A lapsed lease's messages are ready again: a pop gives them
		// back from the first unacked one, its attempt counted.
		ss.s.wakeEverywhere(poller.SourceAck, qp[0], qp[1])
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return len(ss.inflight) > 0
}

// leaseCheckRead is a test's hook (export_test.go): run by checkLeases
// after each read of the leases, before it judges the deliveries; nil in a
// running server.
var leaseCheckRead atomic.Pointer[func()]

// leaseCheckDone is a test's hook (export_test.go): run after each lease
// check; nil in a running server.
var leaseCheckDone atomic.Pointer[func()]
