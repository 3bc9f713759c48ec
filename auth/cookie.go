package auth

import (
	"mime"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// The cookie rule. A browser attaches a cookie to requests that pages of
// other sites make (a form, an <img>, a link, an EventSource or a
// WebSocket), so a token that came in the cookie alone — no Authorization
// header, no access_token, which a page must be given on purpose — proves
// only that the user's browser made the request, not that the user's page
// did. Such a request is honoured only when it cannot come from a page of
// another origin:
//
//  1. Its Origin, when it has one, is the server's own (scheme, host and
//     port) or an allowed one (the gateway's Config.AllowedOrigins).
//     Browsers send Origin on every POST, every cross-origin fetch or
//     EventSource, and every WebSocket upgrade.
//  2. Without an Origin, its Sec-Fetch-Site, when it has one, is neither
//     cross-site nor same-site: an <img>, a link or a form GET of another
//     origin sends no Origin, but a browser says where it comes from
//     (Chromium, Firefox and Safari send Sec-Fetch-Site to https and
//     loopback origins, not over plain http to other hosts).
//  3. By what its route does (its Effect, the mark the gateway gives a
//     route when it registers it):
//     - reads (a GET with no side effect): nothing more.
//     - streams (a GET event stream: it leases messages, and with
//     autoAck consumes them): Accept: text/event-stream, which an
//     EventSource always sends and a link, a form or an <img> cannot.
//     - changes (everything else, the default: push, ack, pop of any kind,
//     transactions, leases, configure, deletes, DLQ, seeks, maintenance,
//     traces): the header X-Herald-CSRF (any value), or Sec-Fetch-Site:
//     same-origin. A form, an <img> or a link cannot set a header, and a
//     page of another origin cannot send one with the cookie: that takes
//     a CORS preflight answered with Access-Control-Allow-Credentials,
//     which Herald never sends (it answers Access-Control-Allow-Origin: *).
//     - the WebSocket upgrade: its Origin is checked for every client
//     (CheckOrigin), so rules 1 and 2 are all there is; its frames come
//     from the page that opened it.
//
// A refusal is 403 with an error that names what was missing. Over plain
// http to a host other than localhost a browser sends no Sec-Fetch-Site,
// so a top-level navigation of another site carrying a SameSite=Lax
// cookie is told apart by the rules above only where it matters: it is a
// GET without X-Herald-CSRF (refused if it changes anything) and without
// Accept: text/event-stream (refused if it streams); what it reads goes to
// the user's tab, not to the other site. What remains there: a no-cors
// fetch may set Accept: text/event-stream and sends neither Origin nor
// Sec-Fetch-Site over plain http, exactly as a same-origin EventSource
// does; only the cookie's SameSite keeps it from other sites, and nothing
// keeps it from another port of the same host (same site). The docs say
// so: serve Herald over https (or at localhost) where pages of other
// origins share its host.

// CSRFHeader is the request header that lets the cookie alone authorize a
// change: a page of another origin cannot send it with the user's cookie.
// The browser SDK (web/herald.js) sends it on every request.
const CSRFHeader = "X-Herald-CSRF"

// Effect is what a route does, as the cookie rule sees it; the gateway
// marks each route when it registers it.
type Effect int

// Effects.
const (
	Changes  Effect = iota // the default: a state change
	Reads                  // a GET with no side effect
	Streams                // a GET event stream (SSE): it leases, and may consume
	Upgrades               // the WebSocket upgrade, whose Origin CheckOrigin checks
)

// cookieRefused is a refusal by the cookie rule (403).
type cookieRefused string

func (e cookieRefused) Error() string { return "cookie refused: " + string(e) }
func (e cookieRefused) Unwrap() error { return ErrForbidden }

// CookieRule returns why a request whose token came in the cookie alone
// may not do what its route does (eff), or nil; allowed are the origins
// besides the server's own, as NormalOrigin writes them. A refusal wraps
// ErrForbidden.
func CookieRule(r *http.Request, eff Effect, allowed []string) error {
	origin := r.Header.Get("Origin")
	site := strings.ToLower(r.Header.Get("Sec-Fetch-Site"))
	switch {
	case origin != "" && !originAllowed(r, origin, allowed):
		return cookieRefused("the request comes from a page of another origin (Origin: " + origin +
			"); send the token in an Authorization header")
	case origin == "" && (site == "cross-site" || site == "same-site"):
		return cookieRefused("the request comes from a page of another origin (Sec-Fetch-Site: " + site +
			"); send the token in an Authorization header")
	}
	switch eff {
	case Streams:
		if !acceptsEventStream(r) {
			return cookieRefused("an event stream on the cookie alone is opened by an EventSource (Accept: text/event-stream)")
		}
	case Changes:
		if r.Header.Get(CSRFHeader) == "" && site != "same-origin" {
			return cookieRefused("a request that changes state on the cookie alone needs the header " + CSRFHeader +
				" (or Sec-Fetch-Site: same-origin), or the token in an Authorization header")
		}
	}
	return nil
}

// acceptsEventStream reports whether the Accept header names
// text/event-stream.
func acceptsEventStream(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for part := range strings.SplitSeq(v, ",") {
			if t, _, err := mime.ParseMediaType(part); err == nil && t == "text/event-stream" {
				return true
			}
		}
	}
	return false
}

// CheckOrigin tells whether a WebSocket upgrade may proceed: a client that
// is not a browser sends no Origin; a browser page's must be the server's
// own or one of allowed (as NormalOrigin writes them).
func CheckOrigin(r *http.Request, allowed []string) bool {
	origin := r.Header.Get("Origin")
	return origin == "" || originAllowed(r, origin, allowed)
}

// originAllowed reports whether origin (an Origin header) is the server's
// own — the scheme the request came over, and its Host — or one of
// allowed.
func originAllowed(r *http.Request, origin string, allowed []string) bool {
	o, ok := NormalOrigin(origin)
	if !ok {
		return false // "null" (a sandboxed frame, a file) and anything malformed
	}
	if own, ok := NormalOrigin(requestScheme(r) + "://" + r.Host); ok && own == o {
		return true
	}
	return slices.Contains(allowed, o)
}

// requestScheme is the scheme the browser used: https over TLS, or when a
// proxy that ended TLS says so in X-Forwarded-Proto (a page cannot set that
// header on a form, a link, an <img> or a WebSocket), else http.
func requestScheme(r *http.Request) string {
	if r.TLS != nil {
		return "https"
	}
	proto, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Proto"), ",")
	if strings.EqualFold(strings.TrimSpace(proto), "https") {
		return "https"
	}
	return "http"
}

// ValidOrigin reports whether s is an origin as the gateway's
// Config.AllowedOrigins takes one: scheme://host[:port], http or https,
// nothing after it.
func ValidOrigin(s string) bool {
	_, ok := NormalOrigin(s)
	return ok
}

// NormalOrigin returns an origin as browsers serialize it — lower case,
// without its scheme's default port — and whether s is one: http or https,
// a host, nothing after it.
func NormalOrigin(s string) (string, bool) {
	u, err := url.Parse(strings.TrimSuffix(s, "/"))
	if err != nil || u.Host == "" || u.User != nil || u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return "", false
	}
	scheme := strings.ToLower(u.Scheme)
	if scheme != "http" && scheme != "https" {
		return "", false
	}
	host := strings.ToLower(u.Host)
	if h, port, err := net.SplitHostPort(host); err == nil && (scheme == "http" && port == "80" || scheme == "https" && port == "443") {
		host = h
		if strings.Contains(h, ":") {
			host = "[" + h + "]"
		}
	}
	return scheme + "://" + host, true
}
