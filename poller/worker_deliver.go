package poller

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/heraldmq/herald/queue"
)

// Delivery: what every path (pre-flight cycle, fast path, claim, hand-off)
// does with what it leased. Called with no lock held; deliver takes the
// worker's mutex around the intention's state, never around Deliver.

// plan is what a pop was asked to take for one intention.
type plan struct {
	total      int // the most messages (Assignment.Total): taking that many means there may be more
	partitions int // the partitions assigned: one that came back empty may hold more
}

// plansOf sums up as per intention.
func plansOf(as []queue.Assignment) map[int]plan {
	out := map[int]plan{}
	for _, a := range as {
		pl := out[a.Intention]
		pl.total = a.Total
		pl.partitions++
		out[a.Intention] = pl
	}
	return out
}

// deliver hands res to its intention, or releases the lease at once if the
// consumer is gone. pl is what the pop was asked to take for it.
// allClaimed says that every partition known to have work for the
// intention was assigned to it this cycle (a fast-path cycle that skipped
// none of its hints); otherwise claiming as many partitions as it may
// means others may wait.
func (w *worker) deliver(ctx context.Context, in *Intention, res *queue.PopResult, allClaimed bool, pl plan) {
	es := w.beginStreams(in, res)
	w.deliverOne(ctx, in, res, allClaimed, pl)
	w.handOn(ctx, es, res)
}

// deliverInOrder delivers what a push handed a stream under the lease of
// e (its delivery marked under way), then what was parked behind it.
func (w *worker) deliverInOrder(ctx context.Context, in *Intention, res *queue.PopResult, pl plan, es []*streamLease) {
	w.deliverOne(ctx, in, res, true, pl)
	w.handOn(ctx, es, res)
}

// handOn ends the deliveries of res under es and delivers, in order, the
// extensions parked behind them (extend.go).
func (w *worker) handOn(ctx context.Context, es []*streamLease, res *queue.PopResult) {
	w.deliverDue(ctx, w.endStreams(es, res))
}

// handOnAfterRead is handOn after a read-back of e's lease (worker.fill)
// over the offsets after after and before before (0: up to its end): a
// parked delivery it hands on waited for the read, not for the delivery
// before it: counted (herald_follow_parked_by_read_total) and logged with
// how long it waited.
func (w *worker) handOnAfterRead(ctx context.Context, e *streamLease, res *queue.PopResult, after, before int64) {
	due := w.endStreams([]*streamLease{e}, res)
	w.noteReadHandOn(e, due, after, before, len(res.Messages))
	w.deliverDue(ctx, due)
}

// noteReadHandOn counts and logs the parked delivery a read-back of e's
// lease over (after, before) that found read messages made due (due[0],
// if any; those after it are handed on by it), and marks it logged.
func (w *worker) noteReadHandOn(e *streamLease, due []parkedDelivery, after, before int64, read int) {
	if len(due) == 0 {
		return
	}
	d := &due[0]
	w.p.metrics.parkedByRead.Inc()
	waited := time.Since(d.at)
	w.p.log.WithLevel(waitLevel(waited)).Str("lease", e.lease).Str("partition_id", e.partitionID).
		Int64("after", after).Int64("before", before).Int("read", read).
		Int64("parked_from", d.res.Messages[0].Offset).Dur("waited", waited).
		Msg("a parked delivery under a following lease was handed on by a read-back of its lease")
	d.at = time.Time{} // logged
}

// parkedLong is how long a parked delivery waits before its hand-on is
// logged as a warning: a stall its consumer sees.
const parkedLong = 250 * time.Millisecond

// waitLevel is the level a parked delivery's wait of d is logged at.
func waitLevel(d time.Duration) zerolog.Level {
	if d >= parkedLong {
		return zerolog.WarnLevel
	}
	return zerolog.InfoLevel
}

