package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/queue"
)

// chromium is Debian's browser (.ci/run installs it).
const chromium = "/usr/bin/chromium"

// browser starts headless Chromium for the test and returns a tab; more
// adds allocator options.
func browser(t *testing.T, more ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	_, err := os.Stat(chromium)
	require.NoError(t, err, "the browser test needs Chromium (apt-get install -y chromium)")
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.Headless,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1280, 1400))
	opts = append(opts, more...)
	// Chromium itself, not what the test looks at, now and then fails to
	// start on a loaded machine ("Zygote could not fork"): a fresh one is
	// started, three times at most.
	err = nil
	for range 3 {
		alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
		ctx, cancelTab := chromedp.NewContext(alloc)
		if err = chromedp.Do(ctx); err == nil { // starts the browser and its tab
			ctx, cancelTimeout := context.WithTimeout(ctx, 3*time.Minute)
			t.Cleanup(func() {
				cancelTimeout()
				cancelTab()
				cancelAlloc()
			})
			return ctx
		}
		t.Logf("chromium did not start, starting another: %v", err)
		cancelTab()
		cancelAlloc()
	}
	require.NoError(t, err, "starting chromium")
	return nil
}

// artifact writes a test artifact (a screenshot) to $HERALD_ARTIFACTS, or
// to herald-artifacts in the temp directory, and logs where.
func artifact(t *testing.T, name string, b []byte) {
	t.Helper()
	dir := os.Getenv("HERALD_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "herald-artifacts")
	}
	require.NoError(t, os.MkdirAll(dir, 0o750))
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, b, 0o600))
	t.Logf("artifact: %s (%d bytes)", path, len(b))
}

