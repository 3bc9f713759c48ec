package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
)

// The demo page must be clear for a newcomer, at a desktop's
// 1280 px and at a phone's 390 px. The latency chart shows one message as a
// whole dot inside its plot, and only messages pushed after subscribing: a
// backlog drained on subscribing is a line of its own, not latency (its
// ages used to flatten the chart for a minute). At 390 px a message's data
// gets a real width, not a column of one or two characters per line. Every
// panel says in plain words what it shows (wake-ups too), counts are
// singular or plural as they should be, and no latency claims a precision it
// does not have ("≈0.0 ms").
func TestDemo_PageReadable(t *testing.T) {
	bin := buildHerald(t)
	dsn := pgtest.DSN(t)
	p := startHerald(t, bin, dataDir(t), "--database-url", dsn, "--drain-window", "200ms")
	defer func() { require.NoError(t, p.stop(t, syscall.SIGTERM)) }()

	// A backlog, pushed first: it waits in the queue while the browser
	// starts and the first case runs, then is drained by a subscription.
	const backlogQueue, liveQueue = "demopage-backlog", "demopage-live"
	pushMany(t, p.url, backlogQueue, 50)

	ctx := browser(t)
	phone := func() {
		t.Helper()
		require.NoError(t, chromedp.Do(ctx, chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile)))
		waitJS(ctx, t, "the page is laid out at 390 px", `window.innerWidth === 390`)
		waitJS(ctx, t, "the chart is drawn at the new width", chartFits)
	}
	open := func() {
		t.Helper()
		require.NoError(t, chromedp.Do(ctx, chromedp.EmulateViewport(1280, 1400),
			chromedp.Navigate(p.url), chromedp.WaitVisible(chromedp.ID("subscribe"))))
		waitJS(ctx, t, "the live panel names this instance", `document.getElementById("instance").textContent.includes(":")`)
		waitJS(ctx, t, "the chart is drawn", chartFits)
	}
	subscribe := func(queue string) {
		t.Helper()
		require.NoError(t, chromedp.Do(ctx,
			chromedp.SetValue(chromedp.ID("queue"), queue),
			chromedp.SetValue(chromedp.ID("transport"), "ws"),
			chromedp.SetValue(chromedp.ID("ackmode"), "auto"),
			chromedp.Click(chromedp.ID("subscribe")),
		))
		waitJS(ctx, t, "sub-1 connects", `document.getElementById("sub-1")?.dataset.state === "connected"`)
	}
	pushFromPage := func(n int) {
		t.Helper()
		require.NoError(t, chromedp.Do(ctx,
			chromedp.SetValue(chromedp.ID("count"), strconv.Itoa(n)),
			chromedp.SetValue(chromedp.ID("rate"), "0"),
			chromedp.Click(chromedp.ID("push")),
		))
	}
	received := func(n int) {
		t.Helper()
		waitJS(ctx, t, fmt.Sprintf("sub-1 received %d", n), fmt.Sprintf(
			`document.querySelector("#sub-1 .count").textContent === "%d" && document.querySelectorAll("#sub-1 tbody tr").length === %d`, n, n))
	}

	// 1. One message, pushed from the page after subscribing.
	open()
	explained(ctx, t)
	subscribe(liveQueue)
	pushFromPage(1)
	received(1)
	waitJS(ctx, t, "a second with the message on the chart", `document.getElementById("chart").dataset.points === "1"`)
	c := readChart(ctx, t)
	assert.Equal(t, 1, c.Samples, "one latency: the message pushed after subscribing")
	assert.Equal(t, 0, c.Above)
	c.assertDrawnInside(t, "one message")
	assert.InDelta(t, c.Plot.X1, c.Drawn[0].X, 0.5, "this second is the chart's newest, at its right edge, and still drawn whole")
	assert.True(t, evalJS[bool](ctx, t, `document.getElementById("backlog")?.hidden ?? true`), "no backlog here")
	// Plain counts: one stream, never "1 streams".
	waitJS(ctx, t, "the header counts one stream", `/\b1 stream open\b/.test(document.getElementById("version").textContent)`)
	assertWording(ctx, t)
	// A message pushed by someone else: its latency is estimated against
	// the server's clock, with the precision that estimate has.
	pushOne(t, p.url, liveQueue, `{"from":"elsewhere"}`)
	received(2)
	assertWording(ctx, t)
	assertLayout(ctx, t, "1280 px, one message", 150)
	// A second subscription, side by side with the first: each card is
	// half as wide, and the data still gets its room.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SetValue(chromedp.ID("group"), "second"),
		chromedp.SetValue(chromedp.ID("transport"), "sse"),
		chromedp.Click(chromedp.ID("subscribe")),
	))
	waitJS(ctx, t, "sub-2 connects", `document.getElementById("sub-2")?.dataset.state === "connected"`)
	pushFromPage(1)
	waitJS(ctx, t, "sub-2 receives", `document.querySelectorAll("#sub-2 tbody tr").length >= 1`)
	waitJS(ctx, t, "the cards side by side", `document.getElementById("sub-1").getBoundingClientRect().top ===
		document.getElementById("sub-2").getBoundingClientRect().top`)
	assertLayout(ctx, t, "1280 px, two subscriptions side by side", 150)

	phone()
	assertLayout(ctx, t, "390 px, one message", 0.4*390)
	readChart(ctx, t).assertDrawnInside(t, "one message at 390 px")
	explained(ctx, t)

	// 2. The 50 messages pushed before subscribing, then one after: the 50
	// are a backlog line, and the chart's scale knows only the one.
	open()
	subscribe(backlogQueue)
	received(50)
	waitJS(ctx, t, "the backlog line", `!document.getElementById("backlog").hidden`)
	line := evalJS[string](ctx, t, `document.getElementById("backlog").textContent`)
	assert.Regexp(t, `drained 50 older messages \(backlog.*oldest waited \d+(\.\d)?`+sp+`(ms|s|min)\b`, line)
	oldest := evalJS[float64](ctx, t, `Number(document.getElementById("backlog").dataset.oldest)`)
	rows := evalJS[[]string](ctx, t, `[...document.querySelectorAll("#sub-1 tbody td.latency")].map((td) => td.textContent)`)
	require.Len(t, rows, 50)
	for _, r := range rows {
		assert.True(t, strings.HasPrefix(r, "backlog, waited "), "a backlog row says so, not a latency: %q", r)
	}
	pushFromPage(1)
	received(51)
	waitJS(ctx, t, "the pushed message on the chart", `Number(document.getElementById("chart").dataset.samples) >= 1`)
	c = readChart(ctx, t)
	assert.Equal(t, 1, c.Samples, "the chart counts the one message pushed after subscribing, not the 50 before")
	assert.Equal(t, 1, c.Points)
	assert.Less(t, c.Top, oldest, "the backlog's age (%.0f ms) is not in the chart's scale (%g ms)", oldest, c.Top)
	assert.Equal(t, 0, c.Above, "nothing off the scale: the scale is the latencies'")
	c.assertDrawnInside(t, "after a backlog")
	assert.Equal(t, "50", evalJS[string](ctx, t, `document.getElementById("backlog").dataset.count`),
		"the pushed message is no backlog")
	assertWording(ctx, t)
	assertLayout(ctx, t, "1280 px, backlog", 150)
	shot(ctx, t, "demo-backlog.png", true)

	phone()
	assertLayout(ctx, t, "390 px, 51 messages", 0.4*390)
	readChart(ctx, t).assertDrawnInside(t, "after a backlog at 390 px")
	require.NoError(t, chromedp.Do(ctx, chromedp.ScrollIntoView(chromedp.ID("subs-h"))))
	shot(ctx, t, "demo-phone-messages.png", false)
	require.NoError(t, chromedp.Do(ctx, chromedp.ScrollIntoView(chromedp.ID("panel-latency"))))
	shot(ctx, t, "demo-phone-live.png", false)

	// 3. Numbers and the scale. Honest precision, singular and plural; a
	// minute of 1–12 ms latencies keeps its scale with one 16.8 s outlier
	// (a slow delivery cannot be had on demand: the page's hook feeds the
	// chart as deliveries do), which is drawn at the top edge and counted.
	assert.Equal(t, []string{"<0.1\u00a0ms", "0.4\u00a0ms", "7.4\u00a0ms", "12\u00a0ms", "16.8\u00a0s"},
		evalJS[[]string](ctx, t, `[0.04, 0.4, 7.44, 12.3, 16769].map((v) => heraldDemo.fmtMS(v))`))
	assert.Equal(t, []string{"1 stream", "2 streams", "0 streams", "1 older message", "50 older messages"},
		evalJS[[]string](ctx, t, `[[1, "stream"], [2, "stream"], [0, "stream"], [1, "older message"], [50, "older message"]].map(([n, w]) => heraldDemo.plural(n, w))`))
	tops := evalJS[[]float64](ctx, t, `(() => { const fast = Array.from({ length: 30 }, (_, i) => 1 + (i % 12));
		return [heraldDemo.chartTop(fast), heraldDemo.chartTop([...fast, 16769]), heraldDemo.chartTop([5])]; })()`)
	assert.True(t, tops[0] >= 12 && tops[0] <= 20, "1–12 ms fill the scale: %v", tops[0])
	assert.LessOrEqual(t, tops[1], 40.0, "one outlier does not flatten the scale")
	assert.True(t, tops[2] >= 5 && tops[2] <= 10, "one message fills the scale: %v", tops[2])
	phone()
	evalJS[bool](ctx, t, `(() => { for (let i = 0; i < 30; i++) heraldDemo.addLatency(1 + (i % 12)); heraldDemo.addLatency(16769); return true; })()`)
	waitJS(ctx, t, "the outlier's second on the chart", `document.getElementById("chart").dataset.above === "1"`)
	c = readChart(ctx, t)
	assert.LessOrEqual(t, c.Top, 40.0, "the scale is the fast latencies'")
	assert.Equal(t, 1, c.assertDrawnInside(t, "with an outlier"), "the outlier is drawn, at the top edge")
	above := evalJS[string](ctx, t, `document.getElementById("chart-above").textContent`)
	assert.Regexp(t, `off the scale: 1 second peaked above .*highest 16\.8`+sp+`s`, above)
}

