package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/internal/pgtest"
)

// The operator console in Chromium against a real server (auth
// on) with real data pushed, consumed, failed and traced through the HTTP
// API. Each page renders that data; each act (replay, purge, seek, delete,
// maintenance) works end to end, shows its result, and the API agrees.
// Screenshots at desktop and phone width go to $HERALD_ARTIFACTS
// (docs/console-*.png in the README).
func TestConsole_EveryPageAndActInChromium(t *testing.T) {
	bin := buildHerald(t)
	secret := strings.Repeat("console-", 5)
	p := startHerald(t, bin, dataDir(t), "--database-url", pgtest.DSN(t), "--auth-secret", secret,
		"--instance-id", "herald-1")
	admin := &adminClient{t: t, base: p.url, token: auth.SignToken([]byte(secret), "ops", "admin", time.Hour)}
	seed := seedConsole(t, admin)

	ctx := browser(t)
	desktop(ctx, t)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(p.url+"console"), chromedp.WaitVisible(chromedp.ID("token"))))

	t.Run("AuthOnNeedsAnAdminToken", func(t *testing.T) {
		// The advice (auth is on, the command that makes a token) is said
		// once, above; the overview's panels say they need an admin token.
		waitJS(ctx, t, "without a token the console says auth is on",
			`document.querySelector("#overview .alert.error")?.textContent.includes("Needs an admin token") &&
			 document.querySelector("#auth-hint")?.textContent.includes("Auth is on") &&
			 document.querySelector("#auth-hint")?.textContent.includes("herald token --sub ops --role admin")`)
		useToken(ctx, t, auth.SignToken([]byte(secret), "bob", "read-write", time.Hour))
		waitJS(ctx, t, "a read-write token: needs an admin token",
			`document.querySelector("#overview .alert.error")?.textContent.includes("role admin") &&
			 document.querySelector("#auth-hint")?.textContent.includes("below admin")`)
		useToken(ctx, t, admin.token)
		waitJS(ctx, t, "the admin token shows the queues", `!!document.querySelector('#overview tr[data-queue="orders"]')`)
		assert.Equal(t, "token set", text(ctx, t, "#token-state"))
	})

	t.Run("Overview", func(t *testing.T) {
		goTo(ctx, t, "#/", `!!document.querySelector('#overview tr[data-queue="big"]')`)
		waitJS(ctx, t, "billing's lag on orders", `document.querySelector('#overview tr[data-group="billing"][data-queue="orders"] td:nth-child(3)')?.textContent !== "—"`)
		assert.Equal(t, "3", text(ctx, t, "#dlq-count .v"), "three dead letters")
		assert.Equal(t, "2k", text(ctx, t, `#overview tr[data-queue="big"] td:nth-child(2)`), "big's 2,000 partitions")
		assert.Equal(t, "2", text(ctx, t, `#overview tr[data-group="billing"][data-queue="orders"] td:nth-child(3)`),
			"billing's lag: the 2 messages of asia it never read (eu is dead-lettered, us acked)")
		assert.Contains(t, text(ctx, t, "#overview"), "shipping")
		assert.Contains(t, text(ctx, t, "#overview"), "syncnet is off")
		assert.NotEqual(t, "—", text(ctx, t, `#overview tr[data-queue="orders"] td:nth-child(5)`), "the oldest pending age")
		assert.Equal(t, "3", text(ctx, t, `#overview tr[data-queue="orders"] td:nth-child(9)`), "orders' dead letters (/status/backlog)")
		assert.Equal(t, "3", text(ctx, t, `#overview tr[data-group="billing"][data-queue="orders"] td:nth-child(6)`), "billing's dead letters")
		assert.NotEqual(t, "—", text(ctx, t, `#overview tr[data-group="billing"][data-queue="orders"] td:nth-child(5)`),
			"billing's oldest pending age")
		assert.True(t, evalJS[bool](ctx, t, `(() => { const rs = performance.getEntriesByType("resource").map((e) => e.name);
			return rs.some((n) => n.includes("/api/v1/status/backlog")) && !rs.some((n) => n.includes("/internal/api/status?queue=")); })()`),
			"one backlog call per refresh, no status call per queue")
		assert.True(t, evalJS[bool](ctx, t, `!!document.querySelector('#overview tr[data-queue="orders"] td:nth-child(6) svg.spark polyline')`),
			"orders' push rate is drawn (/api/v1/status/rates)")
		assertAllLabelled(ctx, t)
		stamp := text(ctx, t, "#refreshed")
		waitJS(ctx, t, "auto-refresh within 5 s", fmt.Sprintf(`document.getElementById("refreshed").textContent !== %q`, stamp))
		require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#pause"))))
		assert.Equal(t, "true", evalJS[string](ctx, t, `document.getElementById("pause").getAttribute("aria-pressed")`))
		shot(ctx, t, "console-overview.png", false)
		phone(ctx, t, "console-overview-phone.png")
		desktop(ctx, t)
		require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#pause"))))
	})

	t.Run("QueuePartitionsPagedAndSearched", func(t *testing.T) {
		goTo(ctx, t, "#/queue/big", `!!document.querySelector("#partitions .page-of")`)
		assert.Equal(t, "page 1 of 40 (2,000 partitions)", text(ctx, t, "#partitions .page-of"))
		assert.Equal(t, 50, evalJS[int](ctx, t, `document.querySelectorAll("#partitions tbody tr").length`), "one page, not 2,000 rows")
		// Keyset pages: Next asks for the names after the page's last, Previous goes back.
		require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#partitions .pager button:last-child"))))
		waitJS(ctx, t, "page 2", `document.querySelector("#partitions .page-of")?.textContent === "page 2 of 40 (2,000 partitions)"`)
		assert.Equal(t, "p-0050", text(ctx, t, "#partitions tbody tr td:first-child"))
		require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#partitions .pager button:last-child"))))
		waitJS(ctx, t, "page 3", `document.querySelector("#partitions .page-of")?.textContent === "page 3 of 40 (2,000 partitions)"`)
		assert.Equal(t, "p-0100", text(ctx, t, "#partitions tbody tr td:first-child"))
		require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#partitions .pager button:first-child"))))
		waitJS(ctx, t, "back to page 2", `document.querySelector("#partitions .page-of")?.textContent === "page 2 of 40 (2,000 partitions)"`)
		assert.Equal(t, "p-0050", text(ctx, t, "#partitions tbody tr td:first-child"))
		assert.True(t, evalJS[bool](ctx, t, `(() => { const rs = performance.getEntriesByType("resource").map((e) => e.name)
			.filter((n) => n.includes("/api/v1/resources/partitions?"));
			return rs.some((n) => n.includes("after=p-0099")) && !rs.some((n) => n.includes("offset=")); })()`),
			"pages by keyset (after), never by offset")
		require.NoError(t, chromedp.Do(ctx, chromedp.SetValue(chromedp.CSS("#partition-search"), "p-1234"),
			chromedp.Click(chromedp.CSS(`form[role="search"] button`))))
		waitJS(ctx, t, "the search's page", `document.querySelector("#partitions .page-of")?.textContent === "page 1 of 1 (1 matching)"`)
		assert.Equal(t, "p-1234", text(ctx, t, "#partitions tbody tr td:first-child"))
		assert.True(t, evalJS[bool](ctx, t, `performance.getEntriesByType("resource").some((e) =>
			e.name.includes("/api/v1/resources/partitions?") && e.name.includes("prefix=p-1234") && e.name.includes("limit=50"))`),
			"the search ran on the server by prefix (an index range), a page at a time")
		// "contains": a substring, any case.
		require.NoError(t, chromedp.Do(ctx, chromedp.SetValue(chromedp.CSS("#partition-search"), "P-199"),
			chromedp.Click(chromedp.CSS("#partition-contains")), chromedp.Click(chromedp.CSS(`form[role="search"] button`))))
		waitJS(ctx, t, "the substring's page", `document.querySelector("#partitions .page-of")?.textContent === "page 1 of 1 (10 matching)"`)
		assert.Equal(t, "p-1990", text(ctx, t, "#partitions tbody tr td:first-child"))

		// orders: each group's cursor and lag, shipping's live lease on asia.
		goTo(ctx, t, "#/queue/orders", `!!document.querySelector('#partitions tr[data-partition="asia"]')`)
		asia := text(ctx, t, `#partitions tr[data-partition="asia"] li[data-group="shipping"]`)
		assert.Regexp(t, `shipping · cursor 0 · lag 2 · leased herald-1 by pop \(ops\), expires in \d`, asia)
		assert.Contains(t, text(ctx, t, `#partitions tr[data-partition="us"] li[data-group="billing"]`), "cursor 3 · lag 0")
		shot(ctx, t, "console-queue.png", false)
		phone(ctx, t, "console-queue-phone.png")
		desktop(ctx, t)
	})

	t.Run("MessagesAndTraces", func(t *testing.T) {
		goTo(ctx, t, "#/partition/orders/us", `document.querySelectorAll("#messages tbody tr[data-tx]").length === 3`)
		assert.Contains(t, text(ctx, t, "#messages"), "completed")
		goTo(ctx, t, fmt.Sprintf("#/message/%s/%s", seed.traced.PartitionID, seed.traced.TransactionID),
			`!!document.querySelector("table.traces tbody tr[data-trace]")`)
		page := text(ctx, t, "#view")
		assert.Contains(t, page, `"n": 4`, "the payload")
		assert.Contains(t, page, "order-42", "the trace's name")
		assert.Contains(t, page, `{"step":"charged"}`, "the trace's data")
		goTo(ctx, t, "#/traces?name=order-42", `!!document.querySelector("#trace-results tr[data-trace]")`)
		assert.Contains(t, text(ctx, t, "#trace-results"), "orders/us")
	})

	t.Run("DeadLetters", func(t *testing.T) { consoleDLQ(ctx, t, admin, seed) })
	t.Run("Groups", func(t *testing.T) { consoleGroups(ctx, t, admin) })
	t.Run("Maintenance", func(t *testing.T) { consoleMaintenance(ctx, t, admin) })
}

