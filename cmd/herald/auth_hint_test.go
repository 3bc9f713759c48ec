package main

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/internal/pgtest"
)

// tokenCommand is the command the console and the demo page name when auth
// is on and their token is missing or too weak.
const tokenCommand = "herald token --sub ops --role admin"

// With auth on, the console says once what to do when its token is missing
// (or invalid) and when it lacks rights, naming the command that makes an
// admin token; every panel that failed says so in a few words, not the
// whole advice again. The demo page without a token says auth is on and
// how to get a token, never that the instance is unreachable.
func TestConsoleAndDemo_SayHowToGetATokenWhenAuthIsOn(t *testing.T) {
	bin := buildHerald(t)
	secret := strings.Repeat("consoletok-", 4)
	p := startHerald(t, bin, dataDir(t), "--database-url", pgtest.DSN(t), "--auth-secret", secret)
	ctx := browser(t)
	text := func() string { return evalJS[string](ctx, t, `Promise.resolve(document.body.innerText)`) }

	// The console, no token: the overview's calls are answered 401.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(p.url+"console")))
	waitState(ctx, t, 15*time.Second, "the console names the token command",
		`document.body.innerText.includes("`+tokenCommand+`") && !document.body.innerText.includes("Loading…")`)
	body := text()
	assert.Equal(t, 1, strings.Count(body, tokenCommand), "the command once: %s", body)
	assert.LessOrEqual(t, strings.Count(body, "paste"), 1, "the advice once, not per panel: %s", body)
	assert.NotContains(t, body, "unreachable", "a 401 is not an unreachable server: %s", body)
	shot(ctx, t, "console-auth-missing.png", false)

	// A read-only token: the console needs admin, and says so once.
	weak := auth.SignToken([]byte(secret), "viewer", "read-only", time.Hour)
	require.NoError(t, chromedp.Do(ctx, chromedp.SetValue(chromedp.ID("token"), weak),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`))))
	waitState(ctx, t, 15*time.Second, "the console says the token lacks rights",
		`document.body.innerText.includes("role admin") && document.body.innerText.includes("`+tokenCommand+`")`)
	body = text()
	assert.Equal(t, 1, strings.Count(body, tokenCommand), "the command once: %s", body)
	shot(ctx, t, "console-auth-weak.png", false)

	// An admin token: the advice goes away.
	admin := auth.SignToken([]byte(secret), "ops", "admin", time.Hour)
	require.NoError(t, chromedp.Do(ctx, chromedp.SetValue(chromedp.ID("token"), admin),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`))))
	waitState(ctx, t, 15*time.Second, "the advice is gone with an admin token",
		`!document.body.innerText.includes("`+tokenCommand+`") && document.querySelector("#instance").textContent.includes("·")`)

	// The demo page, no token.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(p.url)))
	waitState(ctx, t, 15*time.Second, "the demo page names the token command",
		`document.body.innerText.includes("`+tokenCommand+`")`)
	body = text()
	assert.NotContains(t, body, "unreachable", "auth on and no token is not an unreachable instance: %s", body)
	assert.NotContains(t, body, "HTTP 401", body)
	assert.Equal(t, 1, strings.Count(body, tokenCommand), "the command once: %s", body)
	assert.Contains(t, body, "access_token", "the page says how to give it the token")
	shot(ctx, t, "demo-auth-missing.png", false)
}
