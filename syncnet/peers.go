package syncnet

import (
	"net"
	"net/netip"
	"time"
)

type peer struct {
	name string
	addr *net.UDPAddr
	id   string // learned from its datagrams, or the database's
	// member: the database lists it (members.go): no heartbeats, its
	// presence by digest; since is when it became one, lastPull when its
	// presence was last asked for, digest what it last wrote.
	member   bool
	since    time.Time
	lastPull time.Time
	digest   uint64
}

type peerState struct {
	session   string
	since     time.Time // first heartbeat of this session
	lastBeat  time.Time
	presence  map[string]time.Time // queue → last announce
	announced bool                 // presence known: a full announce interval since it (re)started, or (member) its digest agreed
	// Members only: view is the digest of presence, mismatch since when
	// it differs from the member's, pending the parts of a PRESENCE_SET.
	member        bool
	view          uint64
	mismatch      time.Time
	pending       map[uint64][]string
	pendingDigest uint64
}

// addPresence and delPresence keep view the digest of presence.
func (st *peerState) addPresence(q string, now time.Time) {
	if _, ok := st.presence[q]; !ok {
		st.view ^= queueHash(q)
	}
	st.presence[q] = now
}

func (st *peerState) delPresence(q string) {
	if _, ok := st.presence[q]; ok {
		st.view ^= queueHash(q)
		delete(st.presence, q)
	}
}

// SetPeers replaces the peer list (host:port) and resolves it.
func (n *Node) SetPeers(peers []string) {
	n.mu.Lock()
	n.cfg.Peers = peers
	n.mu.Unlock()
	n.resolve()
	n.kick()
}

// resolve looks the peers up again (names move).
func (n *Node) resolve() {
	n.mu.Lock()
	names := append([]string(nil), n.cfg.Peers...)
	old := map[string]*peer{}
	for _, p := range n.seeds {
		old[p.name] = p
	}
	n.mu.Unlock()
	var peers []*peer
	var added []*net.UDPAddr
	for _, name := range names {
		addr, err := net.ResolveUDPAddr("udp4", name)
		if err != nil {
			n.log.Warn().Err(err).Str("peer", name).Msg("resolving a peer")
			continue
		}
		p := &peer{name: name, addr: addr}
		if o := old[name]; o != nil && o.addr.String() == addr.String() {
			p = o
		} else {
			added = append(added, addr)
		}
		peers = append(peers, p)
	}
	n.mu.Lock()
	n.seeds = peers
	n.rebuildLocked()
	closed := n.closed
	n.mu.Unlock()
	// A new peer adopts this session only from a datagram with a signed
	// ts (replay.go): greet it with a heartbeat now rather than have it
	// drop what comes before the next one. Before the first heartbeat,
	// send does it.
	if len(added) > 0 && !closed && n.beaten.Load() {
		n.heartbeatTo(added)
	}
}

// rebuildLocked makes peers and byAddr from seeds and members: a seed
// whose id is a member's is that member (its own address wins, the
// database's may not be the one to use). Called with mu.
func (n *Node) rebuildLocked() {
	peers := make([]*peer, 0, len(n.seeds)+len(n.members))
	seedIDs := map[string]bool{}
	now := time.Now()
	for _, p := range n.seeds {
		_, member := n.members[p.id]
		member = member && p.id != ""
		if member && !p.member {
			p.since = now
		}
		p.member = member
		if member {
			m := n.members[p.id]
			p.lastPull, p.digest = m.lastPull, m.digest
		}
		seedIDs[p.id] = true
		peers = append(peers, p)
	}
	for id, p := range n.members {
		if !seedIDs[id] {
			peers = append(peers, p)
		}
	}
	n.peers = peers
	clear(n.byAddr)
	for _, p := range peers {
		n.byAddr[addrKey(p.addr.AddrPort())] = p
	}
}

// addrKey is an address as byAddr keys it (IPv4 unmapped).
func addrKey(a netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(a.Addr().Unmap(), a.Port()) }

// heartbeat beats to the live seeds that are not members: the database
// tells members who is alive. None at all (the first aside, which greets)
// in a mesh of members only.
func (n *Node) heartbeat() {
	addrs := n.legacy()
	if len(addrs) == 0 && n.beaten.Load() {
		return
	}
	n.heartbeatTo(addrs)
}

