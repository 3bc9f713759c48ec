// Package admin is Herald's administration room: the routes an operator
// and the console use to look at and act on queues, beside the message
// path: browsing (browse.go, browse_messages.go, browse_status.go: the
// resources, messages and status reads the reference server's dashboard
// makes, computed live from partition and consumer rows, and the deletion
// of one message), consumer groups (groups.go: list, lagging, details,
// delete, subscription, seek), the dead-letter queue (dlq.go: list, one,
// replay, purge), traces (traces.go: record and read notes attached to
// messages), the maintenance switches (maintenance.go: read and set push
// and pop maintenance; the modes themselves and the push buffer are the
// message path's, gateway/maintenance.go, reached through Maintenance) and
// the backlog overview (backlog.go: the hygiene loop's latest sample of
// what each group has not finished), and the analytics (analytics.go: the
// /api/v1/analytics/* routes, GET /api/v1/status's throughput and workers,
// GET /api/v1/status/rates), answered from the instance's history
// (internal/history, Deps.History and Deps.Rates), which the message path
// records into as it serves.
//
// It registers its routes through the gateway's registration (Routes:
// the same CORS, token check, request metrics and error adapter as every
// route) and takes what it needs from the server through Deps: the store,
// the partition ids a token may see (Visible, Hide), the history (History,
// Rates), and Effects, what the message path does after an act (a seek's, a replay's or a deletion's
// released leases, wake-ups and credit, the DLQ counters:
// gateway/effects.go). It never imports
// the gateway, and the message path (poller, queue) never imports it; the
// gateway calls Register when it builds its routes.
//
// # Concurrency
//
// Handlers run on net/http's goroutines; admin starts none and keeps no
// state between requests.
//
// # Failures
//
// A handler returns its error; httpapi.Failer answers it (400 for bad
// input, 403 for a name outside the token's rights, 503 while the database
// is away, 500 otherwise). A message or partition the token may not see is
// answered as one that does not exist (404), at the same cost.
package admin