func freeTCP(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// waitJS waits until a JavaScript expression is true in the page.
func waitJS(ctx context.Context, t *testing.T, what, expr string) {
	t.Helper()
	_, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(50*time.Millisecond),
		chromedp.WithPollingTimeout(60*time.Second)))
	if err != nil {
		page, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("main").innerText`))
		t.Fatalf("%s: %v\npage:\n%s", what, err, page)
	}
}

// The demo page in real headless Chromium: subscribe by EventSource and by
// WebSocket, push 20 messages from the page, see all 20 in each, ack them;
// the server restarts, the page reconnects and receives what was pushed
// meanwhile.
func TestBrowser_DemoPage(t *testing.T) {
	bin := buildHerald(t)
	dsn := pgtest.DSN(t)
	addr := freeTCP(t)
	start := func() *proc {
		return startHerald(t, bin, dataDir(t), "--database-url", dsn, "--addr", addr, "--drain-window", "200ms")
	}
	p := start()
	ctx := browser(t)

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(p.url),
		chromedp.WaitVisible(chromedp.ID("subscribe")),
	))
	waitJS(ctx, t, "the live panel names this instance", `document.getElementById("instance").textContent.includes(":")`)
	labelled, err := chromedp.Run(ctx, chromedp.Evaluate[bool](
		`[...document.querySelectorAll("input, select, textarea")].every((e) => e.labels.length > 0)`))
	require.NoError(t, err)
	require.True(t, labelled, "every control has a label")

	subscribe := func(transport, group string) {
		t.Helper()
		require.NoError(t, chromedp.Do(ctx,
			chromedp.SetValue(chromedp.ID("queue"), "browser"),
			chromedp.SetValue(chromedp.ID("group"), group),
			chromedp.SetValue(chromedp.ID("transport"), transport),
			chromedp.SetValue(chromedp.ID("ackmode"), "manual"),
			chromedp.Click(chromedp.ID("subscribe")),
		))
	}
	subscribe("sse", "es") // card sub-1
	subscribe("ws", "ws")  // card sub-2
	for _, id := range []string{"sub-1", "sub-2"} {
		waitJS(ctx, t, id+" connects", fmt.Sprintf(`document.getElementById(%q)?.dataset.state === "connected"`, id))
	}
	count := func(id string) string {
		return fmt.Sprintf(`document.querySelector("#%s .count").textContent`, id)
	}

	// 20 messages from the page's push form.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SetValue(chromedp.ID("count"), "20"),
		chromedp.SetValue(chromedp.ID("rate"), "0"),
		chromedp.Click(chromedp.ID("push")),
	))
	waitJS(ctx, t, "the page pushed 20", `document.getElementById("push-status").dataset.pushed === "20"`)
	for _, id := range []string{"sub-1", "sub-2"} {
		waitJS(ctx, t, id+" shows all 20", count(id)+` === "20"`)
		waitJS(ctx, t, id+" rows", fmt.Sprintf(`document.querySelectorAll("#%s tbody tr").length === 20`, id))
	}

	// Ack them from the page: both groups have nothing left.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS("#sub-1 .ack-all")),
		chromedp.Click(chromedp.CSS("#sub-2 .ack-all")),
	))
	waitJS(ctx, t, "every row acked", `document.querySelectorAll("tbody tr.acked").length === 40`)
	lagZero := func(url string) bool {
		_, body := get(t, url+"internal/api/status?queue=browser")
		var st struct {
			Queue queue.QueueStatus `json:"queue"`
		}
		if json.Unmarshal([]byte(body), &st) != nil || len(st.Queue.Groups) != 2 {
			return false
		}
		for _, g := range st.Queue.Groups {
			if g.Lag != 0 || g.Leased != 0 {
				return false
			}
		}
		return true
	}
	require.Eventually(t, func() bool { return lagZero(p.url) }, 20*time.Second, 50*time.Millisecond,
		"the server has every message acked by both groups")
	waitJS(ctx, t, "the chart has drawn a second with messages", `document.getElementById("chart-now").textContent.startsWith("Last second:")`)
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	artifact(t, "demo-page.png", shot)

	// A phone's width: nothing overflows sideways.
	require.NoError(t, chromedp.Do(ctx, chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile)))
	waitJS(ctx, t, "no horizontal overflow at 390 px", `document.documentElement.scrollWidth <= window.innerWidth`)
	shot, err = chromedp.Run(ctx, chromedp.CaptureScreenshot())
	require.NoError(t, err)
	artifact(t, "demo-phone.png", shot)
	require.NoError(t, chromedp.Do(ctx, chromedp.EmulateViewport(1280, 1400)))

	// The server goes away; both subscriptions show that they reconnect.
	require.NoError(t, p.stop(t, syscall.SIGTERM))
	for _, id := range []string{"sub-1", "sub-2"} {
		waitJS(ctx, t, id+" reconnects", fmt.Sprintf(`document.getElementById(%q).dataset.state === "reconnecting"`, id))
	}
	state, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#sub-2 .state")))
	require.NoError(t, err)
	require.Contains(t, state, "attempt", "the reconnect state is visible")
	shot, err = chromedp.Run(ctx, chromedp.CaptureScreenshot())
	require.NoError(t, err)
	artifact(t, "demo-reconnecting.png", shot)

	// Meanwhile 5 messages are pushed straight into the database.
	pool, err := queue.NewPool(context.Background(), dsn, 0)
	require.NoError(t, err)
	defer pool.Close()
	store, err := queue.New(queue.Config{Pool: pool})
	require.NoError(t, err)
	var items []queue.PushItem
	for i := range 5 {
		items = append(items, queue.PushItem{Queue: "browser", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d,"while":"down"}`, 21+i))})
	}
	_, err = store.Push(context.Background(), items)
	require.NoError(t, err)

	p = start()
	for _, id := range []string{"sub-1", "sub-2"} {
		waitJS(ctx, t, id+" is back", fmt.Sprintf(`document.getElementById(%q).dataset.state === "connected"`, id))
		waitJS(ctx, t, id+" got what was pushed while the server was down", count(id)+` === "25"`)
	}
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](`document.querySelectorAll("tbody tr td.data").length === 50 &&
		[...document.querySelectorAll("tbody tr td.data")].filter(td => td.textContent.includes('"while":"down"')).length === 10`,
		chromedp.WithPollingTimeout(10*time.Second)))
	require.NoError(t, err, "each subscription shows the 5 messages pushed meanwhile, and nothing twice")
	// Over the WebSocket: ack four, then nack the last (a failed ack ends
	// the lease): it comes again, delivery 2, and nothing else does.
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#sub-1 .ack-all"))))
	_, err = chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void](
		`document.querySelectorAll("#sub-2 tbody tr:nth-child(n+2) button.ack").forEach((b) => b.click())`))
	require.NoError(t, err)
	waitJS(ctx, t, "four acked", `document.querySelectorAll("#sub-2 tbody tr.acked").length === 24`)
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#sub-2 tbody tr:first-child button.nack"))))
	waitJS(ctx, t, "the nacked message is delivered again", `document.querySelector("#sub-2 .count").textContent === "26" &&
		document.querySelector("#sub-2 tbody tr:first-child td:nth-child(3)").textContent === "2"`)
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#sub-2 .ack-all"))))
	require.Eventually(t, func() bool { return lagZero(p.url) }, 20*time.Second, 50*time.Millisecond)
	require.NoError(t, p.stop(t, syscall.SIGTERM))
}

