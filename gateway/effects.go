package gateway

import (
	"sync"

	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
)

// What must follow an operation, in one place: every push path (HTTP,
// WebSocket, transaction) calls afterPush, every ack path (POST /ack and
// /ack/batch, the WebSocket ack, a transaction's acks) calls afterAck, and a
// lease given back calls afterRelease. They count metrics, wake this
// instance's poller, tell other instances (NOTIFY or syncnet, lease hints),
// and return credit to the stream subscription of this instance that holds
// an acknowledged delivery. A stream on another instance gets its credit
// back through its own lease check.

// deliveryKey names one delivery of one message: the lease is unique per
// delivery, so the same message delivered to two subscriptions (two groups)
// has two keys.
type deliveryKey struct{ leaseID, partitionID, transactionID string }

// holder is a stream subscription holding unacknowledged deliveries (a
// WebSocket subscription, an SSE stream). settled is called, on the ack's
// goroutine, when one of them was acknowledged (or its lease found lost) on
// this instance; it must not block.
type holder interface {
	settled(k deliveryKey)
}

// deliveries maps each unacknowledged delivery of this instance's streams
// to its holder.
type deliveries struct{ m sync.Map }

func (d *deliveries) hold(k deliveryKey, h holder) { d.m.Store(k, h) }

// drop forgets k if h still holds it.
func (d *deliveries) drop(k deliveryKey, h holder) { d.m.CompareAndDelete(k, h) }

// settle tells k's holder, if any, that k is acknowledged.
func (d *deliveries) settle(k deliveryKey) {
	if v, ok := d.m.LoadAndDelete(k); ok {
		v.(holder).settled(k)
	}
}

// afterPush counts pushed messages, wakes this instance's poller and tells
// other instances (Notifier) about every partition that got one.
func (s *Server) afterPush(results []queue.PushResult) {
	s.metrics.history.Pushed(results)
	type qp struct{ queue, partition string }
	seen := map[qp]bool{}
	for _, res := range results {
		if res.Status == queue.StatusDuplicate {
			s.metrics.duplicates.WithLabelValues(res.Queue).Inc()
			continue
		}
		if res.Status == queue.StatusRejected {
			continue // nothing stored
		}
		s.metrics.pushed.WithLabelValues(res.Queue).Inc()
		s.metrics.rates.Add(res.Queue, 1, 0)
		k := qp{res.Queue, res.Partition}
		if !seen[k] {
			seen[k] = true
			s.wakeEverywhere(poller.SourcePush, res.Queue, res.Partition)
			s.follows.wake(res.Queue)
		}
	}
}

// countDLQ counts messages of queue q moved to the dead-letter queue.
func (s *Server) countDLQ(q string, n int64) {
	s.metrics.dlq.WithLabelValues(q).Add(float64(n))
	s.metrics.history.DeadLettered(q, n)
}

// countGivenUp counts, per queue, the messages a pop or a replay's
// settling of expired leases gave up on: dead-lettered, or dropped on a
// queue that keeps no dead letter of them.
func (s *Server) countGivenUp(deadLettered, dropped map[string]int) {
	for q, n := range deadLettered {
		s.countDLQ(q, int64(n))
	}
	for q, n := range dropped {
		s.metrics.dropped.WithLabelValues(q).Add(float64(n))
	}
}

// afterAck follows applied acknowledgements (results in the order of acks):
// metrics; the holding stream's credit for each ack that settled its
// delivery (applied, or refused because the lease is gone, so the stream
// stops waiting for it); and every lease an ack released.
func (s *Server) afterAck(acks []queue.Ack, results []queue.AckResult) {
	s.metrics.history.Acked(acks, results)
	// Successes are counted per run of one queue and status: one counter
	// lookup for a batch, not one per message.
	var run struct {
		queue  string
		status queue.AckStatus
		n      int
	}
	flush := func() {
		if run.n > 0 {
			s.metrics.acks.WithLabelValues(run.queue, string(run.status)).Add(float64(run.n))
			s.metrics.rates.Add(run.queue, 0, int64(run.n))
		}
	}
	defer flush()
	for i, res := range results {
		if i >= len(acks) {
			break
		}
		a := acks[i]
		if res.Success {
			if run.n > 0 && (run.queue != res.Queue || run.status != a.Status) {
				flush()
				run.n = 0
			}
			run.queue, run.status = res.Queue, a.Status
			run.n++
		}
		if res.DLQ {
			s.countDLQ(res.Queue, 1)
		}
		if res.Dropped {
			s.metrics.dropped.WithLabelValues(res.Queue).Inc()
		}
		lease := res.LeaseID
		if lease == "" {
			lease = a.LeaseID
		}
		if lease != "" && (res.Success || res.Error == queue.ErrTextInvalidLease) {
			s.deliveries.settle(deliveryKey{lease, a.PartitionID, a.TransactionID})
		}
		if res.Idle && res.Queue != "" {
			s.poller.FollowIdle(res.Queue, res.Partition, a.PartitionID, a.Group, res.LeaseID)
		}
		if res.LeaseReleased && res.Queue != "" {
			if res.Pending {
				s.afterRelease(poller.SourceAck, res.Queue, res.Partition, a.PartitionID, a.Group)
			} else {
				// Drained: nothing for a waiting consumer here; a push
				// meanwhile wakes it by itself, or, passed over while the
				// lease was noted held, through LeaseReleased.
				s.poller.LeaseReleased(res.Queue, res.Partition, a.PartitionID, a.Group)
			}
		}
	}
}

