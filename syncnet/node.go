package syncnet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Waker is what MESSAGE_AVAILABLE wakes; *poller.Poller is one.
type Waker interface {
	Wake(source, queue, partition string)
}

// WakerFunc adapts a function to Waker (a node is made before the poller
// it wakes, which needs the node for its presence and lease hints).
type WakerFunc func(source, queue, partition string)

// Wake calls f.
func (f WakerFunc) Wake(source, queue, partition string) { f(source, queue, partition) }

// SourceSync labels wake-ups from syncnet (herald_wakeups_total{source}).
const SourceSync = "syncnet"

// Defaults of Config fields.
const (
	HeartbeatDefault  = time.Second
	DeadAfterDefault  = 5 * time.Second
	AnnounceDefault   = 2 * time.Second
	LingerDefault     = time.Second
	ResolveDefault    = 30 * time.Second
	RecvBufferBytes   = 8 << 20
	FreshnessDefault  = 30 * time.Second
	WakeWindowDefault = 5 * time.Millisecond
	MemberReadDefault = 2 * time.Second
)

// Config configures a Node.
type Config struct {
	// Bind is the UDP address to listen on, e.g. ":6633".
	Bind string
	// Peers are seeds: other instances, host:port, heard from over
	// syncnet whether or not the database lists them (the reference
	// server, or a network where the advertised address is not the one to
	// use); names are re-resolved every Resolve. The Herald instances the
	// database lists come through SetMembers.
	Peers []string
	// Secret keys the HMAC (its ASCII bytes). Required with peers.
	Secret string
	// ServerID names this instance in every datagram (hostname:port).
	ServerID string
	// Waker receives MESSAGE_AVAILABLE. Required.
	Waker Waker
	// Heartbeat, DeadAfter, Announce (presence re-announce, anti-entropy),
	// Linger (how long after its last consumer left a queue is still
	// announced) and Resolve; zero means the defaults.
	Heartbeat, DeadAfter, Announce, Linger, Resolve time.Duration
	// Freshness is how far a datagram's signed ts may be from this
	// instance's clock, either way, before it is dropped as a replay
	// (replay.go); it must exceed the clock skew between instances. Zero
	// means FreshnessDefault, 30 s.
	Freshness time.Duration
	// WakeWindow: at most one wake-up from the network per queue per this
	// window reaches the Waker (wake.go). Zero means WakeWindowDefault,
	// 5 ms.
	WakeWindow time.Duration
	// Reach is how long a member may stay unknown (no answer to a
	// presence pull) before it counts as unreachable; zero means
	// ReachDefault, 10 s. MemberRead is how often SetMembers is called
	// (the least time between two pulls of a member whose digest stays
	// different); zero means MemberReadDefault, 2 s.
	Reach, MemberRead time.Duration
	// OnQueueDeleted, when set, is told that another instance deleted a
	// queue (QUEUE_CONFIG_DELETE): drop what is cached of it.
	OnQueueDeleted func(queue string)
	// OnQueueConfig, when set, is told that another instance configured a
	// queue (QUEUE_CONFIG_SET).
	OnQueueConfig func(queue string, c QueueConfig, version uint64)
	// OnPartitionDeleted, when set, is told that another instance deleted a
	// partition (PARTITION_DELETED): drop its cached id.
	OnPartitionDeleted func(queue, partition string)
	// OnMaintenance, when set, is told that another instance switched a
	// maintenance mode (MAINTENANCE_MODE_SET, or POP_MAINTENANCE_MODE_SET
	// when pop): read the switches again from the database, which alone
	// says what holds. Called on the receive goroutine; it must not block.
	OnMaintenance func(pop, enabled bool)
	// OnStranger, when set, is told that a datagram came from a sender
	// that is no peer (a member that just started greets every member it
	// read): read the members again. Called on the receive goroutine; it
	// must not block.
	OnStranger func()
	// Drop, when set, is asked before each send; true drops the datagram
	// (tests of a lossy network, or of a lost announcement).
	Drop func(t Type) bool
	// Registerer receives the metrics; nil registers nowhere.
	Registerer prometheus.Registerer
	// Logger; the zero value logs nothing.
	Logger zerolog.Logger
}