// adminClient calls the API with an admin token.
type adminClient struct {
	t     *testing.T
	base  string
	token string
}

func (a *adminClient) do(method, path string, body any) (int, []byte) {
	a.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(a.t, err)
		rd = strings.NewReader(string(b))
	}
	req, err := http.NewRequestWithContext(a.t.Context(), method, a.base+strings.TrimPrefix(path, "/"), rd)
	require.NoError(a.t, err)
	req.Header.Set("Authorization", "Bearer "+a.token)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	require.NoError(a.t, err)
	defer func() { _ = res.Body.Close() }()
	b, err := io.ReadAll(res.Body)
	require.NoError(a.t, err)
	return res.StatusCode, b
}

// call does a request that must succeed and decodes its answer into out.
func (a *adminClient) call(method, path string, body, out any) {
	a.t.Helper()
	code, b := a.do(method, path, body)
	require.Less(a.t, code, 300, "%s %s: %s", method, path, b)
	if out != nil {
		require.NoError(a.t, json.Unmarshal(b, out), "%s %s: %s", method, path, b)
	}
}

type popped struct {
	LeaseID  string `json:"leaseId"`
	Messages []struct {
		TransactionID string          `json:"transactionId"`
		PartitionID   string          `json:"partitionId"`
		Data          json.RawMessage `json:"data"`
	} `json:"messages"`
}

