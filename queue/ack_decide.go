package queue

import "slices"

// The decision of an ack transaction, with no database: readAck (ack.go)
// reads an ackState under the row locks, decideAck turns it and the items
// into an ackPlan, writeAck writes the plan. Everything a request's items
// carry from one to the next lives in its lockedConsumer.

// ackState is what an ack transaction read: each item's message, and the
// consumer rows the items name, locked.
type ackState struct {
	msgs   []ackedMessage // by item
	locked map[consumerKey]*lockedConsumer
}

// ackedMessage is an item's message as the resolve read found it.
type ackedMessage struct {
	queue, partition string // "" when the partition does not exist
	seq              *int64 // nil: no such message
}

// ackPlan is what decideAck made of the items: their results, the messages
// to dead-letter, and the consumer rows to write back, in the order the
// items first changed them.
type ackPlan struct {
	results []AckResult
	dead    []deadLetter
	rows    []consumerRow
	// released: the result index of the item that ended each row's lease,
	// for settlePending.
	released map[consumerKey]int
}

// settlePending completes the Pending of the leases the plan ended once
// the rows caughtUp lists were marked after the commit: the copy a row's
// ack read is a lower bound (a push leaves the row of a group that is
// behind alone), so a lease that ended with the cursor at the copy has
// messages waiting if its marking says so (pending: readyRowsPendingSQL),
// or, when the marking failed (ok false), as far as anyone can tell (a
// waiting consumer then looks once for nothing, rather than never).
func (p ackPlan) settlePending(pending map[consumerKey]bool, ok bool) {
	for k, i := range p.released {
		if r := &p.results[i]; !r.Pending && (!ok || pending[k]) {
			r.Pending = true
		}
	}
}

// consumerRow is a consumer row to write back.
type consumerRow struct {
	key consumerKey
	st  *cursorState
	// lastOffset is the row's copy of its partition's last_offset, as read:
	// a row whose cursor reaches it is caught up, and is marked again after
	// the commit (caughtUp).
	lastOffset int64
	// renew ≥ 0: the row's lease follows its partition and stays; its time
	// starts again, that many seconds, held by owner for subject. -1: the
	// lease's expiry is kept.
	renew          int
	owner, subject string
	// following: the lease stays, following the partition: no pop may take
	// the row, so it is not marked (caughtUp).
	following bool
}

// caughtUp lists the rows whose new cursor reached their copy of
// last_offset: the rows to mark after the commit (readyRowsSQL).
func caughtUp(rows []consumerRow) (pids, groups []string) {
	for _, r := range rows {
		if r.st.cursor >= r.lastOffset && !r.following {
			pids = append(pids, r.key.partitionID)
			groups = append(groups, r.key.group)
		}
	}
	return pids, groups
}

// decideAck applies acks, in order, to the rows of st (changed in place:
// they are the transaction's working copy). Each item is checked against
// what the items before it left (lockedConsumer.refusal); a lease given
// back or finished ends after the last item. It fails only on a status
// normalizeAcks would not have let through.
func decideAck(st ackState, acks []Ack, proven []string) (ackPlan, error) {
	plan := ackPlan{results: make([]AckResult, len(acks))}
	for _, lc := range st.locked {
		lc.givenBack, lc.releasedBy = nil, -1
	}
	var order []consumerKey
	touched := map[consumerKey]bool{}
	for i, a := range acks {
		m := st.msgs[i]
		r := &plan.results[i]
		*r = AckResult{Index: i, TransactionID: a.TransactionID, Queue: m.queue, Partition: m.partition}
		if m.seq == nil {
			r.Error = ErrTextNotFound
			continue
		}
		seq := *m.seq
		k := consumerKey{a.PartitionID, a.Group}
		lc := st.locked[k]
		if lc == nil {
			r.Error = ErrTextNotLeased
			continue
		}
		if a.LeaseID == "" && lc.liveLease != "" && slices.Contains(proven, lc.liveLease) {
			a.LeaseID = lc.liveLease
		}
		if r.Error = lc.refusal(a, seq); r.Error != "" {
			continue
		}
		r.Success, r.LeaseID = true, a.LeaseID
		if lc.st.isDone(seq) {
			continue // acked before: acks are idempotent
		}
		if !touched[k] {
			touched[k] = true
			order = append(order, k)
		}
		dead, err := lc.apply(a, seq, i)
		if err != nil {
			return ackPlan{}, err
		}
		if dead != nil {
			if lc.dead.keeps(dead.exhausted) {
				plan.dead = append(plan.dead, *dead)
				r.DLQ = true
			} else {
				r.Dropped = true
			}
		}
		lc.lastItem = i
		if lc.st.leaseComplete() && !lc.follows {
			// A lease that follows its partition stays when all it
			// covers is done: the next push here hands it more.
			lc.releaseAfter(i)
		}
	}
	for _, k := range order {
		plan.settle(k, st.locked[k])
	}
	return plan, nil
}

