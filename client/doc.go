// Package client is Herald's Go SDK: a WebSocket consumer that keeps its
// subscriptions across reconnects, acknowledges what its handlers finish and
// never takes more than MaxInFlight unacknowledged messages, a follower of
// queues (every follower sees every message; resumed from its last event
// id), and an HTTP producer.
//
// It is a Go module of its own (github.com/heraldmq/herald/client) and
// requires nothing from the server module: it speaks the protocol
// documented in docs/clients.md (WebSocket subprotocol herald.v1, JSON frames;
// pushes over HTTP), so a program that imports it resolves only
// gorilla/websocket (and this module's test libraries). Its tests run a
// herald built from the server module next door as a separate process.
//
// A Client holds one WebSocket connection for all its subscriptions:
//
//	Dial ──► connected ──(read error, close 4000–4499)──► reconnecting
//	             ▲                                          │ back-off, dial
//	             └───────────── resubscribe ◄───────────────┘
//	connected ──(close 4500–4999, or Close)──► closed: every Subscribe returns
//
// When the connection drops (a restart, a deploy, a network blip) it
// reconnects with exponential back-off and full jitter and subscribes
// again; messages that were in hand but not acknowledged were given back by
// the server when the connection closed and are delivered again, in order.
// Delivery is at-least-once: a handler may see a message twice, never zero
// times.
//
// # Subscribe or Follow
//
// Subscribe shares a queue's work: the members of a consumer group (or
// queue mode) each get some of the messages, the server keeps the
// position and leases what is in hand. Follow is for "everyone sees
// everything" (a live feed, a dashboard): no group, no lease, no ack, and
// the position is the follower's, each message's EventID. Across a
// reconnect a Follow follows again after the last event id it received
// (before its first message, after the start the server named), on
// whichever instance it reaches: none lost, none twice, while retention
// keeps them; past it FollowOptions.OnGap is told. A Follow's handler
// runs on Follow's goroutine, in order; its messages wait in a buffer of
// 1,024, and when that is full the connection's reader waits for it,
// which holds up the connection's other deliveries until the server
// closes it as a slow consumer (4001): the client reconnects and the
// follow resumes where it was.
//
// # Concurrency
//
// A Client and its methods are safe for concurrent use. Dial starts one
// goroutine per Client, which Close waits for: it reads the connection
// (routing deliveries to subscriptions and answers to the calls waiting on
// them), and when the connection ends it redials and starts the
// resubscriptions. Beside it, per connection, a short-lived goroutine per
// subscription sends its subscribe frame and waits for the answer, and
// with a TokenSource one goroutine sends a fresh token before the live one
// expires; both end with the connection.
//
// Callbacks and the goroutines that call them:
//
//   - a Handler runs on the goroutine that called Subscribe (or Follow,
//     with FollowOptions.OnGap), one message at a time in delivery order;
//     the reader hands a subscription's messages through a channel of
//     2×MaxInFlight, which the server's credit never overfills (a
//     follow's: above);
//   - Options.OnState runs on the Client's goroutine, so a slow one delays
//     the reconnect; it must not call Close;
//   - Options.TokenSource runs on the goroutine of Dial or Push, on the
//     Client's goroutine before a reconnect, and on the refresh goroutine;
//     it may be called concurrently.
//
// The mutexes (the Client's, each connection's state and write locks, each
// Subscription's) are never held together: each guards its own fields for
// a few statements and none is held while a frame is written or a
// callback runs, except the write lock around the write itself.
//
// # Failures
//
// A connection that fails or that the server closes with a code in
// 4000–4499 (4000 draining, 4001 a client that read too slowly) is
// redialled; OnState reports each
// attempt with its error and delay. A close in 4500–4999 is terminal: every
// Subscribe returns a *CloseError and the Client is done — except 4501 (the
// token expired) with a TokenSource, which reconnects with a fresh token.
// A subscription the server refuses (a *ServerError, e.g. code forbidden
// for a token without the right) ends that Subscribe alone. After Close,
// running and later Subscribe calls return ErrClosed.
//
// Acknowledgements are bound to the connection that delivered the message:
// an ack that can no longer be sent returns ErrLeaseLost (the message comes
// again); one whose answer was lost returns ErrAckUnknown (it was applied,
// or the message comes again): key side effects on the transactionId. In automatic
// mode a handler's error fails the message with the error's text (retried,
// then dead-lettered after the queue's retry limit); a handler interrupted
// by its context leaves the message unacknowledged. Push returns an
// *HTTPError for a refused request; a duplicate transactionId is a result
// (status "duplicate"), not an error.
package client