// csrfPage is a page of another origin that holds nothing but the user's
// cookie and tries, at once: a WebSocket that pushes, a text/plain form
// POST to /api/v1/push, a pop with autoAck by <img> and by a form GET (of
// two queues: a form GET answered 204 would never load its frame).
const csrfPage = `<!doctype html><title>another site</title>
<iframe name="sink1"></iframe><iframe name="sink2"></iframe>
<form id="push" method="POST" action="{{H}}api/v1/push" enctype="text/plain" target="sink1">
<input name='{"items":[{"queue":"{{V}}-push","payload":"' value='x"}]}'></form>
<form id="pop" method="GET" action="{{H}}api/v1/pop/queue/{{V}}-popform" target="sink2">
<input name="autoAck" value="true"><input name="wait" value="false"></form>
<script>
const r = window.__r = { ws: "connecting", push: false, pop: false, img: false };
const ws = new WebSocket("{{H}}".replace(/^http/, "ws") + "api/v1/ws");
ws.onopen = () => {
  r.ws = "open";
  ws.send(JSON.stringify({ type: "push", id: 1, items: [{ queue: "{{V}}-ws", payload: 1 }] }));
};
ws.onclose = (e) => { if (r.ws !== "open") r.ws = "closed:" + e.code; };
document.querySelector("iframe[name=sink1]").onload = () => { r.push = true; };
document.querySelector("iframe[name=sink2]").onload = () => { r.pop = true; };
const img = new Image();
img.onload = img.onerror = () => { r.img = true; document.getElementById("pop").submit(); };
img.src = "{{H}}api/v1/pop/queue/{{V}}-pop?wait=false&autoAck=true";
document.getElementById("push").submit();
</script>`

