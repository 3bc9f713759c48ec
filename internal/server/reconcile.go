package server

import (
	"context"
	"time"

	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
)

// Reconciling the instance's leases after the database changed under it
// (queue.InstanceLock.OnDatabaseChanged: the lock was taken again on a
// server whose postmaster started at another time, a restarted one or a
// promoted standby). An asynchronous standby has none of what the old
// primary committed after the last WAL it received: an ack answered
// success whose lease is back (no stream holds its messages any more: the
// partition would wait the lease time, and its messages come back charged
// an attempt), a pop whose deliveries a stream holds under a lease the
// database never had (its credit stays taken). One statement
// (queue.Store.ReconcileInstanceLeases) gives back, uncharged, the leases
// of this instance's streams that none holds and tells which of the held
// ones the database has; the gateway forgets the deliveries of the others
// (gateway.Server.ForgetLostLeases), and the freed partitions and every
// queue with waiting consumers are woken.

// reconcileRetryMax bounds the back-off of a reconciliation that failed:
// the database just came back and may still be busy recovering.
const reconcileRetryMax = time.Second

// databaseChanged asks the reconciler for a run. It does not block: the
// lock's goroutine calls it.
func (s *Server) databaseChanged() {
	select {
	case s.reconcileKick <- struct{}{}:
	default:
	}
}

// reconcileLoop runs a reconciliation each time the database changed, until
// ctx ends.
func (s *Server) reconcileLoop(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.reconcileKick:
		}
		s.reconcileLeases(ctx)
	}
}

// reconcileLeases reconciles until it has covered every lease made before
// it was called: a pop that was under way then (its lease not yet in a
// stream's hands, so left alone: queue.Store.ReconcileInstanceLeases'
// bound) is covered by a run after it ends. A failed run is retried with
// back-off (50 ms doubling to reconcileRetryMax). Only with the instance
// id's lock held: without it a twin may own the same id's leases.
func (s *Server) reconcileLeases(ctx context.Context) {
	changed := queue.NewID()
	backoff := 50 * time.Millisecond
	wait := func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, reconcileRetryMax)
		return true
	}
	for ctx.Err() == nil {
		if !s.lock.Held() {
			if !wait() {
				return
			}
			continue
		}
		bound := s.poller.LeaseBound()
		held := s.gw.StreamLeases()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		r, err := s.store.ReconcileInstanceLeases(rctx, held, bound)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn().Err(err).Msg("reconciling this instance's leases with the database failed; retrying")
			}
			if !wait() {
				return
			}
			continue
		}
		forgot := s.gw.ForgetLostLeases(held, r.Live)
		s.wakeFreed(r.Freed)
		s.poller.WakeAll(poller.SourceRelease)
		s.log.Info().Int("given_back", len(r.Freed)).Int("deliveries_forgotten", forgot).Int("held", len(held)).
			Msg("reconciled this instance's leases with the database")
		if bound >= changed {
			return
		}
		backoff = 50 * time.Millisecond
		if !wait() { // a pop begun before the change was under way: once more after it
			return
		}
	}
}

// wakeFreed tells this instance's poller and the other instances (NOTIFY,
// syncnet, lease hints) about leases given back.
func (s *Server) wakeFreed(freed []queue.FreedLease) {
	woken := map[[2]string]bool{}
	for _, l := range freed {
		s.poller.LeaseReleased(l.Queue, l.Partition, l.PartitionID, l.Group)
		if k := [2]string{l.Queue, l.Partition}; !woken[k] {
			woken[k] = true
			s.poller.Wake(poller.SourceRelease, l.Queue, l.Partition)
			if s.wakeOthers != nil {
				s.wakeOthers.Notify(l.Queue, l.Partition)
			}
		}
	}
}
