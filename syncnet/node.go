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
	WakeWindowDefault = 2 * time.Millisecond
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
	// WakeWindow: at most one wake-up from the network per partition (and
	// one for the whole queue) per this window reaches the Waker (wake.go);
	// a datagram naming a partition woken within it waits that long at
	// most. Zero means WakeWindowDefault, 2 ms.
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
	// (tests of a lossy network, or of a lost announcement). Called with
	// the node's send lock held: it must not send.
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

	// wmu orders the datagrams: each is numbered (seq) and written under
	// it (send).
	wmu sync.Mutex

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
	// pushed: when a wake-up of each queue was last announced (a push, a
	// lease release), kept for pushRecall (answer.go); pushedOver: when
	// one was not remembered for want of room; prunedAt: the last walk
	// that made room.
	pushed               map[string]time.Time
	pushedOver, prunedAt time.Time
	closed               bool
	// busy kicks Run's timer: Heartbeat duties are due (needsBeat).
	busy chan struct{}
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
		replay: NewReplay(cfg.Freshness), wakes: newWakeLimiter(cfg.Waker, cfg.WakeWindow), now: time.Now, log: log, recvBuffer: granted, byID: map[string]*peerState{}, members: map[string]*peer{}, byAddr: map[netip.AddrPort]*peer{}, started: time.Now(), local: map[string]int{}, lingering: map[string]time.Time{}, pushed: map[string]time.Time{}, busy: make(chan struct{}, 1),
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