// A page of another origin, holding only the user's cookie (set
// SameSite=None, so that the browser sends it everywhere and what refuses
// is the server), can neither open a WebSocket, nor push with a
// text/plain form, nor consume a message with a GET pop (an <img>, a
// form). Tested from another port of the same host (same site, another
// origin: SameSite=Strict would not stop the browser either) and from
// another site (127.0.0.1 against localhost). The server's own page keeps
// working on the cookie alone: herald.js pushes, subscribes over a
// WebSocket and an EventSource, and acks.
func TestBrowser_ForeignPageCannotUseTheCookie(t *testing.T) {
	bin := buildHerald(t)
	secret := strings.Repeat("cookies-", 5)
	p := startHerald(t, bin, dataDir(t), "--database-url", pgtest.DSN(t), "--auth-secret", secret, "--auth-cookie", "herald_token")
	user := auth.SignToken([]byte(secret), "user", "read-write", time.Hour)
	admin := auth.SignToken([]byte(secret), "ops", "admin", time.Hour)
	bearer := func(method, path, body string) int {
		req, err := http.NewRequestWithContext(t.Context(), method, p.url+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+admin)
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = res.Body.Close()
		return res.StatusCode
	}
	// This Chromium blocks third-party cookies by default (a user
	// preference): allowed here, so that another site's requests carry the
	// cookie and the server's check is what is tested.
	profile := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(profile, "Default"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(profile, "Default", "Preferences"),
		[]byte(`{"profile":{"cookie_controls_mode":0,"block_third_party_cookies":false}}`), 0o600))
	ctx := browser(t, chromedp.UserDataDir(profile), chromedp.Flag("host-resolver-rules", "MAP herald.test 127.0.0.1"))
	require.NoError(t, chromedp.Do(ctx)) // the browser starts
	yes, no := true, false
	_, err := chromedp.Call(ctx, network.SetCookie, network.SetCookieParams{Name: "herald_token", Value: user, URL: p.url, Path: "/",
		HTTPOnly: &yes, Secure: &yes, SameSite: network.CookieSameSiteNone})
	require.NoError(t, err)

	// The server's own page, on the cookie alone (no token given to
	// herald.js): at localhost, where Chromium sends Sec-Fetch-Site, and
	// at a name over plain http, where it sends none and herald.js's
	// X-Herald-CSRF is what lets its changes through (the cookie there is
	// SameSite=Lax, not Secure: plain http).
	plain := strings.Replace(p.url, "localhost", "herald.test", 1)
	_, err = chromedp.Call(ctx, network.SetCookie, network.SetCookieParams{Name: "herald_token", Value: user, URL: plain, Path: "/",
		HTTPOnly: &yes, Secure: &no, SameSite: network.CookieSameSiteLax})
	require.NoError(t, err)
	for _, base := range []string{p.url, plain} {
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base+"herald.js")))
		evalJS[string](ctx, t, `(async () => {
			const { Herald } = await import("/herald.js");
			const o = window.__own = { got: [], acked: [], errors: [] };
			const h = window.__h = new Herald(location.origin);
			await h.push("own", [1]);
			h.subscribe({ queue: "own", consumerGroup: "ws", onMessage: () => { o.got.push("ws"); },
				onAck: () => o.acked.push("ws"), onError: (e) => o.errors.push(e.message) });
			window.__es = h.eventSource({ queue: "own", consumerGroup: "sse", onMessage: () => { o.got.push("sse"); },
				onAck: () => o.acked.push("sse"), onError: (e) => o.errors.push(e.message) });
			return "ok";
		})()`)
		waitJS(ctx, t, base+": the own page receives over both", `window.__own.got.includes("ws") && window.__own.got.includes("sse")`)
		waitJS(ctx, t, base+": the own page's acks were taken (a WebSocket frame, an HTTP POST)",
			`window.__own.acked.includes("ws") && window.__own.acked.includes("sse")`)
		assert.Empty(t, evalJS[[]string](ctx, t, `window.__own.errors`), base)
		_, err = chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void](`window.__es.close(); window.__h.close()`))
		require.NoError(t, err)
	}

	heraldPort := strings.TrimSuffix(strings.TrimPrefix(p.url, "http://localhost:"), "/")
	for _, v := range []struct{ name, host string }{{"sameSite", "localhost"}, {"crossSite", "127.0.0.1"}} {
		for _, q := range []string{v.name + "-pop", v.name + "-popform"} {
			require.Equal(t, http.StatusCreated, bearer("POST", "api/v1/push", `{"items":[{"queue":"`+q+`","payload":1}]}`))
		}
		page := strings.NewReplacer("{{H}}", p.url, "{{V}}", v.name).Replace(csrfPage)
		foreign := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			_, _ = w.Write([]byte(page))
		}))
		t.Cleanup(foreign.Close)
		_, port, err := net.SplitHostPort(foreign.Listener.Addr().String())
		require.NoError(t, err)
		require.NotEqual(t, heraldPort, port)
		before := metricValue(t, p.url, `herald_auth_failures_total{reason="cross_site"}`)
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("http://"+v.host+":"+port+"/")))
		_, err = chromedp.Run(ctx, chromedp.Poll[bool](
			`window.__r && window.__r.ws !== "connecting" && window.__r.push && window.__r.img && window.__r.pop`,
			chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(60*time.Second)))
		require.NoError(t, err, "%s: the page's requests are not done: %s", v.name, evalJS[string](ctx, t, `JSON.stringify(window.__r)`))
		assert.True(t, strings.HasPrefix(evalJS[string](ctx, t, `window.__r.ws`), "closed:"), "%s: the WebSocket was refused", v.name)
		assert.Equal(t, http.StatusNoContent, bearer("GET", "api/v1/pop/queue/"+v.name+"-push?wait=false", ""), "%s: the form pushed nothing", v.name)
		assert.Equal(t, http.StatusNoContent, bearer("GET", "api/v1/pop/queue/"+v.name+"-ws?wait=false", ""), "%s: the WebSocket pushed nothing", v.name)
		assert.Equal(t, http.StatusOK, bearer("GET", "api/v1/pop/queue/"+v.name+"-pop?wait=false", ""),
			"%s: the <img> consumed nothing", v.name)
		assert.Equal(t, http.StatusOK, bearer("GET", "api/v1/pop/queue/"+v.name+"-popform?wait=false", ""),
			"%s: the form GET consumed nothing", v.name)
		// The cookie went with them, and the server refused it (the form
		// POST, the <img>, the form GET).
		assert.GreaterOrEqual(t, metricValue(t, p.url, `herald_auth_failures_total{reason="cross_site"}`)-before, 3.0,
			"%s: the browser sent the cookie; the server refused it", v.name)
	}
}

