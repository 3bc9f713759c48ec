// Package httpapi is the HTTP plumbing the gateway's message path and the
// admin routes share: how an answer is written (WriteJSON, WriteError: no
// HTML escaping, the reference server's {"error": "..."}), how a request's
// JSON body and fields are read (ReadObject and the field readers, which
// say which field is wrong), the timestamp formats of the API, and the one
// error adapter of handlers: a handler is a HandlerFunc that returns an
// error, wrapped once (Failer.Handler), and Failer.Fail maps that error to
// its answer (error.go: a client's mistake 4xx with its text, a queue or
// message the store did not find 404, the database
// away 503 with Retry-After, anything else 500 with a generic text and the
// details in the log).
//
// It holds no route, no token check and no state of its own: it imports
// queue only to tell the store's errors apart (queue.IsInputError,
// queue.ErrForeign, queue.ErrQueueNotFound, queue.ErrMessageNotFound,
// queue.IsUnavailable, queue.OutageLog).
package httpapi
