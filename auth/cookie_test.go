package auth_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/heraldmq/herald/auth"
)

// request is a request to host h with the given headers.
func request(hdr map[string]string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "http://h:8080/api/v1/x", nil)
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	return r
}

// A request on the cookie alone is honoured only when no page of another
// origin could have sent it: by its Origin (the server's own or an
// allowed one), else by its Sec-Fetch-Site, and then by what its route
// does (a stream needs an EventSource's Accept, a change the CSRF header
// or Sec-Fetch-Site: same-origin). Every refusal is ErrForbidden.
func TestCookieRule_HonoursOnlyWhatNoOtherOriginCouldSend(t *testing.T) {
	allowed := []string{"https://app.example"}
	for _, c := range []struct {
		name string
		eff  auth.Effect
		hdr  map[string]string
		ok   bool
	}{
		{"own origin, read", auth.Reads, map[string]string{"Origin": "http://h:8080"}, true},
		{"own origin in other case, read", auth.Reads, map[string]string{"Origin": "HTTP://H:8080"}, true},
		{"allowed origin, read", auth.Reads, map[string]string{"Origin": "https://app.example:443"}, true},
		{"other origin, read", auth.Reads, map[string]string{"Origin": "http://evil.example"}, false},
		{"other port, read", auth.Reads, map[string]string{"Origin": "http://h:9090"}, false},
		{"https origin over plain http", auth.Reads, map[string]string{"Origin": "https://h:8080"}, false},
		{"https origin behind a TLS proxy", auth.Reads, map[string]string{"Origin": "https://h:8080", "X-Forwarded-Proto": "https"}, true},
		{"null origin", auth.Reads, map[string]string{"Origin": "null"}, false},
		{"cross-site fetch, no origin", auth.Reads, map[string]string{"Sec-Fetch-Site": "cross-site"}, false},
		{"same-site fetch, no origin", auth.Reads, map[string]string{"Sec-Fetch-Site": "same-site"}, false},
		{"no origin, no fetch metadata, read", auth.Reads, nil, true},
		{"stream without Accept", auth.Streams, nil, false},
		{"stream from an EventSource", auth.Streams, map[string]string{"Accept": "text/event-stream"}, true},
		{"stream, Accept among others", auth.Streams, map[string]string{"Accept": "text/html, text/event-stream;q=0.9"}, true},
		{"change without the CSRF header", auth.Changes, map[string]string{"Origin": "http://h:8080"}, false},
		{"change with the CSRF header", auth.Changes, map[string]string{"Origin": "http://h:8080", auth.CSRFHeader: "1"}, true},
		{"change, same-origin fetch", auth.Changes, map[string]string{"Sec-Fetch-Site": "same-origin"}, true},
		{"change with the header from another origin", auth.Changes, map[string]string{"Origin": "http://evil.example", auth.CSRFHeader: "1"}, false},
		{"upgrade from its own origin", auth.Upgrades, map[string]string{"Origin": "http://h:8080"}, true},
		{"upgrade from another origin", auth.Upgrades, map[string]string{"Origin": "http://evil.example"}, false},
	} {
		err := auth.CookieRule(request(c.hdr), c.eff, allowed)
		if c.ok {
			assert.NoError(t, err, c.name)
		} else {
			assert.ErrorIs(t, err, auth.ErrForbidden, c.name)
		}
	}
}

// A WebSocket upgrade's Origin must be the server's own or an allowed one;
// a client that sends none is not a browser and is let through.
func TestCheckOrigin_AllowsOwnAllowedAndNonBrowsers(t *testing.T) {
	allowed := []string{"https://app.example"}
	for origin, want := range map[string]bool{
		"":                     true,
		"http://h:8080":        true,
		"https://app.example":  true,
		"http://app.example":   false,
		"http://evil.example":  false,
		"null":                 false,
		"http://h:8080/path":   false,
		"ws://h:8080":          false,
		"http://user@h:8080":   false,
		"https://app.example/": true,
	} {
		r := request(nil)
		if origin != "" {
			r.Header.Set("Origin", origin)
		}
		assert.Equal(t, want, auth.CheckOrigin(r, allowed), "Origin %q", origin)
	}
}

// Origins are compared as browsers serialize them: lower case, without
// the scheme's default port; anything but scheme://host[:port] over http
// or https is not an origin.
func TestNormalOrigin_AsBrowsersWriteIt(t *testing.T) {
	for in, want := range map[string]string{
		"HTTPS://Example.COM:443/": "https://example.com",
		"http://example.com:80":    "http://example.com",
		"http://[::1]:80":          "http://[::1]",
		"http://[::1]:8080":        "http://[::1]:8080",
		"https://example.com:80":   "https://example.com:80",
	} {
		got, ok := auth.NormalOrigin(in)
		assert.True(t, ok, in)
		assert.Equal(t, want, got, in)
		assert.True(t, auth.ValidOrigin(in), in)
	}
	for _, bad := range []string{"", "null", "example.com", "ftp://example.com", "http://example.com/app",
		"http://example.com?x=1", "http://example.com#f", "http://u:p@example.com", "*"} {
		_, ok := auth.NormalOrigin(bad)
		assert.False(t, ok, bad)
		assert.False(t, auth.ValidOrigin(bad), bad)
	}
}