// pushMany pushes n messages to queue in one request.
func pushMany(t *testing.T, base, queue string, n int) {
	t.Helper()
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprintf(`{"queue":%q,"payload":{"n":%d,"text":"pushed before subscribing"}}`, queue, i+1)
	}
	resp, err := http.Post(base+"api/v1/push", "application/json",
		strings.NewReader(`{"items":[`+strings.Join(items, ",")+`]}`))
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
}

// sp is a space between a number and its unit: the page keeps them
// together with a no-break space.
const sp = `[ \x{00a0}]`

// shot saves a screenshot once the page has painted what it laid out
// (two animation frames: a scroll or a new viewport is painted by then).
func shot(ctx context.Context, t *testing.T, name string, full bool) {
	t.Helper()
	evalJS[bool](ctx, t, `new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(() => r(true))))`)
	action := chromedp.CaptureScreenshot()
	if full {
		action = chromedp.FullScreenshot(100)
	}
	b, err := chromedp.Run(ctx, action)
	require.NoError(t, err)
	artifact(t, name, b)
}

// chartFits: the chart was last drawn at its element's current size.
const chartFits = `(() => { const c = document.getElementById("chart");
	const p = c.dataset.plot && JSON.parse(c.dataset.plot);
	return !!p && p.w === Math.max(200, c.clientWidth) && p.h === Math.max(120, c.clientHeight); })()`

