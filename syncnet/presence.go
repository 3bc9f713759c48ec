package syncnet

import (
	"net"
	"time"
)

// presencePayload is CONSUMER_REGISTERED and CONSUMER_DEREGISTERED.
type presencePayload struct {
	Queue string `msgpack:"queue"`
	TS    uint64 `msgpack:"ts"`
}

// announce re-sends every local presence to the seeds that are not
// members, so that a lost packet heals; members compare digests instead
// (members.go).
func (n *Node) announce() {
	addrs := n.legacy()
	if len(addrs) == 0 {
		return
	}
	defer n.lockSend(ConsumerRegistered)() // a deregistration decided meanwhile goes after
	n.mu.Lock()
	queues := n.announcedLocked()
	n.mu.Unlock()
	for _, q := range queues {
		n.sendLocked(ConsumerRegistered, presencePayload{Queue: q, TS: nowMS()}, addrs)
	}
}

// AnyQueue stands for consumers that may take from any queue (namespace
// and task subscriptions).
const AnyQueue = "*"

// SetLocal records that this instance gained (present) or lost a waiting
// consumer on queue ("" or AnyQueue: any queue): the first announces
// CONSUMER_REGISTERED; the last, once no other came for Linger,
// CONSUMER_DEREGISTERED. It reports whether the peers learn something new
// (a registration they did not know of): until it arrives they may not wake
// this instance. poller.Config's OnPresence.
func (n *Node) SetLocal(queue string, present bool) (news bool) {
	if queue == "" {
		queue = AnyQueue
	}
	n.mu.Lock()
	c := n.local[queue]
	switch {
	case present:
		n.local[queue] = c + 1
		if c == 0 {
			_, lingered := n.lingering[queue]
			delete(n.lingering, queue)
			news = !lingered
		}
	case c <= 1:
		delete(n.local, queue)
		if c == 1 {
			n.lingering[queue] = time.Now()
			defer n.kick() // its CONSUMER_DEREGISTERED is due after Linger
		}
	default:
		n.local[queue] = c - 1
	}
	n.mu.Unlock()
	if news {
		n.send(ConsumerRegistered, presencePayload{Queue: queue, TS: nowMS()}, nil)
	}
	return news
}

// deregister announces CONSUMER_DEREGISTERED for the queues whose last
// consumer left more than Linger ago. Decided and sent under wmu: a
// consumer that comes meanwhile is announced after (sendLocked).
func (n *Node) deregister() {
	n.mu.Lock()
	idle := len(n.lingering) == 0
	n.mu.Unlock()
	if idle {
		return
	}
	defer n.lockSend(ConsumerDeregistered)()
	now := time.Now()
	var gone []string
	n.mu.Lock()
	for q, since := range n.lingering {
		if now.Sub(since) >= n.cfg.Linger {
			delete(n.lingering, q)
			gone = append(gone, q)
		}
	}
	n.mu.Unlock()
	for _, q := range gone {
		n.sendLocked(ConsumerDeregistered, presencePayload{Queue: q, TS: nowMS()}, nil)
	}
}

// HasSubscribers reports whether any live peer has subscribers for queue;
// known is false while some live peer's presence is not known yet.
func (n *Node) HasSubscribers(queue string) (has, known bool) {
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.local[queue] > 0 || n.local[AnyQueue] > 0 {
		return true, true
	}
	known = true
	for _, p := range n.peers {
		switch n.classify(p, queue, now) {
		case peerPresent:
			return true, true
		case peerUnknown, peerUnreachable:
			known = false
		}
	}
	return false, known
}

// targets are the addresses of the peers that may have consumers of queue
// (present, or presence not known yet), out of all peers; each peer's
// classification goes to observe when it is not nil. A wake-up (a push, a
// release) is remembered, so that a peer heard of later is answered
// (answer.go).
func (n *Node) targets(queue string, wake bool, observe func(decision string)) (targets []*net.UDPAddr, all int) {
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	if wake {
		n.pushedLocked(queue, now)
	}
	for _, p := range n.peers {
		c := n.classify(p, queue, now)
		if observe != nil {
			observe(c)
		}
		if c == peerUnknown || c == peerPresent {
			targets = append(targets, p.addr)
		}
	}
	return targets, len(n.peers)
}
