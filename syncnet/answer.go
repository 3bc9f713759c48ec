package syncnet

import (
	"net"
	"net/netip"
	"slices"
	"time"
)

// A push chooses the peers it wakes by what this instance knows of their
// consumers at that moment. A peer's first consumer of a queue looks at
// the queue when it arrives and again a little later (poller.Config's
// PresenceGrace), but its CONSUMER_REGISTERED may reach us after we chose
// (a loaded machine, a lost datagram healed by a re-announcement or a
// pull): a push committed after the peer's last look, and woken before we
// heard of it, would then wait for the peer's sweep. So this instance
// remembers the queues it announced a wake-up for (a push, a lease
// release) for pushRecall, and answers a peer whose presence for such a
// queue is new to it with a MESSAGE_AVAILABLE for the whole queue, to that
// peer alone. Either we knew of the consumer when we pushed (woken then) or
// we hear of it after the push (woken by the answer): no timing loses the
// wake-up while the push is within pushRecall.

// pushRecall is how long a queue's wake-up is remembered: as long as a
// member may stay unknown before it counts as unreachable (ReachDefault),
// the longest a peer's presence may reach us late while we still wake it.
const pushRecall = 10 * time.Second

// pushedMax bounds the queues remembered; past it, every new presence is
// answered until pushRecall has passed (pushedOver), which costs a
// datagram, never a wake-up.
const pushedMax = 4096

// decisionAnswered counts an answer among the notify decisions: a peer
// woken because its presence was heard of after a wake-up of the queue.
const decisionAnswered = "answered"

// answerQueuesMax bounds the answers to one presence for any queue
// (AnyQueue: namespace and task subscriptions), the most recent first.
const answerQueuesMax = 32

// pushedLocked remembers that queue's wake-up was announced now. Called
// with mu.
func (n *Node) pushedLocked(queue string, now time.Time) {
	if _, ok := n.pushed[queue]; !ok && len(n.pushed) >= pushedMax {
		if now.Sub(n.prunedAt) >= time.Second { // at most one walk a second
			n.prunedAt = now
			n.prunePushedLocked(now)
		}
		if len(n.pushed) >= pushedMax {
			n.pushedOver = now
			return
		}
	}
	n.pushed[queue] = now
}

// prunePushedLocked forgets the wake-ups older than pushRecall. Called
// with mu.
func (n *Node) prunePushedLocked(now time.Time) {
	for q, at := range n.pushed {
		if now.Sub(at) > pushRecall {
			delete(n.pushed, q)
		}
	}
}

// missedLocked are the queues of added (a peer's presence new to this
// instance) that had a wake-up within pushRecall: the peer may have
// missed it. Called with mu.
func (n *Node) missedLocked(added []string, now time.Time) []string {
	recent := func(at time.Time) bool { return !at.IsZero() && now.Sub(at) <= pushRecall }
	over := recent(n.pushedOver)
	var missed []string
	for _, q := range added {
		if q != AnyQueue {
			if over || recent(n.pushed[q]) {
				missed = append(missed, q)
			}
			continue
		}
		// A consumer of any queue: each queue woken lately, newest first.
		type woken struct {
			q  string
			at time.Time
		}
		var all []woken
		for q, at := range n.pushed {
			if recent(at) {
				all = append(all, woken{q, at})
			}
		}
		slices.SortFunc(all, func(a, b woken) int { return b.at.Compare(a.at) })
		for _, w := range all[:min(len(all), answerQueuesMax)] {
			missed = append(missed, w.q)
		}
	}
	return missed
}

// answer wakes a peer, at from, for the queues it may have missed.
func (n *Node) answer(missed []string, from netip.AddrPort) {
	if len(missed) == 0 {
		return
	}
	slices.Sort(missed)
	to := []*net.UDPAddr{net.UDPAddrFromAddrPort(from)}
	for _, q := range slices.Compact(missed) {
		n.decide(decisionAnswered)
		n.send(MessageAvailable, MessageAvailablePayload{Queue: q, TS: nowMS()}, to)
	}
}