// legacy are the live seeds that are not members (the reference server):
// they hear heartbeats and presence re-announcements.
func (n *Node) legacy() []*net.UDPAddr {
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	var addrs []*net.UDPAddr
	for _, p := range n.seeds {
		if !p.member && n.classify(p, "", now) != peerDead {
			addrs = append(addrs, p.addr)
		}
	}
	return addrs
}

// probe sends one heartbeat to each dead seed (every Resolve): a seed
// that comes back is heard again, one that stays away costs one datagram
// in 30 s, not one a second.
func (n *Node) probe() {
	now := time.Now()
	var addrs []*net.UDPAddr
	n.mu.Lock()
	for _, p := range n.seeds {
		if !p.member && n.classify(p, "", now) == peerDead {
			addrs = append(addrs, p.addr)
		}
	}
	n.mu.Unlock()
	if len(addrs) > 0 {
		n.heartbeatTo(addrs)
	}
}

// heartbeatTo sends a heartbeat to addrs (all live peers when nil).
func (n *Node) heartbeatTo(addrs []*net.UDPAddr) {
	if addrs == nil {
		addrs = []*net.UDPAddr{}
	}
	n.send(Heartbeat, HeartbeatPayload{Sequence: n.sent.Load(), SessionID: n.session, TS: nowMS()}, addrs)
}

// What this instance knows of a peer's consumers for a queue.
const (
	peerDead    = "dead"    // no heartbeat within DeadAfter (a seed heard, or never heard since start): it has none that matter
	peerUnknown = "unknown" // not heard long enough: it may have some
	peerPresent = "present"
	peerAbsent  = "absent"
	// peerUnreachable: a member unknown for Reach: no wake-ups (a pull is
	// retried), and not known for NOTIFY.
	peerUnreachable = "unreachable"
)

// classify tells what is known of p's consumers for queue. Called with mu.
func (n *Node) classify(p *peer, queue string, now time.Time) string {
	st := n.byID[p.id]
	switch {
	case p.member && (st == nil || !st.announced):
		// Alive (the database lists it), presence not known.
		if now.Sub(p.since) >= n.cfg.Reach {
			return peerUnreachable
		}
		return peerUnknown
	case p.member:
	case p.id == "" && now.Sub(n.started) > n.cfg.DeadAfter:
		return peerDead // a seed never heard from
	case p.id != "" && st != nil && now.Sub(st.lastBeat) > n.cfg.DeadAfter:
		return peerDead
	case p.id == "" || st == nil || !st.announced:
		return peerUnknown
	case queue == "":
		return peerAbsent // known: what it has is not asked
	}
	if queue != "" && (!st.presence[queue].IsZero() || !st.presence[AnyQueue].IsZero()) {
		return peerPresent
	}
	return peerAbsent
}

// expire marks presence complete for peers that have announced for a full
// interval, and forgets what dead peers and stale announcements said.
func (n *Node) expire() {
	n.wakes.sweep() // its own lock: nothing of the node's
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	alive := 0
	for _, st := range n.byID {
		if st.member {
			alive++ // the database's to say; it announces no re-announcements to expire
			continue
		}
		if now.Sub(st.lastBeat) > n.cfg.DeadAfter {
			st.presence = map[string]time.Time{}
			st.announced = false
			continue
		}
		alive++
		if !st.announced && now.Sub(st.since) >= n.cfg.Announce+n.cfg.Heartbeat {
			st.announced = true
		}
		for q, at := range st.presence {
			if now.Sub(at) > 3*n.cfg.Announce {
				st.delPresence(q)
			}
		}
	}
	n.m.alive.Set(float64(alive))
	n.prunePushedLocked(now)
	// A configured peer is dead when it has not been heard from within
	// DeadAfter, was never heard from, or its name does not resolve.
	dead := max(len(n.cfg.Peers)-len(n.seeds), 0)
	for _, p := range n.seeds {
		if st := n.byID[p.id]; !p.member && (p.id == "" || st == nil || now.Sub(st.lastBeat) > n.cfg.DeadAfter) {
			dead++
		}
	}
	n.m.dead.Set(float64(dead))
}