// Node is one instance on the mesh: it sends and receives datagrams, keeps
// peers' health and presence, and targets wake-ups at the peers that have
// subscribers. Everything it knows is advisory.
type Node struct {
	cfg     Config
	key     []byte
	conn    *net.UDPConn
	session string // 16 hex characters; the header carries 15
	seq     atomic.Uint64
	sent    atomic.Uint64
	// wokeUp counts Run's timer firings (tests of an idle node's cost).
	wokeUp atomic.Uint64
	// beaten: a heartbeat was sent. Peers adopt a session only by a
	// datagram with a signed ts (replay.go), so one goes first.
	beaten atomic.Bool
	replay *Replay
	wakes  *wakeLimiter
	// now is the wall clock datagram timestamps are checked against
	// (time.Now; tests move it).
	now   func() time.Time
	hints *lru.Cache[hintKey, leaseHint]
	// recvBuffer is the receive buffer the kernel granted (-1: unknown).
	recvBuffer int
	log        zerolog.Logger
	skewLog    zerolog.Logger // log, at most once a minute
	m          *nodeMetrics

	cmu    sync.Mutex
	counts map[string]uint64 // "dropped:<reason>", "notify:<decision>", …: for Stats

	mu sync.Mutex
	// peers are seeds and members together (a member that is also a
	// seed, by the id its datagrams carry, once); byAddr finds one by the
	// address a datagram comes from.
	peers   []*peer
	seeds   []*peer
	members map[string]*peer
	byAddr  map[netip.AddrPort]*peer
	started time.Time
	byID    map[string]*peerState
	local   map[string]int // queue → local intentions
	// lingering: queues whose last local consumer left at that time; the
	// peers still believe them present until Linger has passed (a
	// long-poll consumer that polls again meanwhile costs no datagram).
	lingering map[string]time.Time
	closed    bool
	// busy kicks Run's timer: Heartbeat duties are due (needsBeat).
	busy chan struct{}
}

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

// New binds the socket; nothing is sent until Run.
func New(cfg Config) (*Node, error) {
	switch {
	case cfg.Waker == nil:
		return nil, errors.New("syncnet: Config.Waker is required")
	case len(cfg.Peers) > 0 && cfg.Secret == "":
		return nil, errors.New("syncnet: a secret is required when peers are set")
	case cfg.ServerID == "":
		return nil, errors.New("syncnet: Config.ServerID is required")
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = HeartbeatDefault
	}
	if cfg.DeadAfter == 0 {
		cfg.DeadAfter = DeadAfterDefault
	}
	if cfg.Announce == 0 {
		cfg.Announce = AnnounceDefault
	}
	if cfg.Resolve == 0 {
		cfg.Resolve = ResolveDefault
	}
	if cfg.Linger == 0 {
		cfg.Linger = LingerDefault
	}
	if cfg.Freshness <= 0 {
		cfg.Freshness = FreshnessDefault
	}
	if cfg.WakeWindow <= 0 {
		cfg.WakeWindow = WakeWindowDefault
	}
	if cfg.Reach <= 0 {
		cfg.Reach = ReachDefault
	}
	if cfg.MemberRead <= 0 {
		cfg.MemberRead = MemberReadDefault
	}
	addr, err := net.ResolveUDPAddr("udp", cfg.Bind)
	if err != nil {
		return nil, fmt.Errorf("syncnet: bind address %q: %w", cfg.Bind, err)
	}
	conn, err := net.ListenUDP("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("syncnet: listening on %s: %w", cfg.Bind, err)
	}
	log := cfg.Logger.With().Str("component", "syncnet").Logger()
	// The kernel caps the buffer silently (net.core.rmem_max): read back
	// what it granted.
	if err := conn.SetReadBuffer(RecvBufferBytes); err != nil {
		log.Warn().Err(err).Msg("the kernel refused an 8 MB receive buffer")
	}
	granted := readBuffer(conn)
	if got := granted; got >= 0 && got < RecvBufferBytes {
		log.Warn().Int("granted", got).Int("asked", RecvBufferBytes).
			Msg("the kernel capped the UDP receive buffer (raise net.core.rmem_max); bursts may drop datagrams")
	}
	var sess [8]byte
	_, _ = rand.Read(sess[:])
	n := &Node{cfg: cfg, key: []byte(cfg.Secret), conn: conn, session: hex.EncodeToString(sess[:]),
		replay: NewReplay(cfg.Freshness), wakes: newWakeLimiter(cfg.Waker, cfg.WakeWindow), now: time.Now, log: log, recvBuffer: granted, byID: map[string]*peerState{}, members: map[string]*peer{}, byAddr: map[netip.AddrPort]*peer{}, started: time.Now(), local: map[string]int{}, lingering: map[string]time.Time{}, busy: make(chan struct{}, 1),
		counts: map[string]uint64{}}
	n.skewLog = log.Sample(&zerolog.BurstSampler{Burst: 1, Period: time.Minute})
	n.wakes.onAdd = n.kick
	n.hints, err = lru.New[hintKey, leaseHint](LeaseHintsMax)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	n.m, err = newNodeMetrics(cfg.Registerer)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	n.resolve()
	return n, nil
}

