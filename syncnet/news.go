package syncnet

import (
	"net"
	"time"
)

// send builds one datagram and sends it to addrs (all peers when nil).
func (n *Node) send(t Type, v any, addrs []*net.UDPAddr) {
	defer n.lockSend(t)()
	n.sendLocked(t, v, addrs)
}

// lockSend greets the peers first if t would be the first datagram
// (greet) and takes wmu for sendLocked; the func it returns lets it go.
func (n *Node) lockSend(t Type) (unlock func()) {
	n.greet(t)
	n.wmu.Lock()
	return n.wmu.Unlock
}

// greet sends the first heartbeat before any other datagram: peers adopt
// a session only by a datagram with a signed ts (replay.go).
func (n *Node) greet(t Type) {
	// Load first: after the first heartbeat a send only reads the flag.
	if !n.beaten.Load() && !n.beaten.Swap(true) && t != Heartbeat {
		n.heartbeat()
	}
}

// sendLocked is send with wmu held, and the greeting done (greet).
//
// Datagrams are numbered and written under wmu: a peer drops a datagram
// whose sequence is below one it already took (replay.go; the reference
// server likewise), so one numbered, then overtaken by another send before
// it was written, was lost — a wake-up among them. Presence decisions that
// a later one may contradict (a deregistration, a pulled set) are made
// under wmu too, so that their datagrams leave in the order decided.
func (n *Node) sendLocked(t Type, v any, addrs []*net.UDPAddr) {
	payload, err := Marshal(v)
	if err != nil {
		n.log.Error().Err(err).Msg("encoding a payload")
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
	b, err := Encode(Header{Type: t, SenderID: n.cfg.ServerID, Session: n.session[:maxSession], Sequence: n.seq.Add(1)}, payload, n.key)
	if err != nil {
		n.drop("encode")
		return
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

// Notify tells the peers that may have subscribers for queue that it has a
// new message: the peers whose presence says so, and those whose presence
// is not known yet. Dead peers get nothing.
func (n *Node) Notify(queue, partition string) {
	targets, all := n.targets(queue, true, n.decide)
	if len(targets) == 0 {
		return
	}
	if len(targets) == all {
		n.m.broadcast.Inc()
		n.count("broadcast")
	}
	n.send(MessageAvailable, MessageAvailablePayload{Partition: partition, Queue: queue, TS: nowMS()}, targets)
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
