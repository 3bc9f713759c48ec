package gateway

import (
	"context"
	"time"

	"github.com/heraldmq/herald/queue"
)

// How a session ends: drained (withdrawn at once, closed at its point of
// the drain window), or closed by whatever comes first (its client, a
// failed write, a slow consumer, a protocol error, its token's expiry),
// giving back every lease it holds.
//
// A slow consumer (session.go, SlowConsumerAfter):
//
//	a write's socket   close(4001): nothing more queued or leased,
//	takes nothing ───▶ leases given back ─▶ transport.close: the write under
//	for 5 s            way and the close frame / last event get 3 s ─▶ TCP closed

// drain stops leasing to the session at once, then closes it after delay
// with a code that says: reconnect, elsewhere. Until then its client may ack
// what it processes; closing releases what it still holds.
func (ss *session) drain(delay time.Duration) {
	ss.mu.Lock()
	if ss.draining || ss.closed {
		ss.mu.Unlock()
		return
	}
	ss.draining = true
	var cancels []func()
	for _, sub := range ss.subs {
		if sub.cancel != nil {
			cancels = append(cancels, sub.cancel)
		}
	}
	ss.mu.Unlock()
	for _, cancel := range cancels {
		cancel()
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ss.done:
			return
		}
	}
	if ss.opts.flushOnDrain {
		ss.waitWritten()
	}
	ss.close(&disconnectShutdown)
}

// waitWritten waits until the writer has written what is queued, or the
// session closed.
func (ss *session) waitWritten() {
	ss.mu.Lock()
	if ss.closed || !ss.writing {
		ss.mu.Unlock()
		return
	}
	if ss.emptied == nil {
		ss.emptied = make(chan struct{})
	}
	ch := ss.emptied
	ss.mu.Unlock()
	select {
	case <-ch:
	case <-ss.done:
	}
}

// close ends the session once: no more leases or writes, intentions
// withdrawn, every lease it holds given back (at once, or, with
// keepForResume, after the resume grace for what was written), and the
// transport closed with d (nil: the connection is gone, say nothing). The
// leases go before the transport closes, which may wait on the client (a
// slow consumer's close takes up to SlowConsumerCloseGrace). A slow
// consumer keeps nothing for a resume: what it was written is likely still
// in its socket, and other consumers should not wait for it. Any goroutine
// may call it, without mu; the first call does the work.
func (ss *session) close(d *Disconnect) {
	ss.mu.Lock()
	if ss.closed {
		ss.mu.Unlock()
		return
	}
	ss.closed = true
	ss.wg.Add(1) // the owner's wait waits for the releases too
	defer ss.wg.Done()
	keep := ss.opts.keepForResume && (d == nil || d.Code != CloseSlowConsumer)
	subs := ss.subs
	ss.subs = nil
	unwritten := map[string]bool{}
	for _, it := range ss.out {
		if it.res != nil {
			for _, m := range it.res.Messages {
				unwritten[m.LeaseID] = true
			}
		}
	}
	ss.out = nil
	now, later := map[string][]queue.Message{}, map[string][]queue.Message{}
	for k, dl := range ss.inflight {
		ss.s.deliveries.drop(k, dl.sub)
		if keep && !unwritten[k.leaseID] {
			addLease(later, k, dl)
		} else {
			addLease(now, k, dl)
		}
	}
	ss.inflight, ss.parts = nil, nil
	for _, t := range []*time.Timer{ss.check, ss.expiry, ss.watch} {
		if t != nil {
			t.Stop()
		}
	}
	ss.mu.Unlock()
	ss.stop()
	for _, sub := range subs {
		if sub.cancel != nil {
			sub.cancel()
		}
	}
	ss.release(now)
	ss.t.close(d)
	for lease, msgs := range later {
		ss.s.releaseLater(ss.opts.chain, lease, msgs)
	}
	close(ss.done)
}

// releaseLater gives a closed session's lease back after the resume grace
// period, or at once when a newer stream of its chain has opened here (its
// page is back: sse_chain.go). Server.Close runs whatever is still
// pending. The release is a query: it never runs under graceMu, which the
// grace timers and every closing stream take.
func (s *Server) releaseLater(chain chainRef, lease string, msgs []queue.Message) {
	s.graceMu.Lock()
	if s.closed || s.newerInChainLocked(chain) {
		// A stream that ended after Server.Close: nothing waits for a
		// resume; or its page already resumed on a newer stream.
		s.graceMu.Unlock()
		s.poller.Release(context.Background(), lease, msgs)
		return
	}
	s.graceLeases[lease]++
	release := func() {
		s.graceMu.Lock()
		if s.graceLeases[lease]--; s.graceLeases[lease] <= 0 {
			delete(s.graceLeases, lease)
		}
		s.graceMu.Unlock()
		s.poller.Release(context.Background(), lease, msgs)
	}
	s.graceWG.Add(1)
	var t *time.Timer
	t = time.AfterFunc(s.cfg.SSEResumeGrace, func() {
		defer s.graceWG.Done()
		s.graceMu.Lock()
		_, pending := s.grace[t]
		delete(s.grace, t)
		s.forgetKeptLocked(chain, t)
		s.graceMu.Unlock()
		if pending {
			release()
		}
	})
	s.grace[t] = release // before the timer's func can look: it takes graceMu
	s.keptInChainLocked(chain, t)
	s.graceMu.Unlock()
}
