package main

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
)

// The JavaScript examples of docs/clients.md run, as printed, in
// headless Chromium against a real Herald. The plain EventSource example ("## SSE
// (EventSource)") runs as a classic script and acks what it receives; the
// browser SDK example ("## Browser SDK") runs as a module script, its
// import URL and server URL pointed at the test server, with render, mark
// and warn (which it leaves to the page) defined by a prelude that records
// their calls. It must push its three messages, receive them on its
// WebSocket subscription (acked: onAck) and its EventSource (acked over
// HTTP), report only states its onState comment lists (which must name
// every state herald.js reports), refuse nothing, and close on pagehide.
func TestClientsDoc_JSExamplesRun(t *testing.T) {
	doc, err := os.ReadFile("../../docs/clients.md")
	require.NoError(t, err)
	var sdk, sse, follow []string
	for _, b := range markdownBlocks(string(doc), "js") {
		switch {
		case strings.Contains(b, "import { Herald }"):
			sdk = append(sdk, b)
		case strings.Contains(b, `new EventSource("/api/v1/sse/`):
			sse = append(sse, b)
		case strings.Contains(b, `new EventSource("/api/v1/follow/`):
			follow = append(follow, b)
		}
	}
	require.Len(t, sdk, 1, "one ```js block of docs/clients.md imports the browser SDK")
	require.Len(t, sse, 1, "one ```js block of docs/clients.md opens a plain EventSource on a subscription")
	require.Len(t, follow, 1, "one ```js block of docs/clients.md opens a plain EventSource on a follow stream")

	// The states the example's onState comment documents cover every state
	// herald.js reports.
	documented := onStateComment(t, sdk[0])
	sdkSource, err := os.ReadFile("../../web/herald.js")
	require.NoError(t, err)
	for _, m := range regexp.MustCompile(`state: "(\w+)"`).FindAllStringSubmatch(string(sdkSource), -1) {
		assert.Contains(t, documented, m[1], "the onState comment of docs/clients.md lists every state herald.js reports")
	}

	bin := buildHerald(t)
	p := startHerald(t, bin, dataDir(t), "--database-url", pgtest.DSN(t))
	ctx := browser(t)
	base := p.url // ends with "/"
	origin := strings.TrimSuffix(base, "/")
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base+"herald.js")))

	// The prelude: what the examples leave to the page, recording every call,
	// every ack's answer over HTTP and every uncaught error.
	evalJS[string](ctx, t, `(() => {
		const t = window.__t = { errors: [], renders: [], marks: [], warns: [], states: [], acks: [] };
		addEventListener("error", (e) => t.errors.push(String(e.message ?? e)));
		addEventListener("unhandledrejection", (e) => t.errors.push("unhandled rejection: " + String(e.reason)));
		const log = console.log;
		console.log = (...a) => { t.states.push(a[0]); log(...a); };
		window.render = (data, partition, offset) => t.renders.push({ data, partition, offset });
		window.mark = (m, status) => t.marks.push({ tx: m.transactionId, status });
		window.warn = (...a) => t.warns.push(a.map(String));
		t.shows = []; t.notes = [];
		window.show = (data, eventId) => t.shows.push({ data, eventId });
		window.note = (text) => t.notes.push(text);
		const fetch0 = window.fetch;
		window.fetch = async (...a) => {
			const res = await fetch0(...a);
			if (String(a[0]).includes("/api/v1/ack")) {
				res.clone().json().then((j) => t.acks.push({ status: res.status, body: j }),
					(e) => t.acks.push({ status: res.status, error: String(e) }));
			}
			return res;
		};
		return "ok";
	})()`)
	run := func(code string, module bool) {
		t.Helper()
		js, err := json.Marshal(code)
		require.NoError(t, err)
		evalJS[string](ctx, t, fmt.Sprintf(`(() => {
			const s = document.createElement("script");
			if (%t) s.type = "module";
			s.textContent = %s;
			(document.head ?? document.documentElement).appendChild(s);
			return "ok";
		})()`, module, js))
	}
	type ack struct {
		Status int
		Body   []struct {
			Success bool
			Error   *string
		}
		Error string
	}
	allAcksSucceeded := func(what string) int {
		t.Helper()
		acks := evalJS[[]ack](ctx, t, `window.__t.acks`)
		for i, a := range acks {
			assert.Equal(t, 200, a.Status, "%s: ack %d over HTTP: %+v", what, i, a)
			if assert.Len(t, a.Body, 1, "%s: ack %d answers one result", what, i) {
				assert.True(t, a.Body[0].Success, "%s: ack %d succeeded: %v", what, i, a.Body[0].Error)
			}
		}
		return len(acks)
	}

	// The plain EventSource example: group "packing" of "orders".
	run(sse[0]+"\nwindow.__sse = es;", false)
	postJSON(t, base+"api/v1/push", `{"items":[{"queue":"orders","payload":{"sse":1}},{"queue":"orders","payload":{"sse":2}}]}`)
	waitState(ctx, t, 20*time.Second, "the EventSource example acks both messages", `window.__t.acks.length === 2`)
	require.Eventually(t, func() bool { return settledEverywhere(t, base, "orders", "packing") },
		10*time.Second, 50*time.Millisecond, "the EventSource example's group has read and acked everything")
	assert.Equal(t, 2, allAcksSucceeded("EventSource example"))
	evalJS[string](ctx, t, `(() => { window.__sse.close(); window.__t.acks = []; return "ok"; })()`)

	// The browser SDK example, pointed at the test server.
	code := strings.ReplaceAll(sdk[0], "http://localhost:6632", origin)
	require.Contains(t, code, `from "`+origin+`/herald.js"`, "the example imports the SDK from the server")
	run(code+"\nwindow.__readme = { h, sub, es, f };", true)
	waitState(ctx, t, 20*time.Second, "the SDK example ran to its end", `window.__readme !== undefined`)
	waitState(ctx, t, 20*time.Second, "the WebSocket subscription received and acked the three messages",
		`window.__t.renders.length >= 3 && window.__t.marks.length >= 3`)
	// "audit" (the example's EventSource, manual acks) reads the queue from
	// its start: the two messages of the EventSource example too.
	require.Eventually(t, func() bool { return settledEverywhere(t, base, "orders", "packing", "audit") },
		20*time.Second, 50*time.Millisecond, "both groups of the SDK example have read and acked everything")
	waitState(ctx, t, 10*time.Second, "the example's EventSource acked five messages over HTTP", `window.__t.acks.length === 5`)
	assert.Equal(t, 5, allAcksSucceeded("SDK example's eventSource"))

	// The example's follow of "scores" shows a score pushed now, with its event id.
	waitState(ctx, t, 10*time.Second, "the follow is connected", `window.__readme.f.lastEventId !== ""`)
	postJSON(t, base+"api/v1/push", `{"items":[{"queue":"scores","payload":{"goal":1}}]}`)
	waitState(ctx, t, 20*time.Second, "the follow showed the score with its event id",
		`window.__t.shows.length === 1 && window.__t.shows[0].data.goal === 1 && window.__t.shows[0].eventId.startsWith("f1")`)

	type render struct {
		Data      map[string]int
		Partition string
		Offset    int
	}
	type record struct {
		Errors  []string
		Renders []render
		Marks   []struct{ Tx, Status string }
		Warns   [][]string
		States  []any
	}
	got := evalJS[record](ctx, t, `window.__t`)
	assert.Empty(t, got.Errors, "no uncaught error")
	assert.Empty(t, got.Warns, "onError was not called: no ack refused or lost")
	want := []render{{map[string]int{"id": 1}, "customer-7", 1}, {map[string]int{"id": 2}, "customer-7", 2},
		{map[string]int{"id": 3}, "Default", 3}}
	assert.ElementsMatch(t, want, got.Renders, "onMessage rendered each pushed message once, with its partition and offset")
	if assert.Len(t, got.Marks, 3, "onAck once per message") {
		for _, m := range got.Marks {
			assert.Equal(t, "completed", m.Status, "the server took the ack of %s", m.Tx)
		}
	}
	require.NotEmpty(t, got.States)
	assert.Equal(t, "idle", got.States[0], "onState reports the state at once: idle before the socket opens")
	assert.Contains(t, got.States, "connected")
	for _, s := range got.States {
		assert.Contains(t, documented, s, "every state the example logged is documented")
	}

	// pagehide closes everything.
	evalJS[string](ctx, t, `(() => { dispatchEvent(new PageTransitionEvent("pagehide")); return "ok"; })()`)
	waitState(ctx, t, 5*time.Second, "pagehide closed the Herald, its subscription and its EventSource",
		`window.__readme.h.state.state === "closed" && window.__readme.es.source.readyState === EventSource.CLOSED &&
			window.__readme.f.source.readyState === EventSource.CLOSED &&
			window.__readme.sub.sub === null`)
	assert.Equal(t, "closed", evalJS[string](ctx, t, `window.__t.states.at(-1)`), "the last state logged is closed")

	// The plain follow example (a block of its own: its const es is not the
	// first example's): every message of "scores" from now, with its eventId.
	run("{\n"+follow[0]+"\nwindow.__follow = es;\n}", false)
	waitState(ctx, t, 10*time.Second, "the follow stream is open", `window.__follow.readyState === EventSource.OPEN`)
	postJSON(t, base+"api/v1/push", `{"items":[{"queue":"scores","payload":{"goal":2}}]}`)
	waitState(ctx, t, 20*time.Second, "the follow example rendered the score", `window.__t.renders.some((r) =>
		r.data?.queue === "scores" && r.data.data?.goal === 2 && r.data.eventId?.startsWith("f1"))`)
	evalJS[string](ctx, t, `(window.__follow.close(), "ok")`)
}

