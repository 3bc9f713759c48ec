// Package gateway is Herald's HTTP server: the v1 REST API of the reference
// server (push, pop, ack, lease extension, transaction, configure, delete),
// WebSocket and SSE streams, HTTP long-poll, bearer-token auth, /health,
// /metrics, the stats and status endpoints, and the demo page (web). The
// browsing, consumer-group, DLQ, trace, maintenance, backlog, analytics and
// rates routes are the admin package's, registered here (admin.Register),
// with what follows their acts from effects.go, the maintenance modes from
// maintenance.go, and the history the analytics and rates chart
// (internal/history), which this package records into as it serves. It
// holds no queue logic: each handler checks its input and the token's
// rights, calls queue.Store, and shapes the answer exactly as docs/api.md
// says (field names, key order, status codes). A route's handler returns
// its error (internal/httpapi's HandlerFunc) and the route's registration
// answers it, in one place (httpapi.Failer: 4xx with the client's mistake,
// 503 with Retry-After while the database is away, 500 otherwise); the
// stream handlers answer theirs with Server.fail, the same Failer. Files go
// by prefix: handler_*.go per route group, session*.go for streams,
// maintenance*.go, authorize.go for the token at the door of each route and
// the rights checks that need the store (what a token is and may do, and
// the cookie rule, are the auth package's), effects.go for what follows a
// push, an ack or a release (metrics, wake-ups, credit, the history's
// counts), metrics.go for the herald_* series and the history
// (internal/history: Server.RunAnalytics samples its gauges,
// Server.RecordRetention adds retention's runs).
//
// # Browsers: origins and the cookie
//
// Each route is registered with what it does: Server.read for a GET that
// changes nothing, Server.stream for an event stream, Server.handle for
// everything else — a change, the default, the GET pops included (they
// lease, and with autoAck consume). A token in the Authorization header or
// in access_token works from any origin: a page had to be given it. A
// token in the --auth-cookie cookie alone, which the browser attaches to
// other sites' requests too, is honoured only from the server's own origin
// (scheme, Host) or Config.AllowedOrigins (by Origin, else by
// Sec-Fetch-Site), a stream only when asked for as one (Accept:
// text/event-stream), a change only with X-Herald-CSRF or Sec-Fetch-Site:
// same-origin (auth/cookie.go has the rule and why each part holds). A
// browser's WebSocket upgrade, whatever its credential, must come from the
// same origins (403 otherwise); clients without an Origin are not
// browsers and are let through.
//
// # Streams: one session behind every transport
//
// A WebSocket connection and an SSE stream are each a session (session.go)
// behind a thin transport (handler_ws.go, handler_sse.go). The session owns
// the connection's subscriptions, each a standing poller intention whose
// credit is maxInFlight minus its unacknowledged deliveries; those
// deliveries, registered in Server.deliveries so that an ack made on this
// instance by any path gives their credit back (effects.go), and an ack
// frame on the session's own WebSocket as soon as it is read, before the
// store applies it (session_ack.go: the next lease need not wait for the
// ack's commit); the bounded
// write queue and its one writer; the release of leases; drain; and the
// typed close, Disconnect{Code, Reason, Reconnect}. A transport encodes and
// writes (deliver frames; events whose ids are resume tokens), reads
// frames, and pings or sends heartbeats.
//
//	poller ───────── deliver ──▶ ┌─ session ───────────┐ ── writer ──▶ transport.write
//	afterAck ─────── settled ──▶ │ subs, inflight, out │
//	lease check, expiry, drain ▶ └─────────────────────┘ ── close(d) ─▶ transport.close
//
// A session's life; close runs once, whoever calls it first:
//
//	open ── subscribe, startSub ──▶ leasing ── Drain ──▶ draining ── its point of
//	  │                                │       (intentions       the drain window
//	  │                                │        withdrawn)       (SSE: flush) ──┐
//	  └────────────────────────────────┴──── close(d) ◀──────────────────────────┘
//	         client gone, write failed (nil); slow consumer 4001; bad frames
//	         4500; token expired 4501; frame too big 1009; drain 4000
//	  close: intentions withdrawn, leases given back (at once, or after
//	         SSEResumeGrace for what an SSE stream wrote, unless it was a slow
//	         consumer), then the transport closed with d
//
// An SSE stream resumes on any instance: each event's id is a token
// (sse_token.go) naming, per partition, the lease and the highest offset
// written. A stream that reconnects with Last-Event-ID acks what the token
// covers and gives the rest of those leases back (queue.ResumeLeases), so
// it receives them again first:
//
//	instance A: events id=T1..Tn ─▶ connection lost ─▶ leases kept SSEResumeGrace
//	instance B: GET …/sse, Last-Event-ID: Tn ─▶ ack ≤ Tn, release the rest ─▶ stream
//
// The tokens also name the browser's chain of streams (sse_chain.go): when
// its next stream opens on the same instance, what its closed streams kept
// past the token it resumed with is given back at once, not after the grace.
//
// # Follow streams
//
// A follow (follow_*.go) is not a session: no group, lease or ack. One
// followHub per followed queue reads what a wake-up announces once
// (queue.Store.ReadFollow, in the queue's follow order) and hands it to
// each follower's bounded sink in memory; a partition's followers are the
// queue hub's, filtered. A follower catches up with its own bounded reads
// on its request's goroutine, then joins the hub exactly (the hub's ring of
// its last 1,024 messages). Transports: followStream (SSE: event ids are
// follow positions), pollSink (a waiting long-poll: its first batch),
// wsFollow (frames through the WebSocket session's write queue).
//
//	wake (push here, NOTIFY, syncnet, logical) ─▶ hub: ONE read ─▶ ring ─▶ follower sinks ─▶ writers
//	new follower: own reads (200 at a time) ──────────▶ join: ring after its position ─┘
//
// A sink whose buffer is full (Config.FollowBuffer) is dropped by the hub
// and closed on another goroutine as a slow consumer (4001: a WebSocket's
// close frame; on SSE retry: and event: disconnect, after the write under
// way, within SlowConsumerCloseGrace): it resumes by its last id, and no follower waits for another. The hub reads
// on a kept goroutine (warmStacks) only while there is something to read;
// its timer is the safety sweep (100 ms doubling to 5 s) and the re-read
// of messages held back behind an open transaction (5 ms doubling to 1 s).
// A hub renders each message's SSE event once; SSE followers queue those
// shared bytes. The hub writes the SSE streams it hands a read to in
// chunks of 256 (followBatch): each full chunk goes at once to at most
// GOMAXPROCS-1 writer goroutines while the hub hands the read to the next
// streams (the first followers are written to before the last are handed
// anything), and the hub joins the writers once the read is handed out;
// one non-blocking write(2) per stream on the TCP connection under the
// counting wrapper; what a socket does not take at once, or a stream
// whose wmu is busy, goes to the stream's own writer (a writev of all that
// waits, under the write deadline, which moves once per half of it).
//
// # Concurrency
//
// Handlers run on net/http's goroutines; a waiting long-poll (wait=true)
// parks in its handler on a poller intention and holds no database
// connection. Per stream, and nothing else while idle:
//
//   - the connection's own goroutine: a WebSocket's reader (each frame is
//     handled on another goroutine's stack, so the reader's stays small;
//     each ack frame is applied on a goroutine of its own, at most 64 at
//     once, so that back-to-back acks share transactions), or, for SSE, the goroutine parked in a read
//     until the client leaves (on HTTP/2, the handler's). It ends the
//     session (close(nil)) and waits (wait) for the writer, the timer
//     callbacks and a close under way before the stream counts as gone.
//   - the writer, started when something is queued, gone when the queue is
//     empty; while it runs, a timer watches how long its write has waited
//     (the slow consumer, below).
//   - frame handling, ack application and writers run on warmStacks
//     (stacks.go): up to 64 goroutines kept between uses, so their grown
//     stacks are not grown again for every message; Close ends them.
//   - timer callbacks: the WebSocket ping, the SSE heartbeat, the lease
//     check (acks on other instances, expired leases: every 2 s on SSE,
//     every 30 s on a WebSocket, only while deliveries are unacknowledged),
//     the token's expiry, the slow-consumer watch (while a writer runs),
//     and, per lease kept for a resume, its release.
//   - callers that must not block: the poller (deliver, on a worker or on
//     a push's goroutine for a hand-off), the store (CountGivenUp, on the
//     goroutine of whichever pop gave messages up), the ack paths
//     (settled), and Drain's goroutine per session, waiting out its point
//     of the window.
//
// RunMaintenance runs on its caller's goroutine until ctx ends, reading
// the maintenance switches (maintenance.go), and owns one more that drains
// the push buffer (spool.Dir) when there is one. (The JWKS refresh is the
// auth package's.)
//
// Lock order. The session sets' locks (sessionSet: Server.wsSessions,
// Server.sseSessions), Server.sseMu and Server.graceMu are each taken alone
// (Drain lists a set's sessions under its lock, then starts a goroutine per
// session). Nested locks:
//
//	session.mu ──▶ poller worker's mutex  (startSub → Poller.Register, so that
//	                                       a drain sees the cancel func or stops it)
//	session.mu ──▶ syncnet Node.mu        (the same Register, after the worker's
//	                                       mutex is released: OnPresence = Node.SetLocal,
//	                                       which may send one UDP datagram)
//	session.mu ──▶ sseStream.tmu          (forgetLocked → partitionSettled)
//	session.mu ──▶ warmStacks.mu (read)   (enqueueLocked starts the writer; the
//	                                       pool's lock guards only its counts)
//	maintenance.mu ─▶ poller worker's mutex (apply → Poller.SetPaused)
//
//	followHubs.mu ─▶ followHub.mu           (release, which lets an empty hub go)
//	followHub.mu ──▶ a sink's mutex         (handLocked → deliver: followStream.mu,
//	                                         pollSink.mu, or wsFollow.mu then session.mu)
//	followStream.wmu ─▶ followStream.mu     (send and beat check finished; flushNow
//	                                         holds mu and only tries wmu: TryLock)
//
// sseStream.wmu (held across one socket write, under its 10 s deadline),
// wsConn.pmu and LabelLimiter.mu are taken alone; Server.deliveries
// is a sync.Map. The poller calls into the gateway with a worker's mutex
// held only for an intention's Hold, an atomic load (session.held), so no
// order runs the other way. No gateway mutex is held during a store call, a lease
// release, AddCredit, an intention's cancel, or a transport's write or
// close (TestLockOrder_ReleaseAfterCloseHoldsNoLock checks the release
// that once ran under graceMu).
//
// # Failures
//
// Bad input is answered 400 with {"error": "..."} (413 for a body over
// Config.BodyLimit, 408 for one not received within BodyReadTimeout) and
// never reaches the database; a missing or invalid token 401, a role or
// rights that do not allow the request 403, and so does a token in the
// cookie alone outside the cookie rule ("cookie refused: ..."). Per-item failures (a stale
// lease, an unknown message) are 200 with success:false, because clients
// retry 5xx. A database fault is 500 with a generic text; the details go
// to the log at error level. Limits answer so that clients come back
// later: too many WebSockets 503 with Retry-After, too many SSE streams
// 200 with a retry: delay. Config.MaxConnections caps the connections of
// every transport together, counted by the Listener wrapper from Accept to
// Close (conns.go): past it a request is answered the same way (503, SSE
// 200 + retry:) and its connection closed, /health and /metrics are still
// answered, at most 64 such connections are held at once (more are closed
// unanswered), and no open connection is touched. An accept that fails
// (EMFILE, ENFILE) is returned unchanged: http.Server retries it.
//
// On a stream:
//
//   - a write fails or a piece of it misses its deadline (10 s, moved on
//     once half of it has passed: a stuck piece fails within 5 to 10 s),
//     or the client leaves: the session ends and gives its leases back.
//   - a WebSocket client reads so slowly that 64 frames wait: its
//     subscriptions lease nothing until the writer is down to 16.
//   - a slow consumer, whose socket has taken nothing of a write (of a
//     large one, no 16 KiB piece) for SlowConsumerAfter (5 s), or a
//     WebSocket that leaves 1,024 frames unread: nothing more is queued,
//     its leases are given back at once (an SSE stream keeps none for a
//     resume), and the write under way and the close get
//     SlowConsumerCloseGrace (3 s) before the connection is closed: 4001
//     on a WebSocket, retry: and event: disconnect {"code":4001} on SSE,
//     which a client still reading receives; one reading nothing is
//     disconnected all the same, within 8 s. A frame or event is never cut
//     short before the close. The writer's timer (session.watch) does the
//     looking: its peers, the poller and the other sessions never wait for
//     it. Pings and heartbeats are not watched (nothing waits on them):
//     one its socket does not take ends the connection at its 10 s
//     deadline.
//   - malformed frames: an error frame each, 4500 past 100; a frame over
//     1 MiB: 1009.
//   - the token expires: 4501 on a WebSocket, a last event: disconnect
//     {"code":4501} on SSE.
//   - drain: subscriptions are withdrawn at once; at the session's point of
//     the drain window an SSE stream writes what is queued and a retry:, a
//     WebSocket is closed 4000. New WebSocket upgrades and long-polls are
//     refused 503 with Retry-After; EndStreams closes at once what is still
//     open when the assembly's deadline passes.
//   - a lease check fails: retried at the next tick; a release fails: logged,
//     and the lease expires in time. Nothing is lost either way.
//
// Database loss: requests answer 500 and streams keep their connections;
// their subscriptions lease again when the poller reaches the database. A
// database that lost what it committed (a failover to an asynchronous
// standby) is reconciled by the assembly (internal/server): StreamLeases
// names the leases the streams hold, and ForgetLostLeases forgets the
// deliveries whose lease the database no longer has, as a refused ack
// would (reconcile.go).
// During push maintenance pushes go to the buffer (503 when there is none,
// or it is full); during pop maintenance pops and waiting long-polls answer
// 204 and the poller is paused. A read of the switches that fails keeps
// what was last read and is tried again every Config.MaintenanceRefresh;
// one older than the state applied (it began before a switch and ended
// after it) is ignored.
package gateway