// Addr is the bound address.
func (n *Node) Addr() *net.UDPAddr { return n.conn.LocalAddr().(*net.UDPAddr) }

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

// Close closes the socket of a node whose Run never ran (New binds it);
// Run closes it itself when it returns.
func (n *Node) Close() error {
	n.mu.Lock()
	n.closed = true
	n.mu.Unlock()
	if err := n.conn.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("closing the syncnet socket: %w", err)
	}
	return nil
}

// Run sends heartbeats and presence and receives until ctx ends; then it
// closes the socket.
//
// One timer drives the periodic duties. Every Heartbeat while there is
// something to keep (needsBeat: seeds that are not members, a peer heard
// outside the table, a queue lingering, wake-ups to forget); otherwise
// every Resolve only: an idle member of a mesh found through the table
// has nothing to do in between (its peers' health and presence come from
// the table), and each wake-up of an idle process costs the Go runtime's
// scheduler and sysmon more than the duty itself (at 100 instances, a 1 s
// tick was a tenth of the mesh's idle CPU). Whatever makes duties due
// again kicks the timer (n.busy).
func (n *Node) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(n.receive)
	timer := time.NewTimer(n.cfg.Heartbeat)
	defer func() {
		timer.Stop()
		n.mu.Lock()
		n.closed = true
		n.mu.Unlock()
		_ = n.conn.Close()
		wg.Wait()
		n.wakes.close()
	}()
	n.heartbeat()
	start := time.Now()
	lastBeat, lastAnnounce, lastResolve := start, start, start
	short := true // the timer is set within Heartbeat
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-n.busy:
			if !short {
				// Duties are due from now on: the first within Heartbeat.
				short = true
				timer.Stop()
				timer.Reset(n.cfg.Heartbeat)
			}
			continue
		case <-timer.C:
		}
		now := time.Now()
		n.wokeUp.Add(1)
		if now.Sub(lastBeat) >= n.cfg.Heartbeat-n.cfg.Heartbeat/10 {
			lastBeat = now
			n.heartbeat()
			n.expire()
			n.deregister()
		}
		if now.Sub(lastAnnounce) >= n.cfg.Announce-n.cfg.Heartbeat/10 {
			lastAnnounce = now
			n.announce()
		}
		if now.Sub(lastResolve) >= n.cfg.Resolve-n.cfg.Heartbeat/10 {
			lastResolve = now
			n.resolve()
			n.probe()
			n.expire() // an idle member's only look at what it keeps
		}
		next := n.cfg.Resolve - time.Since(lastResolve)
		short = n.needsBeat()
		if short {
			next = min(next, n.cfg.Heartbeat)
		}
		timer.Reset(max(next, time.Millisecond))
	}
}

// kick tells Run that periodic duties are due (it never blocks).
func (n *Node) kick() {
	select {
	case n.busy <- struct{}{}:
	default:
	}
}

// needsBeat reports whether anything needs the Heartbeat duties: seeds
// that are not members (heartbeats, re-announcements, their death), a
// peer heard outside the table whose presence must expire, a queue
// lingering before its CONSUMER_DEREGISTERED, wake-ups to forget.
func (n *Node) needsBeat() bool {
	if n.wakes.size() > 0 {
		return true
	}
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.lingering) > 0 {
		return true
	}
	for _, p := range n.seeds {
		if !p.member {
			return true
		}
	}
	for _, st := range n.byID {
		if !st.member && (st.announced || len(st.presence) > 0 || now.Sub(st.lastBeat) <= n.cfg.DeadAfter) {
			return true
		}
	}
	return false
}

