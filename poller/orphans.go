package poller

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/heraldmq/herald/queue"
)

// Orphaned leases: a statement that leases under ids the poller generated
// (a coalesced pop, a claim, a push's hand-off) and whose answer was lost
// (queue.OutcomeUnknown: the connection broke after it was sent) may have
// committed its leases, and nobody holds the messages. Left alone, the
// partition would wait the whole lease time and its message come back
// charged an attempt that never ran. So the ids go to the orphan list, and
// the releaser (one goroutine of Run) gives them back by id
// (queue.Store.ReleaseLease: no attempt counted), retrying with back-off
// while the database is away, and wakes the queues they were for. A
// release that finds nothing (the statement had not committed) does
// nothing. Each id is released a second time orphanRecheck later: a
// statement the server had received but not yet run when the connection
// broke (a frozen server, thawed) commits its lease after the first
// release.

const (
	orphanRetryMin = 50 * time.Millisecond
	orphanRetryMax = time.Second // the partition is served again within this of the database's return
	// orphanRecheck is past the server's statement_timeout (30 s, set by
	// queue.ParsePoolConfig), so no statement sent before the first
	// release can still commit a lease after the second.
	orphanRecheck = 35 * time.Second
)

// orphan is one lease id to give back, and what to wake after: a queue
// key (a lost pop's intention), or the partitions of msgs (a release that
// failed).
type orphan struct {
	leaseID, key string
	msgs         []queue.Message
	// pop: a direct pop's (GiveBack): wake popQueue ("" for a selection
	// by namespace or task: every queue).
	pop      bool
	popQueue string
	// ackPID and ackGroup: an ack's partition (AckLost), to wake once its
	// names are known; no lease id.
	ackPID, ackGroup string
	at               time.Time // not before
	rechecked        bool      // the second release is the last
}

// orphans is the list the releaser works through.
type orphans struct {
	mu    sync.Mutex
	list  []orphan
	ready chan struct{} // capacity 1
}

// orphaned queues lease ids whose statement's outcome is unknown (or whose
// release failed) for the releaser; key is the queue key to wake once
// they are given back ("" for none).
func (p *Poller) orphaned(key string, leaseIDs ...string) {
	for _, id := range leaseIDs {
		if id != "" {
			p.orph.add(orphan{leaseID: id, key: key})
			p.metrics.orphans.Inc()
		}
	}
}

// GiveBack gives back, through the releaser, the lease a pop made outside
// the poller (queue.Store.Pop with a PopRequest.LeaseID) may have taken
// although its answer was lost (queue.OutcomeUnknown), as it does for its
// own pops: at once while the database answers, retrying with back-off
// while it is away, once more orphanRecheck later, with no attempt
// charged. queueName (the pop's queue; "" for a selection by namespace
// or task: every queue) is woken once it is given back. An empty leaseID
// (autoAck) does nothing.
func (p *Poller) GiveBack(leaseID, queueName string) {
	if leaseID == "" {
		return
	}
	p.orph.add(orphan{leaseID: leaseID, pop: true, popQueue: queueName})
	p.metrics.orphans.Inc()
}

// AckLost wakes, through the releaser, the partitions of acks whose
// outcome is unknown (queue.OutcomeUnknown: their COMMIT may have landed
// while the answer was lost). A committed ack may have ended a lease, or
// moved a cursor past messages other than the ones it named, and nothing
// else would tell this poller before the sweep. The partition's names are
// read once the database answers (retrying with back-off meanwhile, as
// releases do), then the partition is woken here and its lease hint
// cleared on the other instances.
func (p *Poller) AckLost(acks []queue.Ack) {
	seen := map[[2]string]bool{}
	for _, a := range acks {
		k := [2]string{a.PartitionID, a.Group}
		if a.PartitionID == "" || seen[k] {
			continue
		}
		seen[k] = true
		p.orph.add(orphan{ackPID: a.PartitionID, ackGroup: a.Group, rechecked: true})
	}
}

// add queues o and tells the releaser.
func (o *orphans) add(or orphan) {
	o.mu.Lock()
	o.list = append(o.list, or)
	o.mu.Unlock()
	select {
	case o.ready <- struct{}{}:
	default:
	}
}

// OrphansPending reports how many lease ids wait for the releaser (a first
// release or the recheck).
func (p *Poller) OrphansPending() int {
	p.orph.mu.Lock()
	defer p.orph.mu.Unlock()
	return len(p.orph.list)
}