type chartPoint struct {
	Key        string
	X, Y, R, V float64
	Filled     bool
}

type chart struct {
	Points, Samples, Above int
	Top                    float64
	Plot                   struct{ X0, Y0, X1, Y1, W, H float64 }
	Drawn                  []chartPoint
}

// readChart reads what the page says it drew, and checks each dot on the
// canvas itself: its centre and four points inside its rim are painted.
func readChart(ctx context.Context, t *testing.T) chart {
	t.Helper()
	raw := evalJS[string](ctx, t, `(() => {
		const c = document.getElementById("chart"), d = c.dataset;
		const ctx = c.getContext("2d"), k = c.width / c.clientWidth;
		const painted = (x, y) => ctx.getImageData(Math.floor(x * k), Math.floor(y * k), 1, 1).data[3] > 200;
		// A dot: its centre and inside its rim; a triangle (off the scale): its centre line.
		const drawn = JSON.parse(d.drawn ?? "[]").map((p) => ({ ...p, filled:
			[[0, 0], [0, p.r - 1.5], [0, 1.5 - p.r], ...(p.v > Number(d.top) ? [] : [[p.r - 1.5, 0], [1.5 - p.r, 0]])]
				.every(([dx, dy]) => painted(p.x + dx, p.y + dy)) }));
		return JSON.stringify({ points: Number(d.points), samples: Number(d.samples), above: Number(d.above),
			top: Number(d.top), plot: JSON.parse(d.plot ?? "{}"), drawn });
	})()`)
	var c chart
	require.NoError(t, json.Unmarshal([]byte(raw), &c), raw)
	return c
}