func nowMS() uint64 { return uint64(time.Now().UnixMilli()) } // #nosec G115 -- after 1970

// send builds one datagram and sends it to addrs (all peers when nil).
func (n *Node) send(t Type, v any, addrs []*net.UDPAddr) {
	// Load first: after the first heartbeat a send only reads the flag.
	if !n.beaten.Load() && !n.beaten.Swap(true) && t != Heartbeat {
		n.heartbeat()
	}
	payload, err := Marshal(v)
	if err != nil {
		n.log.Error().Err(err).Msg("encoding a payload")
		return
	}
	b, err := Encode(Header{Type: t, SenderID: n.cfg.ServerID, Session: n.session[:maxSession], Sequence: n.seq.Add(1)}, payload, n.key)
	if err != nil {
		n.drop("encode")
		return
	}
	if addrs == nil {
		now := time.Now()
		n.mu.Lock()
		for _, p := range n.peers {
			if n.classify(p, "", now) != peerDead {
				addrs = append(addrs, p.addr)
			}
		}
		n.mu.Unlock()
	}
	for _, a := range addrs {
		if n.cfg.Drop != nil && n.cfg.Drop(t) {
			continue
		}
		if _, err := n.conn.WriteToUDP(b, a); err == nil {
			n.sent.Add(1)
			n.m.sentBy(t).Inc()
		}
	}
}

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
	n.mu.Lock()
	queues := n.announcedLocked()
	n.mu.Unlock()
	for _, q := range queues {
		n.send(ConsumerRegistered, presencePayload{Queue: q, TS: nowMS()}, addrs)
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
// consumer left more than Linger ago.
func (n *Node) deregister() {
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
		n.send(ConsumerDeregistered, presencePayload{Queue: q, TS: nowMS()}, nil)
	}
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

// Notify tells the peers that may have subscribers for queue that it has a
// new message: the peers whose presence says so, and those whose presence
// is not known yet. Dead peers get nothing.
func (n *Node) Notify(queue, partition string) {
	targets, all := n.targets(queue, n.decide)
	if len(targets) == 0 {
		return
	}
	if len(targets) == all {
		n.m.broadcast.Inc()
		n.count("broadcast")
	}
	n.send(MessageAvailable, MessageAvailablePayload{Partition: partition, Queue: queue, TS: nowMS()}, targets)
}

// targets are the addresses of the peers that may have consumers of queue
// (present, or presence not known yet), out of all peers; each peer's
// classification goes to observe when it is not nil.
func (n *Node) targets(queue string, observe func(decision string)) (targets []*net.UDPAddr, all int) {
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
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

// QueueDeleted tells every peer that queue is gone (QUEUE_CONFIG_DELETE),
// so that they drop its cached settings and partition ids.
func (n *Node) QueueDeleted(queue string) {
	n.send(QueueConfigDelete, QueueConfigDeletePayload{Queue: queue}, nil)
}

// QueueConfigured tells every peer a queue's new settings
// (QUEUE_CONFIG_SET), so that they need not read them again.
func (n *Node) QueueConfigured(queue string, c QueueConfig, version uint64) {
	n.send(QueueConfigSet, QueueConfigSetPayload{Config: c, Queue: queue, Version: version}, nil)
}

// MaintenanceSet tells every peer that a maintenance mode was switched
// (MAINTENANCE_MODE_SET, or POP_MAINTENANCE_MODE_SET when pop), so that
// they read the switches again now rather than at their next periodic read.
func (n *Node) MaintenanceSet(pop, enabled bool) {
	t := MaintenanceModeSet
	if pop {
		t = PopMaintenanceModeSet
	}
	n.send(t, MaintenancePayload{Enabled: enabled, TS: nowMS()}, nil)
}

// PartitionDeleted tells every peer that a partition is gone
// (PARTITION_DELETED), so that they drop its cached id.
func (n *Node) PartitionDeleted(queue, partition string) {
	n.send(PartitionDeleted, PartitionDeletedPayload{Partition: partition, Queue: queue}, nil)
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
	p, err := Decode(b, n.key)
	if err != nil {
		n.drop(Reason(err))
		return
	}
	if p.SenderID == n.cfg.ServerID {
		n.drop("self")
		return
	}
	ts, stamped, err := stampOf(p)
	if err != nil {
		n.drop("payload")
		return
	}
	if reason := n.replay.Check(p.SenderID, p.Session, p.Sequence, ts, stamped, n.now()); reason != "" {
		n.drop(reason)
		if reason == "stale_timestamp" {
			// A peer whose clock is off by more than the window is not
			// heard at all: say so (at most once a minute).
			n.skewLog.Warn().Str("sender", p.SenderID).Uint64("ts", ts).Dur("window", n.cfg.Freshness).
				Msg("dropping a datagram whose timestamp is outside the freshness window: a replay, or a peer's clock is off")
		}
		return
	}
	n.m.receivedBy(p.Type).Inc()
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
	case MaintenanceModeSet, PopMaintenanceModeSet:
		var m MaintenancePayload
		if Unmarshal(p.Payload, &m) != nil {
			n.drop("payload")
			return
		}
		if n.cfg.OnMaintenance != nil {
			n.cfg.OnMaintenance(p.Type == PopMaintenanceModeSet, m.Enabled)
		}
	case LeaseHintAcquired, LeaseHintReleased:
		var m LeaseHintPayload
		if Unmarshal(p.Payload, &m) != nil || m.PartitionID == "" {
			n.drop("payload")
			return
		}
		n.hintFrom(p.Type, p.SenderID, m)
	case ConsumerRegistered, ConsumerDeregistered:
		var m presencePayload
		if Unmarshal(p.Payload, &m) != nil || m.Queue == "" {
			n.drop("payload")
			return
		}
		n.mu.Lock()
		if p.Type == ConsumerRegistered {
			st.addPresence(m.Queue, now)
		} else {
			st.delPresence(m.Queue)
		}
		n.mu.Unlock()
	case PresenceSet:
		var m presenceSetPayload
		if Unmarshal(p.Payload, &m) != nil || m.Parts > 1024 || m.Part >= max(m.Parts, 1) {
			n.drop("payload")
			return
		}
		n.mu.Lock()
		st.presenceFrom(m)
		n.mu.Unlock()
	case PresencePull:
		n.sendPresence(net.UDPAddrFromAddrPort(from))
	}
}

// count adds one to a stats counter.
func (n *Node) count(key string) {
	n.cmu.Lock()
	n.counts[key]++
	n.cmu.Unlock()
}

// drop counts a dropped datagram.
func (n *Node) drop(reason string) {
	n.m.dropped.WithLabelValues(reason).Inc()
	n.count("dropped:" + reason)
}

// decide counts a per-peer targeting decision.
func (n *Node) decide(decision string) {
	n.m.targeted.WithLabelValues(decision).Inc()
	n.count("notify:" + decision)
}

// Stats is what /internal/api/shared-state/stats shows of syncnet.
type Stats struct {
	ServerID string         `json:"serverId"`
	Session  string         `json:"session"`
	Peers    []PeerStats    `json:"peers"`
	Local    map[string]int `json:"localConsumers"`
	Sent     uint64         `json:"datagramsSent"`
	// Counters: "notify:present|unknown|absent|dead" (per peer and push),
	// "broadcast" (pushes sent to every peer), "dropped:<reason>",
	// "hint:used|audit|right|wrong|holder_dead" (lease hint lookups).
	Counters map[string]uint64 `json:"counters"`
	// LeaseHints is how many lease hints are held; HintAccuracy the share
	// of audited hints that were right (-1 before any audit).
	LeaseHints   int     `json:"leaseHints"`
	HintAccuracy float64 `json:"hintAccuracy"`
	// RecvBuffer is the UDP receive buffer the kernel granted, in bytes
	// (RecvBufferBytes asked; -1 when unknown).
	RecvBuffer int `json:"recvBufferBytes"`
}

// PeerStats is one peer's view.
type PeerStats struct {
	Name    string `json:"name"`
	Address string `json:"address"`
	ID      string `json:"id"`
	// Member: the database lists it (found there, no heartbeats);
	// otherwise a seed (--sync-peers). State: present/absent when its
	// presence is known ("absent" here: what it has is in Queues),
	// unknown, unreachable (a member unknown for Reach) or dead.
	Member   bool     `json:"member"`
	State    string   `json:"state"`
	Alive    bool     `json:"alive"`
	LastBeat string   `json:"lastHeartbeat,omitempty"`
	Known    bool     `json:"presenceKnown"`
	Queues   []string `json:"queuesWithSubscribers"`
}

// Stats reports the node's state.
func (n *Node) Stats() Stats {
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	s := Stats{ServerID: n.cfg.ServerID, Session: n.session, Local: map[string]int{}, Sent: n.sent.Load(),
		Counters: map[string]uint64{}}
	n.cmu.Lock()
	for k, v := range n.counts {
		s.Counters[k] = v
	}
	n.cmu.Unlock()
	s.LeaseHints, s.HintAccuracy, s.RecvBuffer = n.hints.Len(), -1, n.recvBuffer
	if right, wrong := s.Counters["hint:right"], s.Counters["hint:wrong"]; right+wrong > 0 {
		s.HintAccuracy = float64(right) / float64(right+wrong)
	}
	for q, c := range n.local {
		s.Local[q] = c
	}
	for _, p := range n.peers {
		ps := PeerStats{Name: p.name, Address: p.addr.String(), ID: p.id, Member: p.member, State: n.classify(p, "", now)}
		if st := n.byID[p.id]; p.id != "" && st != nil {
			ps.Alive = p.member || now.Sub(st.lastBeat) <= n.cfg.DeadAfter
			ps.LastBeat = st.lastBeat.UTC().Format(time.RFC3339Nano)
			ps.Known = st.announced
			for q := range st.presence {
				ps.Queues = append(ps.Queues, q)
			}
		}
		s.Peers = append(s.Peers, ps)
	}
	return s
}

type nodeMetrics struct {
	// bySent and byReceived hold the known types' counters: a label
	// lookup per datagram is a hash and a lock.
	bySent, byReceived      map[Type]prometheus.Counter
	sent, received, dropped *prometheus.CounterVec
	targeted, hints         *prometheus.CounterVec
	broadcast               prometheus.Counter
	alive, dead             prometheus.Gauge
}

func newNodeMetrics(reg prometheus.Registerer) (*nodeMetrics, error) {
	m := &nodeMetrics{
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "herald_syncnet_sent_total",
			Help: "Datagrams sent, by type (one per peer)."}, []string{"type"}),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "herald_syncnet_received_total",
			Help: "Datagrams accepted, by type."}, []string{"type"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "herald_syncnet_dropped_total",
			Help: "Datagrams dropped, by reason (too_short, too_long, version, length, signature, replay, stale_session, unknown_session, stale_timestamp, self, payload, encode)."}, []string{"reason"}),
		targeted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "herald_syncnet_notify_decisions_total",
			Help: "Per peer and push: sent because present or not yet known, skipped because absent or dead."}, []string{"decision"}),
		hints: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "herald_syncnet_lease_hints_total",
			Help: "Lease hint lookups: used (a pop skipped), audit (ignored to check), right/wrong (audit outcomes), holder_dead."},
			[]string{"outcome"}),
		broadcast: prometheus.NewCounter(prometheus.CounterOpts{Name: "herald_syncnet_broadcasts_total",
			Help: "MESSAGE_AVAILABLE sent to every peer."}),
		alive: prometheus.NewGauge(prometheus.GaugeOpts{Name: "herald_syncnet_peers_alive",
			Help: "Peers heard from within the dead threshold."}),
		dead: prometheus.NewGauge(prometheus.GaugeOpts{Name: "herald_syncnet_peers_dead",
			Help: "Configured peers not heard from within the dead threshold (or never, or whose name does not resolve)."}),
	}
	m.bySent, m.byReceived = map[Type]prometheus.Counter{}, map[Type]prometheus.Counter{}
	for t := range typeNames {
		m.bySent[t], m.byReceived[t] = m.sent.WithLabelValues(t.String()), m.received.WithLabelValues(t.String())
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.sent, m.received, m.dropped, m.targeted, m.hints, m.broadcast, m.alive, m.dead} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *nodeMetrics) sentBy(t Type) prometheus.Counter {
	if c, ok := m.bySent[t]; ok {
		return c
	}
	return m.sent.WithLabelValues(t.String())
}

func (m *nodeMetrics) receivedBy(t Type) prometheus.Counter {
	if c, ok := m.byReceived[t]; ok {
		return c
	}
	return m.received.WithLabelValues(t.String())
}
