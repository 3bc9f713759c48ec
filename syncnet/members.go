package syncnet

import (
	"hash/fnv"
	"net"
	"slices"
	"time"
)

// Members: the Herald instances the database lists (internal/server reads
// them every MemberRead and hands them to SetMembers). What a member says
// of its consumers costs nothing while it does not change:
//
//   - No heartbeats: the database says who is alive. A member leaves the
//     peers the moment the list no longer has it (deleted on shutdown,
//     or its last-seen older than the bound).
//   - Its presence changes arrive as before (CONSUMER_REGISTERED and
//     _DEREGISTERED, one datagram per change), but are not re-announced:
//     each member writes the digest of what it announces (Digest, the XOR
//     of a 64-bit hash per queue) with its last-seen; the reader compares
//     it with the digest of what it heard. They agree: presence known, no
//     datagram. They disagree two reads in a row with the same digest (the
//     member's set stood still while this view differs), or at first
//     sight: PRESENCE_PULL, answered by PRESENCE_SET, the whole set in as
//     few datagrams as it fits (many queues per datagram).
//   - A member whose presence is not known after Reach (never answered a
//     pull, or its digest stays different) is "unreachable": it gets no
//     wake-ups (it does not hear us, or we not it; a pull is retried every
//     Reach) and counts as not known, so NOTIFY, its only fast wake-up,
//     is not skipped for it (internal/server).

// ReachDefault is how long a member may stay unknown before it counts as
// unreachable.
const ReachDefault = 10 * time.Second

// Member is an instance the database lists as alive.
type Member struct {
	ID      string // its ServerID
	Addr    string // host:port its datagrams reach (its advertised address)
	Session string // as its datagrams' header carries it: Node.Session
	Digest  uint64 // its presence digest, as it last wrote it
}

// presenceSetPayload is PRESENCE_SET: part Part (from 0) of Parts of the
// sender's whole presence, whose digest is Digest.
type presenceSetPayload struct {
	Digest uint64   `msgpack:"digest"`
	Part   uint64   `msgpack:"part"`
	Parts  uint64   `msgpack:"parts"`
	Queues []string `msgpack:"queues"`
	TS     uint64   `msgpack:"ts"`
}

// pullPayload is PRESENCE_PULL: send me your PRESENCE_SET.
type pullPayload struct {
	TS uint64 `msgpack:"ts"`
}

// queueHash is one queue's share of a digest.
func queueHash(q string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(q))
	return h.Sum64()
}

// ServerID is this node's id on the mesh.
func (n *Node) ServerID() string { return n.cfg.ServerID }

// Session is this node's session as the header carries it (a member
// writes it in the database: a new one there means it restarted).
func (n *Node) Session() string { return n.session[:maxSession] }

// announcedLocked is what the peers are told this instance consumes:
// the queues with local consumers and those still lingering. Called with
// mu.
func (n *Node) announcedLocked() []string {
	qs := make([]string, 0, len(n.local)+len(n.lingering))
	for q := range n.local {
		qs = append(qs, q)
	}
	for q := range n.lingering {
		if n.local[q] == 0 {
			qs = append(qs, q)
		}
	}
	slices.Sort(qs)
	return qs
}

// Digest is the digest of what this instance announces, for its row in
// the database.
func (n *Node) Digest() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	var d uint64
	for _, q := range n.announcedLocked() {
		d ^= queueHash(q)
	}
	return d
}

