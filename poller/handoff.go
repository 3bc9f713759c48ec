package poller

import (
	"context"

	"github.com/heraldmq/herald/queue"
)

// The hand-off (queue.HandOff): a push on this instance leases its
// messages to the intentions waiting for them in its own transaction, so a
// consumer kept up to date gets each message when the push commits, with
// no wake-up, pre-flight or pop. Reserve picks the intentions a fast-path
// cycle would pick (one per group, naming the partition first, then the
// oldest) and holds their credit; the database leases only to a group whose
// row is caught up, so order and lease safety are the database's as for
// any pop. Settle delivers what was leased and gives the rest of the
// credit back. A group handed a partition is not assigned it again by the
// push's own wake-up (keyState.handed).

// reservation is a queue.Reservation's token.
type reservation struct {
	w                *worker
	in               *Intention
	key, partitionID string
	limit            int
}

// Reserve implements queue.HandOff.
func (p *Poller) Reserve(parts []queue.PushedPartition) []queue.Reservation {
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
		groups := map[string]bool{}
		for _, specific := range []bool{true, false} {
			for _, in := range ks.intentions {
				if in.gone || in.AutoAck || groups[in.Target.Group] || !in.ready() {
					continue
				}
				if specific != (in.Target.Partition != "") || (specific && in.Target.Partition != pp.Partition) {
					continue
				}
				limit := min(in.Batch, in.free(), pp.Messages)
				if !in.Standing {
					// A long-poll answers once: the push takes all of it.
					limit = min(in.Batch, pp.Messages)
					in.reserved = in.credit
				} else {
					in.reserved += limit
				}
				groups[in.Target.Group] = true
				out = append(out, queue.Reservation{PartitionID: pp.PartitionID, Group: in.Target.Group, LeaseID: queue.NewID(),
					Limit: limit, Token: &reservation{w: w, in: in, key: key, partitionID: pp.PartitionID, limit: limit}})
			}
		}
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
	w, in := t.w, t.in
	w.mu.Lock()
	if in.Standing {
		in.reserved -= t.limit
	} else {
		in.reserved = 0
	}
	if res != nil {
		w.partitionIDs.Add(res.Queue+"\x00"+res.Partition, t.partitionID)
		if ks := w.keys[t.key]; ks != nil {
			if ks.handed == nil {
				ks.handed = map[string]bool{}
			}
			ks.handed[t.partitionID+"\x00"+r.Group] = true
		}
	}
	w.mu.Unlock()
	if res == nil {
		return
	}
	p.metrics.handoffs.Inc()
	w.deliver(context.Background(), in, res, true)
}
