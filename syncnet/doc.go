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
//	            30/31 LEASE_HINT_ACQUIRED/RELEASED, 40/41 maintenance modes)
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
// most once per queue per WakeWindow (5 ms; wake.go).
//
// Node is one instance on the mesh: heartbeats (ServerHealth: dead after
// DeadAfter), consumer presence (announced on the first and last consumer
// of a queue, re-announced every Announce), targeted MESSAGE_AVAILABLE,
// QUEUE_CONFIG_SET/DELETE, PARTITION_DELETED and MAINTENANCE_MODE_SET /
// POP_MAINTENANCE_MODE_SET news handed to callbacks (a maintenance datagram
// only makes the receiver read the switches from the database again), and
// lease hints (hints.go). The queue config cache itself is the queue
// package's (queue.ConfigSnapshot); the node only carries the news that
// keeps the instances' caches in step, through the callbacks.
package syncnet