// releaseOrphans is the releaser: it runs until ctx ends.
func (p *Poller) releaseOrphans(ctx context.Context) {
	backoff := orphanRetryMin
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := p.releaseDue(ctx)
		wait := time.Hour
		switch {
		case next.failed:
			wait = backoff
			backoff = min(backoff*2, orphanRetryMax)
		default:
			backoff = orphanRetryMin
			if !next.at.IsZero() {
				wait = max(time.Until(next.at), 0)
			}
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-p.orph.ready:
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

type releaseOutcome struct {
	failed bool      // a release failed: try again after the back-off
	at     time.Time // the earliest recheck still to come
}

// releaseDue releases every orphan that is due, with no lock held during
// the queries, stopping at the first failure (the database is away: the
// rest would fail too).
func (p *Poller) releaseDue(ctx context.Context) releaseOutcome {
	now := time.Now()
	p.orph.mu.Lock()
	var due []orphan
	keep := p.orph.list[:0]
	for _, o := range p.orph.list {
		if o.at.After(now) {
			keep = append(keep, o)
		} else {
			due = append(due, o)
		}
	}
	p.orph.list = keep
	p.orph.mu.Unlock()

	var out releaseOutcome
	var back []orphan
	woken := map[string]bool{}
	for i, o := range due {
		rctx, cancel := context.WithTimeout(ctx, queryTimeout)
		err := p.store.ReleaseLease(rctx, o.leaseID) // none for an ack's partition
		var q, part string
		if err == nil && o.ackPID != "" {
			q, part, err = p.store.PartitionOf(rctx, o.ackPID)
			if errors.Is(err, queue.ErrNotFound) {
				err, o.ackPID = nil, "" // deleted since: nothing to wake
			}
		}
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				p.log.Warn().Err(err).Str("lease", o.leaseID).Int("waiting", len(due)-i).
					Msg("giving back the leases of a lost answer failed; retrying")
			}
			back = append(back, due[i:]...)
			out.failed = true
			break
		}
		if o.key != "" && !woken[o.key] {
			// Woken once its batch's releases are done (below): a key
			// woken after its first one looked while another still held
			// the partition (a lost hand-off's new lease, then the
			// stream's own).
			woken[o.key] = true
		}
		if o.ackPID != "" {
			p.LeaseReleased(q, part, o.ackPID, o.ackGroup)
			p.Wake(SourceAck, q, part)
		}
		switch {
		case o.pop && o.popQueue != "":
			p.Wake(SourceRelease, o.popQueue, "")
		case o.pop:
			p.WakeAll(SourceRelease)
		}
		p.released(o.msgs)
		if !o.rechecked {
			o.rechecked, o.at = true, time.Now().Add(orphanRecheck)
			back = append(back, o)
		}
	}
	for key := range woken {
		p.wakeKey(key)
	}
	p.orph.mu.Lock()
	p.orph.list = append(p.orph.list, back...)
	for _, o := range p.orph.list {
		if !o.at.IsZero() && (out.at.IsZero() || o.at.Before(out.at)) {
			out.at = o.at
		}
		if o.at.IsZero() || !o.at.After(now) {
			out.at = now
		}
	}
	p.orph.mu.Unlock()
	return out
}

// wakeKey marks a queue key for a pre-flight and signals its worker.
func (p *Poller) wakeKey(key string) {
	w := p.workerFor(key)
	w.mu.Lock()
	if ks := w.keys[key]; ks != nil {
		ks.touch()
	}
	w.mu.Unlock()
	w.signal()
}

// forgetOnUnknown gives back, through the releaser, the leases a statement
// that failed with err may have made under leaseIDs, and reports whether
// its outcome was unknown. Every other failure left nothing leased.
func (p *Poller) forgetOnUnknown(err error, key string, leaseIDs ...string) bool {
	if !queue.OutcomeUnknown(err) {
		return false
	}
	p.orphaned(key, leaseIDs...)
	return true
}

// logFailure logs a failed statement of a cycle (not when ctx ended: the
// poller stops), one line per outage (queue.OutageLog).
func (p *Poller) logFailure(ctx context.Context, err error, msg string) {
	if errors.Is(ctx.Err(), context.Canceled) {
		return
	}
	p.outage.Fail(err, msg)
}
