// Package web is the demo page and the browser SDK, plain HTML, CSS and
// ES modules with no build step, embedded in the binary with go:embed and
// served by the gateway at / (Handler, Names).
//
//	index.html, app.css, app.js   the demo page: subscriptions over a
//	                              WebSocket or an EventSource, a live feed
//	                              that follows a queue, a push form, a live
//	                              panel of /internal/api/status
//	herald.js                     the browser SDK (an ES module): subscribe
//	                              over one WebSocket with reconnect and acks,
//	                              eventSource over SSE, follow (the SSE follow
//	                              route, resumed after its last event id), push
//
// The page loads nothing from the internet at run time
// (TestNoRemoteAssets). Every file is answered with Cache-Control:
// no-cache, so a browser revalidates it against the running binary and
// gets a 304 when nothing changed; a name that is not one of the files is
// 404. The package starts no goroutine and holds no state beyond the
// embedded files.
package web
