package syncnet

import (
	"errors"
	"net"
	"net/netip"
	"time"
)

// receive reads datagrams until the socket closes.
func (n *Node) receive() {
	buf := make([]byte, MaxDatagram+1)
	for {
		k, from, err := n.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			n.mu.Lock()
			closed := n.closed
			n.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		n.handle(buf[:k], from)
	}
}

// handle verifies and applies one datagram; malformed ones are counted and
// dropped.
func (n *Node) handle(b []byte, from netip.AddrPort) {
	p, ok := n.verify(b)
	if !ok {
		return
	}
	st, now := n.heard(p, from)
	n.apply(p, st, now, from)
}

// verify decodes b and checks its sender, and its session, sequence and
// timestamp against replays.
func (n *Node) verify(b []byte) (Packet, bool) {
	p, err := Decode(b, n.key)
	if err != nil {
		n.drop(Reason(err))
		return p, false
	}
	if p.SenderID == n.cfg.ServerID {
		n.drop("self")
		return p, false
	}
	ts, stamped, err := stampOf(p)
	if err != nil {
		n.drop("payload")
		return p, false
	}
	if reason := n.replay.Check(p.SenderID, p.Session, p.Sequence, ts, stamped, n.now()); reason != "" {
		n.drop(reason)
		if reason == "stale_timestamp" {
			// A peer whose clock is off by more than the window is not
			// heard at all: say so (at most once a minute).
			n.skewLog.Warn().Str("sender", p.SenderID).Uint64("ts", ts).Dur("window", n.cfg.Freshness).
				Msg("dropping a datagram whose timestamp is outside the freshness window: a replay, or a peer's clock is off")
		}
		return p, false
	}
	n.m.receivedBy(p.Type).Inc()
	return p, true
}

// heard records that p's sender is alive (and who it is, when it came from
// a seed's address), and returns its state.
func (n *Node) heard(p Packet, from netip.AddrPort) (*peerState, time.Time) {
	now := time.Now()
	n.mu.Lock()
	var peerAddr *net.UDPAddr
	pr := n.byAddr[addrKey(from)]
	stranger := pr == nil && n.members[p.SenderID] == nil
	if pr != nil {
		if pr.id != p.SenderID && !pr.member {
			pr.id = p.SenderID // learned: datagrams from a configured peer's address
			n.rebuildLocked()  // a seed that is a member
		}
		peerAddr = pr.addr
	}
	st := n.byID[p.SenderID]
	adopted := st == nil || st.session != p.Session
	if adopted {
		// New, or restarted (Replay adopted a later session: an older
		// one never gets here): what it said before no longer holds.
		member := st != nil && st.member
		st = &peerState{session: p.Session, since: now, lastBeat: now, presence: map[string]time.Time{}, member: member}
		n.byID[p.SenderID] = st
	}
	if now.After(st.lastBeat) {
		st.lastBeat = now // any datagram says it is alive
	}
	outsider := !st.member
	n.mu.Unlock()
	if outsider {
		n.kick() // a peer outside the table: its health and presence expire by time
	}
	if stranger && n.cfg.OnStranger != nil {
		n.cfg.OnStranger()
	}
	if adopted && peerAddr != nil {
		// A peer that (re)started knows nothing of this session and drops
		// its datagrams without a ts until it hears a heartbeat: send one
		// at once. Only to a configured peer's address, once per session
		// it starts (replays adopt nothing), so it amplifies nothing.
		n.heartbeatTo([]*net.UDPAddr{peerAddr})
	}
	return st, now
}

// apply acts on a verified datagram from the peer whose state is st.
func (n *Node) apply(p Packet, st *peerState, now time.Time, from netip.AddrPort) {
	switch p.Type {
	case Heartbeat:
		n.mu.Lock()
		st.lastBeat = now
		n.mu.Unlock()
	case MessageAvailable:
		var m MessageAvailablePayload
		if Unmarshal(p.Payload, &m) == nil && m.Queue != "" {
			n.wakes.wake(m.Queue, m.Partition)
		}
	case QueueConfigDelete, QueueConfigSet, PartitionDeleted, MaintenanceModeSet, PopMaintenanceModeSet:
		n.applyNews(p)
	case LeaseHintAcquired, LeaseHintReleased:
		var m LeaseHintPayload
		if Unmarshal(p.Payload, &m) != nil || m.PartitionID == "" {
			n.drop("payload")
			return
		}
		n.hintFrom(p.Type, p.SenderID, m)
	case ConsumerRegistered, ConsumerDeregistered, PresenceSet:
		n.applyPresence(p, st, now, from)
	case PresencePull:
		n.sendPresence(net.UDPAddrFromAddrPort(from))
	}
}

// applyNews hands a peer's news of queues, partitions and maintenance to
// the callbacks.
func (n *Node) applyNews(p Packet) {
	switch p.Type {
	case QueueConfigDelete:
		var m QueueConfigDeletePayload
		if Unmarshal(p.Payload, &m) == nil && m.Queue != "" && n.cfg.OnQueueDeleted != nil {
			n.cfg.OnQueueDeleted(m.Queue)
		}
	case QueueConfigSet:
		var m QueueConfigSetPayload
		if Unmarshal(p.Payload, &m) != nil || m.Queue == "" {
			n.drop("payload")
			return
		}
		if n.cfg.OnQueueConfig != nil {
			n.cfg.OnQueueConfig(m.Queue, m.Config, m.Version)
		}
	case PartitionDeleted:
		var m PartitionDeletedPayload
		if Unmarshal(p.Payload, &m) != nil || m.Queue == "" {
			n.drop("payload")
			return
		}
		if n.cfg.OnPartitionDeleted != nil {
			n.cfg.OnPartitionDeleted(m.Queue, m.Partition)
		}
	default: // MaintenanceModeSet, PopMaintenanceModeSet
		var m MaintenancePayload
		if Unmarshal(p.Payload, &m) != nil {
			n.drop("payload")
			return
		}
		if n.cfg.OnMaintenance != nil {
			n.cfg.OnMaintenance(p.Type == PopMaintenanceModeSet, m.Enabled)
		}
	}
}

// applyPresence records what a peer says of its consumers, and answers
// consumers new to this instance for a queue it woke lately (answer.go).
func (n *Node) applyPresence(p Packet, st *peerState, now time.Time, from netip.AddrPort) {
	var missed []string
	if p.Type == PresenceSet {
		var m presenceSetPayload
		if Unmarshal(p.Payload, &m) != nil || m.Parts > 1024 || m.Part >= max(m.Parts, 1) {
			n.drop("payload")
			return
		}
		n.mu.Lock()
		missed = n.missedLocked(st.presenceFrom(m), now)
		n.mu.Unlock()
		n.answer(missed, from)
		return
	}
	var m presencePayload
	if Unmarshal(p.Payload, &m) != nil || m.Queue == "" {
		n.drop("payload")
		return
	}
	n.mu.Lock()
	if p.Type == ConsumerRegistered {
		if st.presence[m.Queue].IsZero() && st.presence[AnyQueue].IsZero() { // else woken already
			missed = n.missedLocked([]string{m.Queue}, now)
		}
		st.addPresence(m.Queue, now)
	} else {
		st.delPresence(m.Queue)
	}
	n.mu.Unlock()
	n.answer(missed, from)
}