// The demo page's live feed follows a queue (herald.js follow() over the
// SSE follow route): each message with its event id, and the queue's
// followers on this instance. The server restarts: the feed shows that it
// reconnects, then that it resumed after its last event id, and the
// messages pushed meanwhile arrive, none lost, none twice, in order.
func TestBrowser_DemoLiveFeedResumes(t *testing.T) {
	bin := buildHerald(t)
	dsn := pgtest.DSN(t)
	addr := freeTCP(t)
	start := func() *proc {
		return startHerald(t, bin, dataDir(t), "--database-url", dsn, "--addr", addr, "--drain-window", "200ms")
	}
	p := start()
	ctx := browser(t)
	card := `document.getElementById("feed-card").dataset`
	var resumed bool
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(p.url),
		chromedp.WaitVisible(chromedp.ID("follow")),
		chromedp.SetValue(chromedp.ID("feed-queue"), "feed"),
		chromedp.Click(chromedp.ID("follow")),
	))
	waitJS(ctx, t, "the feed follows", card+`.state === "connected"`)
	// Beside it, a plain EventSource on another queue, from now: only the
	// browser's own Last-Event-ID (the start's id the stream opened with)
	// can bring it back after the restart below without a loss.
	_, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(() => {
		window.__plain = []; window.__plainOpen = 0;
		const es = window.__plainES = new EventSource("/api/v1/follow/queue/plain");
		es.onopen = () => window.__plainOpen++;
		es.onmessage = (e) => window.__plain.push(JSON.parse(e.data).data.n);
		return "ok"; })()`))
	require.NoError(t, err)
	waitJS(ctx, t, "the plain EventSource is open", `window.__plainOpen === 1`)
	waitJS(ctx, t, "the page shows one follower", card+`.followers === "1" &&
		document.getElementById("feed-followers").textContent.startsWith("1 follower of feed")`)
	push := func(from, to int) string {
		var items []string
		for i := from; i <= to; i++ {
			items = append(items, fmt.Sprintf(`{"queue":"feed","partition":"p","payload":{"n":%d}}`, i))
		}
		return `{"items":[` + strings.Join(items, ",") + `]}`
	}
	postJSON(t, p.url+"api/v1/push", push(1, 5))
	waitJS(ctx, t, "the feed shows 5", `document.getElementById("feed-count").textContent === "5"`)
	resumed, err = chromedp.Run(ctx, chromedp.Evaluate[bool](`document.getElementById("feed-resumed").hidden && `+card+`.resumes === "0"`))
	require.NoError(t, err)
	require.True(t, resumed, "a first connect says nothing of a resume")
	shotOf := func(name string) {
		t.Helper()
		require.NoError(t, chromedp.Do(ctx, chromedp.ScrollIntoView(chromedp.ID("feed-card"))))
		b, err := chromedp.Run(ctx, chromedp.Screenshot(chromedp.ID("feed-card")))
		require.NoError(t, err)
		artifact(t, name, b)
	}
	shotOf("demo-feed.png")
	require.NoError(t, chromedp.Do(ctx, chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile)))
	waitJS(ctx, t, "no horizontal overflow at 390 px", `document.documentElement.scrollWidth <= window.innerWidth`)
	shotOf("demo-feed-phone.png")
	require.NoError(t, chromedp.Do(ctx, chromedp.EmulateViewport(1280, 1400)))

	// The server goes away; 5 messages are pushed meanwhile, straight into
	// the database.
	require.NoError(t, p.stop(t, syscall.SIGTERM))
	waitJS(ctx, t, "the feed reconnects", card+`.state === "reconnecting" &&
		document.getElementById("feed-state").textContent.startsWith("Connection lost")`)
	pool, err := queue.NewPool(context.Background(), dsn, 0)
	require.NoError(t, err)
	defer pool.Close()
	store, err := queue.New(queue.Config{Pool: pool})
	require.NoError(t, err)
	var items []queue.PushItem
	for i := 6; i <= 10; i++ {
		items = append(items, queue.PushItem{Queue: "feed", Partition: "p", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))})
	}
	items = append(items, queue.PushItem{Queue: "plain", Payload: json.RawMessage(`{"n":1}`)})
	_, err = store.Push(context.Background(), items)
	require.NoError(t, err)

	p = start()
	waitJS(ctx, t, "the feed is back with what was pushed meanwhile", `document.getElementById("feed-count").textContent === "10"`)
	waitJS(ctx, t, "the plain EventSource reconnected by itself and got what was pushed meanwhile",
		`window.__plainOpen >= 2 && JSON.stringify(window.__plain) === "[1]"`)
	waitJS(ctx, t, "it says it resumed after its last id", card+`.resumes >= "1" &&
		`+card+`.resumedAfter !== undefined &&
		document.getElementById("feed-resumed").textContent.startsWith("Resumed after event")`)
	postJSON(t, p.url+"api/v1/push", push(11, 11))
	waitJS(ctx, t, "and goes on", `document.getElementById("feed-count").textContent === "11"`)
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
		`[...document.querySelectorAll("#feed tbody td.fdata")].map((td) => td.textContent)`))
	require.NoError(t, err)
	var want []string
	for i := 11; i >= 1; i-- {
		want = append(want, fmt.Sprintf(`{"n":%d}`, i))
	}
	require.Equal(t, want, rows, "every message once, in order (newest first)")
	dups, err := chromedp.Run(ctx, chromedp.Evaluate[string](card+`.duplicates`))
	require.NoError(t, err)
	require.Equal(t, "0", dups)
	waitJS(ctx, t, "the follower count is back", card+`.followers === "1"`)
	shotOf("demo-feed-resumed.png")
	require.NoError(t, p.stop(t, syscall.SIGTERM))
}
