// Package gateway is Herald's HTTP server: the v1 REST API of the reference
// server (push, pop, ack, lease, transaction, configure, delete, DLQ),
// /health, /metrics and the stats endpoint. It holds no queue logic: each
// handler checks its input, calls queue.Store and shapes the answer exactly as
// docs/api.md says (field names, key order, status codes).
//
// # Concurrency
//
// Handlers run on net/http's goroutines. A waiting long-poll (wait=true)
// registers an intention with the poller and holds no database connection:
// the poller leases for it and hands the result to the waiting handler, or
// its timeout answers 204.
//
// # Streams: one session behind every transport
//
// A WebSocket connection and an SSE stream are each a session (session.go)
// behind a thin transport (handler_ws.go, handler_sse.go). The session owns
// the connection's subscriptions, each a standing poller intention whose
// credit is maxInFlight minus its unacknowledged deliveries; those
// deliveries, registered in Server.deliveries so that an ack made on this
// instance by any path gives their credit back (effects.go); the bounded
// write queue and its one writer; the release of leases; drain; and the
// typed close, Disconnect{Code, Reason, Reconnect}. A transport encodes and
// writes (deliver frames; events whose ids are resume tokens), reads
// frames, and pings or sends heartbeats.
//
//	poller worker ── deliver ──▶ ┌─ session ───────────┐ ── writer ──▶ transport.write
//	afterAck ─────── settled ──▶ │ subs, inflight, out │
//	lease check, expiry, drain ▶ └─────────────────────┘ ── close(d) ─▶ transport.close
//
// Goroutines of a session:
//
//   - the connection's own: a WebSocket's reader (each frame is handled on
//     a short-lived stack, onStack), or the goroutine an SSE stream parks in
//     a read until its client leaves (on HTTP/2 the handler's). It ends the
//     session (close(nil)) and waits (wait) for the writer, the timer
//     callbacks and a close under way before the connection counts as gone.
//   - the writer, started when something is queued, gone when the queue is
//     empty: an idle connection has no goroutine but its own.
//   - timer callbacks: the WebSocket ping, the SSE heartbeat, the lease
//     check (acks on other instances, expired leases: every 2 s on SSE,
//     every 30 s on a WebSocket, only while deliveries are unacknowledged)
//     and the token's expiry.
//   - callers that must not block: poller workers (deliver), the ack paths
//     (settled), Drain's goroutine per session, waiting out its point of
//     the drain window.
//
// Lock order: session.mu before a poller worker's mutex (only to register
// an intention, so a drain either sees its cancel func or stops it) and
// before sseStream.tmu (the resume token, through partitionSettled).
// sseStream.wmu and wsConn.pmu are taken alone; Server.wsMu and sseMu are
// never held with a session's mutex. The store, AddCredit, Release and an
// intention's cancel are called without session.mu.
//
// What happens on each failure:
//
//   - a write fails or misses its 10 s deadline, or the client leaves: the
//     session ends and gives its leases back.
//   - a WebSocket client reads so slowly that 64 frames wait: its
//     subscriptions lease nothing until the writer is down to 16; at 1,024
//     it is closed 4001 (reconnect).
//   - malformed frames: an error frame each, 4500 past 100; a frame over
//     1 MiB: 1009.
//   - the token expires: 4501 on a WebSocket, a last event: disconnect
//     {"code":4501} on SSE.
//   - drain: subscriptions are withdrawn at once; at the session's point of
//     the drain window an SSE stream writes what is queued and a retry:, a
//     WebSocket is closed 4000.
//   - a lease check fails: retried at the next tick; a release fails: logged,
//     and the lease expires in time. Nothing is lost either way.
//
// On close a WebSocket gives every lease back at once; an SSE stream gives
// back at once what it had not written, and keeps what it wrote for
// Config.SSEResumeGrace, so that a resume with Last-Event-ID (on any
// instance) neither loses nor repeats those messages. Server.Close gives
// back what still waits.
//
// # Maintenance modes
//
// maintenance.go keeps this instance's copy of the two cluster-wide
// switches (queue.SystemState) and its push buffer (spool.Dir).
// RunMaintenance owns two goroutines: one reads the switches every
// Config.MaintenanceRefresh and whenever RefreshMaintenance asks (the
// switch's NOTIFY, a syncnet datagram), the other drains the buffer into
// the queue whenever push maintenance is off and it holds something. While
// push maintenance is on, pushes (HTTP, WebSocket) are appended to the
// buffer and answered once it is fsynced; while pop maintenance is on,
// pops answer 204 before any query, waiting long-polls are answered 204,
// and the poller is paused. Lock order: maintenance.mu before a poller
// worker's mutex (SetPaused); the spool's locks are its own.
//
// # Failures
//
// Bad input is answered 400 (413 for an oversized body) with
// {"error": "..."} and never reaches the database; per-item failures (a stale
// lease, an unknown message) are 200 with success:false, because clients
// retry 5xx. Only database faults give 500; they are logged at error level.
package gateway
