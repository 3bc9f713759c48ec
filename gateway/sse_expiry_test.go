package gateway_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/gateway"
)

// TestSSE_StreamClosesAtTokenExpiry: an SSE stream opened with a token
// that expires ends at exp (leeway zero here) with event: disconnect
// {code 4501}, as a WebSocket closes with 4501; what it held goes back as
// for any closed stream, and what is pushed after exp goes to another
// consumer, never to the expired stream.
func TestSSE_StreamClosesAtTokenExpiry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *gateway.Config) {
		c.Auth = &auth.Auth{Secret: authSecret} // no leeway: the stream ends at exp itself
		c.SSEResumeGrace = 100 * time.Millisecond
	})
	admin := auth.SignToken(authSecret, "ops", "admin", 0)
	// exp is whole seconds: 3 s ahead is at least 2 s, time to see a delivery.
	reader := auth.SignToken(authSecret, "browser", "read-write", 3*time.Second) // a stream leases: read-write
	claims, err := (&auth.Auth{Secret: authSecret}).Verify(reader, time.Now())
	require.NoError(t, err)
	exp := claims.Expires

	c := e.openSSE(t, "/api/v1/sse/queue/sse-exp?access_token="+url.QueryEscape(reader), nil)
	require.Equal(t, http.StatusOK, c.res.StatusCode)
	r := e.doAuth(http.MethodPost, "/api/v1/push", admin, `{"items":[{"queue":"sse-exp","payload":"before"}]}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r)
	m, _ := c.next()
	assert.JSONEq(t, `"before"`, string(m.Data))
	require.True(t, time.Now().Before(exp), "the delivery came before exp")

	// The stream ends by itself at exp; its last event says why.
	rest := c.waitEnd()
	ended := time.Now()
	assert.False(t, ended.Before(exp), "the stream ended %v before exp", exp.Sub(ended))
	assert.Less(t, ended.Sub(exp), 2*time.Second, "the stream ended long after exp")
	require.NotEmpty(t, rest, "no event before the end")
	last := rest[len(rest)-1]
	assert.Equal(t, "disconnect", last.event, "the last event: %+v", last)
	var d struct {
		Code   int    `json:"code"`
		Reason string `json:"reason"`
	}
	require.NoError(t, json.Unmarshal([]byte(last.data), &d), last.data)
	assert.Equal(t, gateway.CloseUnauthorized, d.Code)
	assert.Equal(t, "token expired", d.Reason)
	for _, ev := range rest {
		assert.NotEqual(t, "message", ev.event, "a message after exp: %+v", ev)
	}
	// The same token is refused over HTTP now, as it was on the stream.
	assert.Equal(t, http.StatusUnauthorized, e.doAuth(http.MethodGet, "/api/v1/pop/queue/sse-exp", reader, "").status)

	// A push after exp goes to another consumer, with the expired stream's
	// unacknowledged message once its resume grace is over.
	r = e.doAuth(http.MethodPost, "/api/v1/push", admin, `{"items":[{"queue":"sse-exp","payload":"after"}]}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r)
	var got []string
	eventually(t, func() bool {
		r := e.doAuth(http.MethodGet, "/api/v1/pop/queue/sse-exp?batch=10", admin, "")
		if r.status == http.StatusOK {
			var p popResult
			require.NoError(t, json.Unmarshal(r.body, &p))
			for _, m := range p.Messages {
				got = append(got, string(m.Data))
			}
		}
		return len(got) >= 2
	}, "the other consumer did not get both messages")
	sort.Strings(got)
	assert.Equal(t, []string{`"after"`, `"before"`}, got)
}