// SetMembers replaces the members: those it lists (other than this
// instance) are peers, the others leave at once. A new or restarted member
// is asked for its presence; a known one only when its digest differs.
func (n *Node) SetMembers(ms []Member) {
	type resolved struct {
		m    Member
		addr *net.UDPAddr
	}
	var rs []resolved
	for _, m := range ms {
		if m.ID == n.cfg.ServerID || m.Addr == "" {
			continue
		}
		a, err := net.ResolveUDPAddr("udp4", m.Addr)
		if err != nil {
			n.log.Warn().Err(err).Str("member", m.ID).Str("addr", m.Addr).Msg("resolving a member's syncnet address")
			continue
		}
		rs = append(rs, resolved{m, a})
	}
	now := time.Now()
	var pull, greet []*net.UDPAddr
	n.mu.Lock()
	seen := make(map[string]bool, len(rs))
	for _, r := range rs {
		seen[r.m.ID] = true
		p := n.members[r.m.ID]
		if p == nil || p.addr.String() != r.addr.String() {
			p = &peer{name: r.m.Addr, addr: r.addr, id: r.m.ID, member: true, since: now}
			n.members[r.m.ID] = p
		}
		st := n.byID[r.m.ID]
		if st == nil || st.session != r.m.Session {
			// New, or restarted: what it said before no longer holds.
			st = &peerState{session: r.m.Session, since: now, presence: map[string]time.Time{}}
			n.byID[r.m.ID] = st
			p.since, p.lastPull = now, time.Time{}
			greet = append(greet, p.addr) // it adopts this session from a datagram with a ts
		}
		st.member, st.lastBeat = true, now // alive: the database says so
		switch {
		case st.view == r.m.Digest:
			st.announced, st.mismatch = true, time.Time{}
		case st.mismatch.IsZero():
			st.mismatch = now
		case now.Sub(st.mismatch) >= n.cfg.Reach:
			st.announced = false // it answers no pull: unknown, then unreachable
		}
		stable := r.m.Digest == p.digest
		p.digest = r.m.Digest
		if st.view != r.m.Digest && (p.lastPull.IsZero() || stable && now.Sub(p.lastPull) >= n.cfg.MemberRead ||
			now.Sub(p.lastPull) >= n.cfg.Reach) {
			p.lastPull = now
			pull = append(pull, p.addr)
		}
	}
	for id := range n.members {
		if !seen[id] {
			gone := n.members[id]
			delete(n.members, id)
			delete(n.byID, id) // its lease hints are ignored: no state, not alive
			if n.seedOfLocked(id, gone.addr) {
				// Also a seed: dead (no heartbeat since the zero time),
				// not unknown, which would get every wake-up until
				// DeadAfter passed again. A heartbeat of its next life
				// makes it alive.
				n.byID[id] = &peerState{presence: map[string]time.Time{}}
			}
		}
	}
	n.rebuildLocked()
	n.mu.Unlock()
	n.expire() // the gauges: Run looks only every Resolve while idle
	if len(greet) > 0 {
		n.heartbeatTo(greet)
	}
	for _, a := range pull {
		n.send(PresencePull, pullPayload{TS: nowMS()}, []*net.UDPAddr{a})
	}
}

// Known reports whether the presence of the member id is known: a wake-up
// from this node reaches it whenever it has consumers. False for an
// unknown or unreachable member, and for one not on the list.
func (n *Node) Known(id string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.members[id]
	if p == nil {
		for _, s := range n.seeds {
			if s.id == id && s.member {
				p = s
			}
		}
	}
	if p == nil {
		return false
	}
	c := n.classify(p, "", time.Now())
	return c == peerAbsent || c == peerPresent
}

// sendPresence answers a pull: the whole announced set, as many queues per
// datagram as fit. Taken and sent under wmu: a consumer registered
// meanwhile is announced after the set, which would otherwise undo it.
func (n *Node) sendPresence(to *net.UDPAddr) {
	defer n.lockSend(PresenceSet)()
	n.mu.Lock()
	qs := n.announcedLocked()
	n.mu.Unlock()
	var d uint64
	for _, q := range qs {
		d ^= queueHash(q)
	}
	// A datagram's payload holds 1,308 bytes: the fixed keys take about
	// 60, each name its length and up to 3.
	var parts [][]string
	cur, size := []string{}, 0
	for _, q := range qs {
		if k := len(q) + 3; size+k > MaxPayload-80 && len(cur) > 0 {
			parts, cur, size = append(parts, cur), []string{}, 0
		}
		cur, size = append(cur, q), size+len(q)+3
	}
	parts = append(parts, cur)
	for i, part := range parts {
		n.sendLocked(PresenceSet, presenceSetPayload{Digest: d, Part: uint64(i), Parts: uint64(len(parts)), Queues: part, TS: nowMS()},
			[]*net.UDPAddr{to})
	}
}

// presenceFrom applies a PRESENCE_SET part, and returns the queues it
// adds to what was heard. Called with mu.
func (st *peerState) presenceFrom(m presenceSetPayload) (added []string) {
	if m.Parts > 1 {
		if st.pending == nil || st.pendingDigest != m.Digest {
			st.pending, st.pendingDigest = map[uint64][]string{}, m.Digest
		}
		st.pending[m.Part] = m.Queues
		if uint64(len(st.pending)) < m.Parts {
			return nil
		}
		m.Queues = nil
		for i := range m.Parts {
			m.Queues = append(m.Queues, st.pending[i]...)
		}
		st.pending = nil
	}
	now := time.Now()
	old := st.presence
	st.presence, st.view = make(map[string]time.Time, len(m.Queues)), 0
	for _, q := range m.Queues {
		if _, dup := st.presence[q]; !dup {
			st.presence[q] = now
			st.view ^= queueHash(q)
			if old[q].IsZero() {
				added = append(added, q)
			}
		}
	}
	if st.view == m.Digest {
		st.announced, st.mismatch = true, time.Time{}
	}
	return added
}

// seedOfLocked reports whether a seed is the member id (heard as id, or
// at its address), naming the seed id if it was not yet. Called with mu.
func (n *Node) seedOfLocked(id string, addr *net.UDPAddr) bool {
	for _, p := range n.seeds {
		if p.id == id || p.id == "" && p.addr.String() == addr.String() {
			p.id = id
			return true
		}
	}
	return false
}