// deliverDue delivers due, the parked deliveries endStreams found due, in
// order, and those each hands on in turn. One that waited parkedLong or
// more is logged.
func (w *worker) deliverDue(ctx context.Context, due []parkedDelivery) {
	for len(due) > 0 {
		d := due[0]
		if !d.at.IsZero() {
			if waited := time.Since(d.at); waited >= parkedLong {
				w.p.log.Warn().Str("lease", d.e.lease).Int64("parked_from", d.res.Messages[0].Offset).Dur("waited", waited).
					Msg("a parked delivery under a following lease waited long for the delivery before it")
			}
		}
		w.p.metrics.handoffs.Inc()
		w.deliverOne(ctx, d.e.in, d.res, true, d.pl)
		d.done()
		due = append(due[1:], w.endStreams([]*streamLease{d.e}, d.res)...)
	}
}

// deliverOne is deliver without the order of a stream's lease.
func (w *worker) deliverOne(ctx context.Context, in *Intention, res *queue.PopResult, allClaimed bool, pl plan) {
	if res.PartitionsClaimed < pl.partitions {
		res.More = true // an assignment came back empty: taken or changed since the pre-flight
	}
	// Paused since the cycle began (pop maintenance): give the lease back,
	// as for a consumer that left, and deliver nothing. An autoAck pop
	// keeps no lease (its cursor moved already): delivered all the same.
	paused := w.p.paused.Load() && res.LeaseID != ""
	var expiry time.Time // a one-shot's lease, which its key's knowledge must not outlive
	leaseKnown := true
	if !in.Standing && res.LeaseID != "" {
		expiry, leaseKnown = w.p.leaseExpiry(res)
	}
	w.mu.Lock()
	gone := in.gone || paused
	ended := false
	if !gone && !in.Standing {
		// A one-shot intention ends with this delivery, whatever Deliver
		// answers: withdraw it first, so it is never counted (or served) as
		// still waiting once its consumer holds the messages.
		ended = w.markGone(in)
		w.noteLeased(in, res)
		w.noteAnswer(in, res, allClaimed, pl, expiry, leaseKnown)
	}
	if in.Standing && res.LeaseID != "" {
		w.forgetGroupKnown(in)
	}
	w.mu.Unlock()
	if ended {
		w.p.withdrawn(in)
	}
	// A standing intention may have leased several batches: its consumer
	// gets them a batch at a time.
	parts := []*queue.PopResult{res}
	if in.Standing {
		parts = splitBatches(res, in.Batch)
	}
	if paused {
		// Nothing delivered: what it was charged comes back.
		w.mu.Lock()
		if in.Standing {
			in.credit += len(res.Messages)
		} else {
			in.answered = false
		}
		w.mu.Unlock()
	}
	if !gone {
		w.p.LeasesTaken(res) // before its ack can release them
	}
	for i, part := range parts {
		if gone || !in.Deliver(part) {
			w.unhand(in, parts[i:])
			for _, rest := range parts[i:] {
				w.p.Release(ctx, rest.LeaseID, rest.Messages)
			}
			return
		}
	}
	w.p.metrics.delivered.Inc()
	w.p.metrics.observeDelivered(res, time.Now())
	if in.Standing {
		w.afterStreamDelivery(in, res, allClaimed, pl)
	}
}

// unhand forgets that a push served in's group on the partitions of a
// delivery in refused (keyState.handed: its subscription had just gone,
// its intention not yet withdrawn): their leases go back, and the release's
// wake-up must find the partitions for the group's next intention, not
// pass them over as served until the sweep.
func (w *worker) unhand(in *Intention, refused []*queue.PopResult) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ks := w.keys[in.key]
	if ks == nil || len(ks.handed) == 0 {
		return
	}
	for _, res := range refused {
		for _, m := range res.Messages {
			delete(ks.handed, m.PartitionID+"\x00"+in.Target.Group)
		}
	}
}

// forgetGroupKnown forgets what in's group's targets were known to hold:
// a stream's lease, which nothing here times, may change it when it
// expires. Called with the worker's mutex.
func (w *worker) forgetGroupKnown(in *Intention) {
	if ks := w.keys[in.key]; ks != nil {
		for t := range ks.known {
			if t[1] == in.Target.Group {
				delete(ks.known, t)
			}
		}
	}
}