// wakeEverywhere says a partition (or, partition "", a whole queue) may
// have work: to this instance's poller, and to the other instances (NOTIFY,
// syncnet).
func (s *Server) wakeEverywhere(source, queueName, partition string) {
	s.poller.Wake(source, queueName, partition)
	s.notify(queueName, partition)
}

// afterRelease wakes whoever waits on a partition whose lease was given
// back (the rest of its batch, or a failed message, is available again),
// here and, through the lease hints, on other instances.
func (s *Server) afterRelease(source, queueName, partition, partitionID, group string) {
	s.poller.LeaseReleased(queueName, partition, partitionID, group) // before the wake-up: LeaseReleased
	s.poller.Wake(source, queueName, partition)
}

// afterGroupMoved follows a deletion or a seek: the leases it ended are
// released (their hints dropped, here and on the other instances) and the
// queues are looked at again, here and elsewhere, since the group may
// have messages to read again.
func (s *Server) afterGroupMoved(released []queue.ReleasedLease) {
	woken := map[string]bool{}
	for _, l := range released {
		s.poller.LeaseReleased(l.Queue, l.Partition, l.PartitionID, l.Group)
		if !woken[l.Queue] {
			woken[l.Queue] = true
			s.wakeEverywhere(poller.SourceRelease, l.Queue, "")
		}
	}
}

// wakeQueue wakes whoever waits on queueName, here and elsewhere, after an
// admin act (a seek, a subscription's move) may have given it messages.
func (s *Server) wakeQueue(queueName string) {
	s.wakeEverywhere(poller.SourceRelease, queueName, "")
}

// afterReplay counts a replay, releases the expired leases it settled, and
// wakes whoever waits on the partitions that have a message again, here
// and on the other instances, as a seek does.
func (s *Server) afterReplay(res *queue.DLQActResult) {
	for q, n := range res.Done {
		s.metrics.dlqReplayed.WithLabelValues(q).Add(float64(n))
	}
	s.countGivenUp(res.DeadLettered, res.Dropped)
	for _, l := range res.Released {
		s.poller.LeaseReleased(l.Queue, l.Partition, l.PartitionID, l.Group)
	}
	woken := map[[2]string]bool{}
	for _, o := range res.Items {
		if k := [2]string{o.Queue, o.Partition}; o.Status == queue.DLQReplayed && !woken[k] {
			woken[k] = true
			s.wakeEverywhere(poller.SourceRelease, o.Queue, o.Partition)
		}
	}
}

// afterPurge counts a purge.
func (s *Server) afterPurge(res *queue.DLQActResult) {
	for q, n := range res.Done {
		s.metrics.dlqPurged.WithLabelValues(q).Add(float64(n))
	}
}

// afterMessageDeleted follows the deletion of one message (an admin act):
// a stream of this instance holding it gets its credit back, and a live
// lease it ended is released (and its waiters woken).
func (s *Server) afterMessageDeleted(res *queue.DeleteResult, pid, txid string) {
	for _, l := range res.Leases {
		s.deliveries.settle(deliveryKey{l.LeaseID, pid, txid})
		switch {
		case l.Released && l.Pending:
			s.afterRelease(poller.SourceAck, res.Queue, res.Partition, pid, l.Group)
		case l.Released:
			s.poller.LeaseReleased(res.Queue, res.Partition, pid, l.Group)
		}
	}
}
