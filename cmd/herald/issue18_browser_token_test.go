package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jwt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/gateway"
	"github.com/heraldmq/herald/internal/pgtest"
)

// Issue 18: the browser SDK takes a token function, called on every
// connection and before the live token expires: a WebSocket subscription
// and an EventSource stream outlive several 2-second tokens, the socket
// never closed (auth frames), the stream reopened with a fresh token and
// resumed.
func TestIssue18_BrowserSDKTokenFunction(t *testing.T) {
	bin := buildHerald(t)
	secret := strings.Repeat("browser-", 5)
	p := startHerald(t, bin, dataDir(t), "--database-url", pgtest.DSN(t), "--auth-secret", secret)
	// Tokens of one subject expiring 2, 4, 6 … s from now, handed out in
	// turn by the page's token function (a page would fetch them).
	start := time.Now()
	var tokens []string
	for i := 1; i <= 12; i++ {
		tok, err := jwt.NewBuilder().Subject("browser").Claim("role", "read-write").
			Expiration(start.Add(time.Duration(2*i) * time.Second)).Build()
		require.NoError(t, err)
		b, err := jwt.Sign(tok, jwt.WithKey(jwa.HS256(), []byte(secret)))
		require.NoError(t, err)
		tokens = append(tokens, string(b))
	}
	list, err := json.Marshal(tokens)
	require.NoError(t, err)
	ctx := browser(t)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(p.url+"herald.js")))
	evalJS[string](ctx, t, fmt.Sprintf(`(async () => {
		const { Herald } = await import("/herald.js");
		const tokens = %s;
		const t = window.__t = { asked: 0, states: [], ws: [], sse: [], errors: [] };
		const h = window.__h = new Herald(location.origin, { token: async () => {
			// The freshest token not about to expire.
			const now = Date.now() / 1000;
			t.asked++;
			return tokens.find((k) => JSON.parse(atob(k.split(".")[1].replace(/-/g, "+").replace(/_/g, "/"))).exp > now + 1);
		} });
		h.onState((s) => t.states.push(s.state + (s.code ? ":" + s.code : "")));
		h.subscribe({ queue: "tok", consumerGroup: "ws", ack: "auto", onMessage: (m) => { t.ws.push(m.data); },
			onError: (e) => t.errors.push(e.message) });
		window.__es = h.eventSource({ queue: "tok", consumerGroup: "sse", ack: "auto",
			onMessage: (m) => { t.sse.push(m.data); }, onError: (e) => t.errors.push(e.message) });
		return "ok";
	})()`, list))
	admin := gateway.SignToken([]byte(secret), "ops", "admin", time.Hour)
	pushAs := func(n int) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, p.url+"api/v1/push",
			strings.NewReader(fmt.Sprintf(`{"items":[{"queue":"tok","payload":%d}]}`, n)))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+admin)
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = res.Body.Close()
		require.Equal(t, http.StatusCreated, res.StatusCode)
	}
	waitState(ctx, t, 10*time.Second, "connected", `window.__t.states.includes("connected")`)
	pushAs(1)
	waitState(ctx, t, 10*time.Second, "first message on both", `window.__t.ws.length >= 1 && window.__t.sse.length >= 1`)
	// Past the first three tokens' expiry.
	waitState(ctx, t, 20*time.Second, "tokens asked for", `window.__t.asked >= 5`)
	for time.Since(start) < 6500*time.Millisecond {
		time.Sleep(100 * time.Millisecond) // the tokens' own clock: past the third one's exp
	}
	pushAs(2)
	waitState(ctx, t, 10*time.Second, "second message on both", `window.__t.ws.includes(2) && window.__t.sse.includes(2)`)
	var rec struct {
		Asked  int
		States []string
		Errors []string
		WS     []int
		SSE    []int
	}
	require.NoError(t, json.Unmarshal([]byte(evalJS[string](ctx, t, `JSON.stringify(window.__t)`)), &rec))
	t.Logf("%+v", rec)
	assert.NotContains(t, rec.States, "reconnecting:4501", "the socket was refreshed in place")
	assert.NotContains(t, rec.States, "closed:4501")
	assert.Equal(t, 1, countOf(rec.States, "connected"), "one WebSocket connection throughout: %v", rec.States)
	assert.Empty(t, rec.Errors)
	assert.Equal(t, []int{1, 2}, rec.WS)
	assert.Equal(t, []int{1, 2}, rec.SSE, "the reopened stream resumed: nothing lost, nothing twice")
	_, err = chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void](`window.__es.close(); window.__h.close()`))
	require.NoError(t, err)
}

func countOf(xs []string, x string) int {
	n := 0
	for _, v := range xs {
		if v == x {
			n++
		}
	}
	return n
}