// afterStreamDelivery decides, once a standing intention's consumer has
// res, whether its queue is looked at again now.
func (w *worker) afterStreamDelivery(in *Intention, res *queue.PopResult, allClaimed bool, pl plan) {
	w.mu.Lock()
	// Its credit was charged when the pop's hold ended (charge). All it
	// could take, a partition it left messages in, or as many
	// partitions as it may take (when others may have work) means there may
	// be more: look again now. Otherwise it drained what it took, and every
	// other change marks its queue by itself (a push, an ack, a timer), so a
	// cycle with a pre-flight would find nothing.
	full := len(res.Messages) >= pl.total || res.More || (!allClaimed && res.PartitionsClaimed >= max(in.Partitions, 1))
	// Credit coming back to an intention whose last take was cut short
	// by its credit (or batch) may find more: AddCredit looks then.
	in.limited = full
	more := false
	ks := w.keys[in.key]
	if ks != nil {
		ks.claim = full && claimable(in)
	}
	if ks != nil && full && !in.gone {
		if in.ready() {
			ks.touch()
			more = true
		} else {
			// Not now (an autoAck subscription's delivery still under
			// way, say): whatever lets it take again looks (lookIfMissed).
			in.missed = true
		}
	}
	w.mu.Unlock()
	if more {
		w.signal()
	}
}

// noteLeased notes the leases of a one-shot answer until this instance
// hears them released (keyState.leased). Called with the worker's mutex.
func (w *worker) noteLeased(in *Intention, res *queue.PopResult) {
	ks := w.keys[in.key]
	if ks == nil || res.LeaseID == "" {
		return
	}
	for _, m := range res.Messages {
		if ks.leased == nil {
			ks.leased = map[hintKey]bool{}
		}
		ks.leased[hintKey{m.PartitionID, groupName(m.Group)}] = true
	}
}

// noteAnswer keeps what a one-shot intention's key knows true after its
// answer (keyState.known): one that took all it could may have left
// messages, and one whose lease expiry is unknown (the queue's config not
// cached) cannot be timed, so its target is forgotten; otherwise the
// lease arms the key's timer at its expiry (a client that never acks gets
// its messages again then, through a pre-flight). Called with the
// worker's mutex.
func (w *worker) noteAnswer(in *Intention, res *queue.PopResult, allClaimed bool, pl plan, expiry time.Time, leaseKnown bool) {
	ks := w.keys[in.key]
	if ks == nil || len(ks.known) == 0 {
		return
	}
	full := len(res.Messages) >= pl.total || res.More || (!allClaimed && res.PartitionsClaimed >= max(in.Partitions, 1))
	if full || !leaseKnown {
		delete(ks.known, [2]string{in.Target.Partition, in.Target.Group})
	}
	if !expiry.IsZero() && len(ks.known) > 0 {
		w.armAt(ks, expiry)
	}
}

// splitBatches cuts res into results of at most batch messages, in order,
// each counting the partitions it holds.
func splitBatches(res *queue.PopResult, batch int) []*queue.PopResult {
	if len(res.Messages) <= batch {
		return []*queue.PopResult{res}
	}
	var out []*queue.PopResult
	for msgs := res.Messages; len(msgs) > 0; {
		n := min(batch, len(msgs))
		part := *res
		part.Messages, msgs = msgs[:n:n], msgs[n:]
		part.Queue, part.Partition, part.PartitionID = part.Messages[0].Queue, part.Messages[0].Partition, part.Messages[0].PartitionID
		part.PartitionsClaimed = 1
		for i := 1; i < n; i++ {
			if part.Messages[i].PartitionID != part.Messages[i-1].PartitionID {
				part.PartitionsClaimed++
			}
		}
		if len(out) > 0 {
			part.DeadLettered, part.Dropped, part.Expired = nil, nil, nil // counted once, with the first
		}
		out = append(out, &part)
	}
	return out
}
