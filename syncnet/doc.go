// Package syncnet is UDPSYNC, the signed UDP mesh between Herald instances
// (docs/design.md, "syncnet"). It only saves work — who has subscribers for
// which queue, cached queue configs, lease hints, liveness — and is never
// needed for correctness: PostgreSQL stays the only source of truth.
//
// This file set holds the wire format, byte-compatible with the reference
// server (the captured datagrams in testdata/reference-packets.json):
//
//	offset size field
//	0      1    version (1)
//	1      1    type (1 MESSAGE_AVAILABLE, 3 HEARTBEAT, 10/11 QUEUE_CONFIG_SET/DELETE,
//	            20/21 CONSUMER_REGISTERED/DEREGISTERED, 25 PARTITION_DELETED,
//	            30/31 LEASE_HINT_ACQUIRED/RELEASED, 40/41 maintenance modes,
//	            50/51 PRESENCE_SET/PULL, Herald's own, to members only)
//	2      2    payload length, big-endian
//	4      32   HMAC-SHA256 signature: key = the secret's ASCII bytes,
//	            input = bytes 0–3 ‖ bytes 36..end of datagram
//	36     32   sender id (hostname:port), NUL-padded, at most 31 bytes
//	68     16   session id, random per process start: 15 characters and a NUL
//	84     8    sequence, big-endian, from 1, one counter for every datagram
//	92     n    MessagePack payload: keys in bytewise order, smallest integers
//
// A datagram is at most 1,400 bytes (payload ≤ 1,308), refused at encode
// time when larger. Signatures are compared in constant time.
//
// Replay (replay.go) is stricter than the reference server, which takes any
// session but the last as a restart: a datagram whose signed ts is more
// than Freshness (30 s) from this clock is dropped; a sender's session is
// adopted only by a datagram with a signed ts later than every ts of the
// session it supersedes, and a superseded session is never accepted again.
// MESSAGE_AVAILABLE and LEASE_HINT_RELEASED wake-ups reach the poller at
// most once per partition (and once for the whole queue) per WakeWindow
// (2 ms; wake.go), at most 32 partitions of a queue at once; the one that
// merges a window's held-back datagrams names each partition they named
// (up to 32; more, or one naming the whole queue, wake the whole queue).
//
// Node is one instance on the mesh. Its peers are members (SetMembers:
// the Herald instances the database's members table lists, read every 2 s
// by internal/server) and seeds (Config.Peers: the reference server, or an
// address to use instead of the advertised one). Members exchange no
// heartbeats (the table says who is alive; one not listed leaves at once)
// and no re-announcements: presence changes go out as they happen, and a
// digest in the table tells a reader when its view differs, which then
// pulls the whole set (PRESENCE_PULL, PRESENCE_SET of many queues per
// datagram; members.go). An idle mesh of members sends nothing. A member
// unknown for Reach (10 s) is unreachable: no wake-ups, pulled again every
// Reach, not Known (so NOTIFY is not skipped for it). Seeds keep the
// reference server's ways: heartbeats every Heartbeat while alive (dead
// after DeadAfter of silence, or DeadAfter after start if never heard,
// then probed every Resolve only), presence re-announced every Announce.
// Beyond that: consumer presence (announced on the first and last consumer
// of a queue), targeted MESSAGE_AVAILABLE (to the peers whose presence
// says they consume the queue or is not known; a peer whose consumer of a
// queue is heard of after a push or lease release of it, within 10 s, is
// answered alone with a MESSAGE_AVAILABLE for the whole queue, so a
// presence that arrives late never loses the wake-up: answer.go),
// QUEUE_CONFIG_SET/DELETE, PARTITION_DELETED and MAINTENANCE_MODE_SET /
// POP_MAINTENANCE_MODE_SET news handed to callbacks (a maintenance datagram
// only makes the receiver read the switches from the database again), and
// lease hints (hints.go). The node keeps no cache of Herald's data: the
// queue config cache is the queue package's, kept in step by the callbacks
// internal/server points at the store.
//
// # Concurrency
//
// Node.Run owns the node's goroutines and returns when they have ended: it
// sends heartbeats, presence re-announcements and expiries from its own
// goroutine on one timer, every Heartbeat while something needs it (seeds
// that are not members, a peer heard outside the table, a lingering
// queue, wake-ups to forget) and every Resolve otherwise: an idle member
// wakes twice a minute, not every second. It starts one receive goroutine
// that reads the socket until Run closes it. Coalesced wake-ups fire from timers (time.AfterFunc), which
// Run stops as it returns. The methods the rest of Herald calls (Notify,
// SetLocal, LeaseAcquired/Released, LeasedElsewhere, the QueueConfigured
// family) run on their caller's goroutine and send their datagram there.
//
// Locks: Node.mu guards the peers, their state and presence, the local
// consumer counts and the queues woken lately (answer.go); Node.cmu the
// stats counters; Node.wmu orders the datagrams: each is numbered and
// written under it, so they leave in sequence order (a peer drops one
// whose sequence is below one it took, and two sends that crossed between
// numbering and writing lost the earlier); a presence decision a later one
// may contradict (a deregistration, the set a pull is answered with, a
// re-announcement) is made under it too, so its datagrams leave in the
// order decided. The order: wmu before mu (those decisions; a datagram to
// every peer) before cmu (Stats; Notify counting its per-peer decisions;
// a datagram that does not encode). The wake limiter's mu and Replay's mu
// are each taken alone.
// No lock but wmu is held while a datagram is sent, and none while a peer
// name is resolved or a callback runs: the Waker and the On* callbacks are called on the receive
// goroutine (or a wake timer's) with nothing held, and must not block, or
// the socket is not read. SetLocal is poller.Config's OnPresence, which the
// poller calls with none of its locks held (on the registering or the
// withdrawing goroutine).
//
// # Failures
//
// A datagram that does not decode, fails its signature, is this node's
// own, or is refused by Replay is dropped and counted by reason
// (herald_syncnet_dropped_total, Stats' counters); nothing from the
// network panics. A payload that does not unmarshal is dropped the same
// way. A peer name that does not resolve is logged and tried again every
// Resolve; a failed send is not retried (the next heartbeat or
// re-announcement heals it). A peer silent for DeadAfter is treated as
// dead: it gets no wake-ups, and its lease hints are ignored. Whatever is
// lost costs latency, never a message: the poller's sweep and the
// database find the rest.
package syncnet
