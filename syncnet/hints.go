package syncnet

import (
	"math/rand/v2"
	"time"
)

// Lease hints (seed tier 4): which instance holds the lease of a
// (partition, group). A hint lets a poller skip a pop that would come back
// empty; it never decides anything. It lives for a fifth of the lease's
// time, is ignored once its holder is dead (a member that left the
// table, a seed silent for DeadAfter), and 1 lookup in
// HintAuditRatio ignores it and asks the database, which both heals a wrong
// hint and measures how often hints are right.

// Lease hint defaults.
const (
	LeaseHintsMax  = 10000
	HintAuditRatio = 100 // 1%
)

type hintKey struct{ partitionID, group string }

type leaseHint struct {
	holder string // sender id
	until  time.Time
}

// LeaseAcquired tells the peers that may have consumers of queue that this
// instance leased (partition, group) until expires.
func (n *Node) LeaseAcquired(queue, partition, partitionID, group string, expires time.Time) {
	// Whatever a peer said, the database gave it to us.
	n.hints.Remove(hintKey{partitionID, group})
	ms := uint64(expires.UnixMilli()) // #nosec G115 -- after 1970
	n.sendHint(LeaseHintAcquired, LeaseHintPayload{ConsumerGroup: group, ExpiresAtMS: ms,
		Partition: partition, PartitionID: partitionID, Queue: queue, ServerID: n.cfg.ServerID})
}

// LeaseReleased tells the same peers that the lease ended: their consumers
// of that partition are woken.
func (n *Node) LeaseReleased(queue, partition, partitionID, group string) {
	n.sendHint(LeaseHintReleased, LeaseHintPayload{ConsumerGroup: group, Partition: partition,
		PartitionID: partitionID, Queue: queue, ServerID: n.cfg.ServerID})
}

func (n *Node) sendHint(t Type, p LeaseHintPayload) {
	if targets, _ := n.targets(p.Queue, t == LeaseHintReleased, nil); len(targets) > 0 {
		n.send(t, p, targets)
	}
}

// LeasedElsewhere reports what the hints say of (partition, group): a
// non-zero until means another live instance holds its lease until then
// (skip it, look again by then); audit means a hint said so but this lookup
// ignores it: try the database and report with HintAudited.
func (n *Node) LeasedElsewhere(partitionID, group string) (until time.Time, audit bool) {
	h, ok := n.hints.Get(hintKey{partitionID, group})
	if !ok {
		return time.Time{}, false
	}
	now := time.Now()
	if !now.Before(h.until) {
		n.hints.Remove(hintKey{partitionID, group})
		return time.Time{}, false
	}
	n.mu.Lock()
	st := n.byID[h.holder]
	// A member is alive while the database lists it (members send no
	// heartbeats); a seed while it is heard.
	alive := st != nil && (st.member || now.Sub(st.lastBeat) <= n.cfg.DeadAfter)
	n.mu.Unlock()
	if !alive {
		n.hint("holder_dead")
		return time.Time{}, false
	}
	if rand.IntN(HintAuditRatio) == 0 { // #nosec G404 -- sampling, not security
		n.hint("audit")
		return time.Time{}, true
	}
	n.hint("used")
	return h.until, false
}

// HintAudited reports an audited hint's outcome: right when the database
// found the partition leased (nothing to pop).
func (n *Node) HintAudited(right bool) {
	if right {
		n.hint("right")
	} else {
		n.hint("wrong")
	}
}

// hintFrom applies a peer's lease hint.
func (n *Node) hintFrom(t Type, sender string, p LeaseHintPayload) {
	k := hintKey{p.PartitionID, p.ConsumerGroup}
	if t == LeaseHintReleased {
		n.hints.Remove(k)
		if p.Queue != "" {
			n.wakes.wake(p.Queue, p.Partition)
		}
		return
	}
	now := time.Now()
	expires := time.UnixMilli(int64(p.ExpiresAtMS)) // #nosec G115 -- a timestamp
	if !expires.After(now) {
		return
	}
	n.hints.Add(k, leaseHint{holder: sender, until: now.Add(expires.Sub(now) / 5)})
}

// hint counts a lease hint lookup's outcome.
func (n *Node) hint(outcome string) {
	n.m.hints.WithLabelValues(outcome).Inc()
	n.count("hint:" + outcome)
}