// apply applies ack i (a, of the message at seq) to the row: done, given
// back, or given up on (the dead letter it returns, which the queue's
// deadPolicy keeps or drops).
func (lc *lockedConsumer) apply(a Ack, seq int64, i int) (*deadLetter, error) {
	switch a.Status {
	case StatusCompleted, StatusSuccess:
		lc.st.markDone(seq)
	case StatusDLQ:
		dl := deadLetter{partitionID: a.PartitionID, seq: seq, group: a.Group, err: a.Error, retries: lc.st.retryCount(seq)}
		lc.st.markDone(seq)
		return &dl, nil
	case StatusFailed:
		isDead, retries := lc.st.fail(seq, lc.retryLimit)
		if !isDead {
			lc.giveBack(seq, i)
			return nil, nil
		}
		lc.st.markDone(seq)
		return &deadLetter{partitionID: a.PartitionID, seq: seq, group: a.Group, err: a.Error, retries: retries,
			exhausted: true}, nil
	case StatusRetry:
		lc.giveBack(seq, i)
	default:
		return nil, inputErrorf("unknown ack status %q", a.Status)
	}
	return nil, nil
}

// settle records what the acks did to row k: the lease they ended (on the
// result of the ack that ended it) and the row to write.
func (plan *ackPlan) settle(k consumerKey, lc *lockedConsumer) {
	if lc.releasedBy >= 0 && lc.st.leaseID != "" {
		lc.st.release()
		plan.results[lc.releasedBy].LeaseReleased = true
		// Exact when the copy says so; otherwise the row is caught up, and
		// its marking tells (settlePending).
		plan.results[lc.releasedBy].Pending = lc.st.cursor < lc.lastOffset
		if plan.released == nil {
			plan.released = map[consumerKey]int{}
		}
		plan.released[k] = lc.releasedBy
	}
	if lc.follows && lc.releasedBy < 0 && lc.st.leaseComplete() {
		plan.results[lc.lastItem].Idle = true
	}
	if lc.st.changed {
		r := consumerRow{key: k, st: &lc.st, lastOffset: lc.lastOffset, renew: -1}
		if lc.follows && lc.st.leaseID != "" {
			r.renew, r.owner, r.subject, r.following = lc.leaseTime, lc.owner, lc.subject, true
		}
		plan.rows = append(plan.rows, r)
	}
}

// consumerKey names a consumer row: a (partition, group) pair.
type consumerKey struct{ partitionID, group string }

