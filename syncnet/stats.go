package syncnet

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

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
	// Counters: "notify:present|unknown|absent|dead" (per peer and push;
	// "notify:answered": a peer woken because its consumer was heard of
	// after a push or release of the queue, answer.go),
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
			Help: "Per peer and push: sent because present or not yet known, skipped because absent or dead; answered: sent to a peer whose consumer was heard of after a push or release of the queue."}, []string{"decision"}),
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