// assertDrawnInside: at least one point, each a whole dot inside the plot
// area (not clipped by the canvas's edge) and painted, on a scale above 0;
// a value above the scale is a marker at its top edge. It returns how many
// of those there are.
func (c chart) assertDrawnInside(t *testing.T, what string) (above int) {
	t.Helper()
	require.NotEmpty(t, c.Drawn, "%s: a point on the chart", what)
	assert.Positive(t, c.Top, what)
	p := c.Plot
	assert.True(t, p.X0 < p.X1 && p.Y0 < p.Y1 && p.X1 <= p.W && p.Y1 <= p.H, "%s: plot area %+v", what, p)
	for _, d := range c.Drawn {
		assert.True(t, d.X >= p.X0 && d.X <= p.X1 && d.Y >= p.Y0 && d.Y <= p.Y1,
			"%s: %s point (%.1f, %.1f) inside the plot area %+v", what, d.Key, d.X, d.Y, p)
		assert.True(t, d.X-d.R >= 0 && d.X+d.R <= p.W && d.Y-d.R >= 0 && d.Y+d.R <= p.H,
			"%s: %s point (%.1f, %.1f) r %.1f whole on the %gx%g canvas", what, d.Key, d.X, d.Y, d.R, p.W, p.H)
		assert.True(t, d.Filled, "%s: the %s dot at (%.1f, %.1f) is painted", what, d.Key, d.X, d.Y)
		if d.V > c.Top {
			above++
			assert.InDelta(t, p.Y0, d.Y, 0.5, "%s: %s value %g above the scale, marked at its top", what, d.Key, d.V)
		}
	}
	return above
}

// explained: every card and every panel of the live view has a title and a
// visible one-line explanation under it; the wake-ups say what wakes.
func explained(ctx context.Context, t *testing.T) {
	t.Helper()
	var panels []struct {
		Title, Explain string
		Visible        bool
	}
	raw := evalJS[string](ctx, t, `JSON.stringify([...document.querySelectorAll("main > section.card, .panel")].map((p) => {
		const h = p.querySelector(":scope > h2, :scope > h3"), e = p.querySelector(":scope > p.explain");
		const r = e ? e.getBoundingClientRect() : null;
		return { title: h ? h.textContent.trim() : "", explain: e ? e.textContent.trim() : "",
			visible: !!r && r.width > 0 && r.height > 0 && getComputedStyle(e).visibility !== "hidden" };
	}))`)
	require.NoError(t, json.Unmarshal([]byte(raw), &panels))
	require.Len(t, panels, 9, "5 cards (subscribe, push, live feed, received, live view) and 4 live panels")
	for _, p := range panels {
		assert.NotEmpty(t, p.Title)
		assert.GreaterOrEqual(t, len(p.Explain), 40, "panel %q explains itself in a sentence", p.Title)
		assert.True(t, p.Visible, "panel %q: the explanation is shown", p.Title)
	}
	wake := evalJS[string](ctx, t, `document.getElementById("wakeups").parentElement.querySelector(".explain")?.textContent ?? ""`)
	for _, s := range []string{"a push here", "PostgreSQL", "another instance"} {
		assert.Contains(t, wake, s, "the wake-ups panel says in plain words what wakes this instance")
	}
}