// lockedConsumer is a consumer row an ack transaction locked, as read, and
// what the request's items did to it so far.
type lockedConsumer struct {
	st          cursorState
	liveLease   string // the lease id when the request started, if unexpired
	deliveredTo int64  // the highest offset ever leased to the group here
	lastOffset  int64  // the partition's last offset, as the row knows it
	retryLimit  int
	dead        deadPolicy
	subject     string // who the last lease was for; "" for no one
	// seekFrom, seekTo: the offsets (seekFrom, seekTo] the last seek (or
	// group reset) passed over, done by the move and not by an ack (see
	// placeConsumers); equal when none.
	seekFrom, seekTo int64

	// What earlier items of the request left (decideAck starts them
	// afresh): offsets given back (failed or retry), and the item whose
	// ack makes the lease end with the request (-1: none). The lease
	// itself ends only after the last item, so one request may fail one
	// message and finish the others.
	givenBack  map[int64]bool
	releasedBy int

	// follows: the live lease follows the partition (follow_lease): its
	// st.leaseTo was read as the partition's last offset, and an ack that
	// completes it leaves it held, its time (leaseTime seconds, for owner)
	// starting again.
	follows   bool
	leaseTime int
	owner     string
	lastItem  int // the last item applied to the row
}

// skipped reports whether seq is done because a seek passed over it.
func (lc *lockedConsumer) skipped(seq int64) bool {
	return seq > lc.seekFrom && seq <= lc.seekTo && lc.st.isDone(seq)
}

// covers reports whether seq lies in the lease's range.
func (lc *lockedConsumer) covers(seq int64) bool {
	return seq >= lc.st.leaseFrom && seq <= lc.st.leaseTo
}

// refusal says why ack a of offset seq is refused, as the earlier items of
// the request left the row, or "" when it may be applied:
//
//   - a Holder must be the subject of the row's last lease, if it had one
//     (whatever else holds: another's message is not even acked twice);
//   - naming a lease: a done seq is a harmless repeat, whether or not the
//     lease is still live (a retried ack whose first answer was lost),
//     unless a seek passed over seq (skipped): the seek ended the lease it
//     was delivered under, and the holder's ack is refused; otherwise it
//     must be the live lease, cover seq and not have given seq back
//     earlier in the request;
//   - naming none: a done seq is a harmless repeat, unless a seek passed
//     over it (no delivery made since the seek holds it); otherwise no lease may be
//     live (only its holder, who knows its id, may act under it), seq must
//     have been delivered, and only a verdict (completed, dlq) is taken:
//     failed and retry give a lease back, and there is none.
func (lc *lockedConsumer) refusal(a Ack, seq int64) string {
	if a.Holder != "" && lc.subject != "" && a.Holder != lc.subject {
		return ErrTextForeign
	}
	// The lease itself ends only after the last item (releasedBy), so the
	// one live when the request started is live for all of its items.
	if a.LeaseID != "" {
		switch {
		case lc.skipped(seq):
			// Done by a seek, which ended the lease it was delivered
			// under (a lease taken since covers no offset it passed).
			return ErrTextInvalidLease
		case lc.st.isDone(seq):
			// A repeat, whatever lease it names: the ack of a client that
			// retries one whose answer it lost (the database failed over)
			// may come after the lease it names ended. It changes nothing.
			return ""
		case a.LeaseID != lc.liveLease:
			return ErrTextInvalidLease
		case lc.givenBack[seq]:
			return ErrTextReleased
		case !lc.covers(seq):
			return ErrTextOutsideLease
		}
		return ""
	}
	switch {
	case lc.skipped(seq):
		return ErrTextNotLeased
	case lc.st.isDone(seq):
		return ""
	case lc.liveLease != "":
		return ErrTextLeaseRequired
	case seq > lc.deliveredTo:
		return ErrTextNotLeased
	case a.Status == StatusFailed || a.Status == StatusRetry:
		return ErrTextNoLiveLease
	}
	return ""
}

// giveBack returns seq to the queue: the lease ends with the request, and no
// later item of it may act on seq under the lease.
func (lc *lockedConsumer) giveBack(seq int64, i int) {
	if lc.givenBack == nil {
		lc.givenBack = map[int64]bool{}
	}
	lc.givenBack[seq] = true
	lc.releaseAfter(i)
}

// releaseAfter marks the lease to end with the request because of item i.
func (lc *lockedConsumer) releaseAfter(i int) {
	if lc.releasedBy < 0 {
		lc.releasedBy = i
	}
}