// pop leases up to batch messages of queue/partition for group ("" for no
// partition); none is an empty result.
func (a *adminClient) pop(queue, partition, group string, batch int) popped {
	a.t.Helper()
	path := "api/v1/pop/queue/" + queue
	if partition != "" {
		path += "/partition/" + partition
	}
	code, b := a.do(http.MethodGet, fmt.Sprintf("%s?consumerGroup=%s&batch=%d", path, group, batch), nil)
	var out popped
	if code == http.StatusNoContent {
		return out
	}
	require.Equal(a.t, http.StatusOK, code, "%s", b)
	require.NoError(a.t, json.Unmarshal(b, &out))
	return out
}

func (a *adminClient) ack(p popped, group, status, errText string) {
	a.t.Helper()
	for _, m := range p.Messages {
		a.call(http.MethodPost, "api/v1/ack", map[string]any{"transactionId": m.TransactionID, "partitionId": m.PartitionID,
			"leaseId": p.LeaseID, "consumerGroup": group, "status": status, "error": errText}, nil)
	}
}

type consoleSeed struct {
	dead   []string // the transaction ids dead-lettered by billing on orders/eu, in order
	traced struct{ PartitionID, TransactionID string }
}

// seedConsole makes the data the pages show: queue orders (partitions eu,
// us, asia; retry limit 1) read by billing and shipping; three of eu's
// messages dead-lettered by billing (the third with another error); us
// acked by billing; a trace on one message; shipping holding a live lease
// on asia; and queue big of 2,000 partitions.
func seedConsole(t *testing.T, a *adminClient) *consoleSeed {
	t.Helper()
	s := &consoleSeed{}
	a.call(http.MethodPost, "api/v1/configure", map[string]any{"queue": "orders", "options": map[string]any{"retryLimit": 1, "retryDelay": 0}}, nil)
	var items []map[string]any
	for i, part := range []string{"eu", "eu", "eu", "us", "us", "us", "asia", "asia"} {
		items = append(items, map[string]any{"queue": "orders", "partition": part, "payload": map[string]any{"n": i + 1}})
	}
	a.call(http.MethodPost, "api/v1/push", map[string]any{"items": items}, nil)
	for i := range 3 {
		errText := "boom: card declined"
		if i == 2 {
			errText = "timeout talking to the bank"
		}
		var tx string
		for range 2 { // retry limit 1: the second failure dead-letters it
			p := a.pop("orders", "eu", "billing", 1)
			require.Len(t, p.Messages, 1)
			tx = p.Messages[0].TransactionID
			a.ack(p, "billing", "failed", errText)
		}
		s.dead = append(s.dead, tx)
	}
	us := a.pop("orders", "us", "billing", 3)
	require.Len(t, us.Messages, 3)
	a.ack(us, "billing", "completed", "")
	s.traced.PartitionID, s.traced.TransactionID = us.Messages[0].PartitionID, us.Messages[0].TransactionID
	a.call(http.MethodPost, "api/v1/traces", map[string]any{"transactionId": s.traced.TransactionID, "partitionId": s.traced.PartitionID,
		"consumerGroup": "billing", "traceNames": []string{"order-42"}, "data": map[string]any{"step": "charged"}}, nil)
	require.Len(t, a.pop("orders", "asia", "shipping", 2).Messages, 2, "shipping holds asia's lease")
	sh := a.pop("orders", "us", "shipping", 1)
	a.ack(sh, "shipping", "completed", "")

	items = items[:0]
	for i := range 2000 {
		items = append(items, map[string]any{"queue": "big", "partition": fmt.Sprintf("p-%04d", i), "payload": i})
	}
	a.call(http.MethodPost, "api/v1/push", map[string]any{"items": items}, nil)
	return s
}