// assertWording: no "1 streams"-style plural with 1, and no latency claiming
// more precision than it has.
func assertWording(ctx context.Context, t *testing.T) {
	t.Helper()
	text := evalJS[string](ctx, t, `document.body.innerText`)
	assert.NotRegexp(t, `\b1`+sp+`(streams|messages|consumers|seconds|subscribers)\b`, text)
	assert.NotRegexp(t, `(\b|[≈~])0\.0`+sp+`?ms`, text, "no false precision")
	lats := evalJS[[]string](ctx, t, `[...document.querySelectorAll("tbody td.latency.live")].map((td) => td.textContent)`)
	honest := regexp.MustCompile(strings.ReplaceAll(`^(<0\.1_ms|[≈<]?(\d\.\d_ms|[1-9]\d{0,2}_ms|\d+\.\d_s))$`, "_", sp))
	for _, l := range lats {
		assert.Regexp(t, honest, l, "a latency with the precision it has")
	}
	wakeups := evalJS[[]string](ctx, t, `[...document.querySelectorAll("#wakeups dt")].map((e) => e.textContent)`)
	assert.Contains(t, wakeups, "a push to this instance (push)", "wake-ups named in plain words")
}

// assertLayout: nothing sticks out sideways (no horizontal scroll, no box
// past the viewport's edge, no table scrolling sideways in its card), and
// each message's data is at least minData px wide, a short payload on at
// most two lines.
func assertLayout(ctx context.Context, t *testing.T, what string, minData float64) {
	t.Helper()
	var l struct {
		Width, ScrollWidth int
		Outside, Scrolling []string
		Data               []struct{ Width, Lines float64 }
	}
	raw := evalJS[string](ctx, t, `(() => {
		const vw = window.innerWidth;
		const name = (e) => e.tagName.toLowerCase() + (e.id ? "#" + e.id : "") + (typeof e.className === "string" && e.className ? "." + e.className.trim().split(/\s+/).join(".") : "");
		const outside = [...document.querySelectorAll("body *")].filter((e) => {
			const r = e.getBoundingClientRect();
			return r.width > 1 && r.height > 1 && (r.right > vw + 0.5 || r.left < -0.5);
		}).map(name);
		const scrolling = [...document.querySelectorAll(".table-wrap")].filter((w) => w.scrollWidth > w.clientWidth + 1).map(name);
		const data = [...document.querySelectorAll("tbody td.data")].map((td) => {
			const range = document.createRange();
			range.selectNodeContents(td);
			const tops = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
			return { width: td.getBoundingClientRect().width, lines: tops.size };
		});
		return JSON.stringify({ width: vw, scrollWidth: document.documentElement.scrollWidth, outside: outside.slice(0, 20), scrolling, data });
	})()`)
	require.NoError(t, json.Unmarshal([]byte(raw), &l), raw)
	assert.LessOrEqual(t, l.ScrollWidth, l.Width, "%s: no horizontal scroll", what)
	assert.Empty(t, l.Outside, "%s: no element past the viewport's edge", what)
	assert.Empty(t, l.Scrolling, "%s: no message table scrolls sideways", what)
	require.NotEmpty(t, l.Data, "%s: messages shown", what)
	for i, d := range l.Data {
		assert.GreaterOrEqual(t, d.Width, minData, "%s: row %d's data is %.0f px wide", what, i, d.Width)
		assert.LessOrEqual(t, d.Lines, 2.0, "%s: row %d's short data fits on at most two lines", what, i)
	}
}