// markdownBlocks returns the bodies of the fenced code blocks (```) of md
// whose info string is lang.
func markdownBlocks(md, lang string) []string {
	var out []string
	var body []string
	in, keep := false, false
	for _, l := range strings.Split(md, "\n") {
		fence := strings.HasPrefix(strings.TrimSpace(l), "```")
		switch {
		case !in && fence:
			in, body = true, nil
			keep = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "```")) == lang
		case in && fence:
			in = false
			if keep {
				out = append(out, strings.Join(body, "\n"))
			}
		case in:
			body = append(body, l)
		}
	}
	return out
}

// onStateComment is the list of states in the comment of the example's
// h.onState line: "// idle, connecting, …".
func onStateComment(t *testing.T, block string) []string {
	t.Helper()
	for _, l := range strings.Split(block, "\n") {
		if strings.HasPrefix(l, "h.onState(") {
			_, comment, ok := strings.Cut(l, "//")
			require.True(t, ok, "the onState line of the browser SDK example has a comment listing the states: %q", l)
			var states []string
			for _, s := range strings.Split(comment, ",") {
				states = append(states, strings.TrimSpace(s))
			}
			require.True(t, slices.Contains(states, "idle"), "the onState comment lists idle: %q", l)
			return states
		}
	}
	t.Fatalf("the browser SDK example of docs/clients.md has no h.onState line")
	return nil
}