// useToken pastes a token into the console's token form.
func useToken(ctx context.Context, t *testing.T, tok string) {
	t.Helper()
	require.NoError(t, chromedp.Do(ctx, chromedp.SetValue(chromedp.CSS("#token"), tok), chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`))))
}

// goTo opens a console route and waits until ready is true.
func goTo(ctx context.Context, t *testing.T, hash, ready string) {
	t.Helper()
	evalJS[bool](ctx, t, fmt.Sprintf(`location.hash = %q; true`, hash))
	waitJS(ctx, t, "the page "+hash, ready)
}

func text(ctx context.Context, t *testing.T, selector string) string {
	t.Helper()
	return evalJS[string](ctx, t, fmt.Sprintf(`document.querySelector(%q)?.innerText ?? %q`, selector, "(no "+selector+")"))
}

func assertAllLabelled(ctx context.Context, t *testing.T) {
	t.Helper()
	assert.True(t, evalJS[bool](ctx, t, `[...document.querySelectorAll("input, select")].every((e) => e.labels.length > 0 || e.getAttribute("aria-label"))`),
		"every control has a label")
}

// desktop sets a desktop's viewport (1366×900), the mobile emulation of
// phone undone.
func desktop(ctx context.Context, t *testing.T) {
	t.Helper()
	require.NoError(t, chromedp.Do(ctx, chromedp.EmulateReset(), chromedp.EmulateViewport(1366, 900)))
}

// phone takes a screenshot at a phone's width and checks that the page
// itself does not scroll sideways (wide tables scroll inside their box).
func phone(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	require.NoError(t, chromedp.Do(ctx, chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile)))
	_, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.documentElement.scrollWidth <= 390`,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(5*time.Second)))
	if err != nil {
		wide := evalJS[string](ctx, t, `[...document.querySelectorAll("body *")].filter((e) => e.getBoundingClientRect().right > 391 &&
			!e.closest(".table-wrap")).slice(0, 8).map((e) => e.tagName + "." + e.className + "#" + e.id + " " + Math.round(e.getBoundingClientRect().right)).join("; ")`)
		t.Errorf("%s: the page is wider than 390 px: %s", name, wide)
	}
	shot(ctx, t, name, false)
}

// The console shows each queue's followers (follow streams on every
// instance; this one's own said apart): a column of the overview's queues
// and a figure on the queue's page.
func TestConsole_ShowsFollowersPerQueue(t *testing.T) {
	bin := buildHerald(t)
	p := startHerald(t, bin, dataDir(t), "--database-url", pgtest.DSN(t))
	postJSON(t, p.url+"api/v1/push", `{"items":[{"queue":"watched","payload":1},{"queue":"quiet","payload":1}]}`)
	ctx0, cancel := context.WithCancel(t.Context())
	defer cancel()
	for range 2 {
		req, err := http.NewRequestWithContext(ctx0, http.MethodGet, p.url+"api/v1/follow/queue/watched", nil)
		require.NoError(t, err)
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer func() { _ = res.Body.Close() }()
		require.Equal(t, http.StatusOK, res.StatusCode)
	}
	ctx := browser(t)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(p.url+"console")))
	waitJS(ctx, t, "the overview counts watched's followers",
		`document.querySelector('#overview tr[data-queue="watched"] td:nth-child(10)')?.textContent === "2"`)
	assert.Equal(t, "followers", text(ctx, t, `#overview table.queues thead th:nth-child(10)`))
	assert.Equal(t, "0", text(ctx, t, `#overview tr[data-queue="quiet"] td:nth-child(10)`))
	goTo(ctx, t, "#/queue/watched", `document.querySelector("#followers .v")?.textContent === "2"`)
	assert.Equal(t, "followers, 2 here", text(ctx, t, `#followers .k`))
	shot, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	require.NoError(t, err)
	artifact(t, "console-queue-followers.png", shot)
}
