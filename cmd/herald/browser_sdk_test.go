package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jackc/pgx/v5"

	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/queue"
)

// herald.js in real headless Chromium against a
// real Herald. One server and one browser serve the three subtests (the
// build and the start are the slow part).
func TestBrowserSDK_HeraldJS(t *testing.T) {
	bin := buildHerald(t)
	dsn := pgtest.DSN(t)
	p := startHerald(t, bin, dataDir(t), "--database-url", dsn)
	ctx := browser(t)

	t.Run("GroupsOnOneWebSocket", func(t *testing.T) { groupsOnOneWebSocket(ctx, t, p.url, dsn) })
	t.Run("RefusedAckRejectsAndReachesOnError", func(t *testing.T) { refusedAckRejects(ctx, t, p.url) })
	t.Run("DemoPageMarksRowsAndFollowsQueues", func(t *testing.T) { demoPageMarksRows(ctx, t, p.url) })
}

// waitState waits until a JavaScript expression is true in the page, at
// most d; on failure it shows what the page recorded (window.__t).
func waitState(ctx context.Context, t *testing.T, d time.Duration, what, expr string) {
	t.Helper()
	_, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(50*time.Millisecond),
		chromedp.WithPollingTimeout(d)))
	if err != nil {
		state, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.stringify(window.__t ?? null)`))
		t.Fatalf("%s: %v\nrecorded: %s", what, err, state)
	}
}

// evalJS runs a script in the page and awaits the promise it returns.
func evalJS[T any](ctx context.Context, t *testing.T, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
	require.NoError(t, err, "evaluating %s", js)
	return v
}

func postJSON(t *testing.T, url, body string) {
	t.Helper()
	res, err := http.Post(url, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	_ = res.Body.Close()
	require.Less(t, res.StatusCode, 300, "POST %s", url)
}

// settledEverywhere reports whether every one of groups has read the whole
// queue (lag 0, no live lease) and the queue's DLQ is empty.
func settledEverywhere(t *testing.T, base, q string, groups ...string) bool {
	t.Helper()
	_, body := get(t, base+"internal/api/status?queue="+q)
	var st struct {
		Queue queue.QueueStatus `json:"queue"`
	}
	if json.Unmarshal([]byte(body), &st) != nil {
		return false
	}
	seen := map[string]bool{}
	for _, g := range st.Queue.Groups {
		if g.Lag != 0 || g.Leased != 0 {
			return false
		}
		seen[g.Group] = true
	}
	for _, g := range groups {
		if !seen[g] {
			return false
		}
	}
	return dlqTotal(t, base, q) == 0
}

// pushBody is a push of messages from to to-1, over partitions p0 and p1.
func pushBody(q string, from, to int) string {
	var items []string
	for i := from; i < to; i++ {
		items = append(items, fmt.Sprintf(`{"queue":%q,"partition":"p%d","payload":{"n":%d}}`, q, i%2, i))
	}
	return `{"items":[` + strings.Join(items, ",") + `]}`
}

func dlqTotal(t *testing.T, base, q string) int {
	t.Helper()
	_, body := get(t, base+"api/v1/dlq?queue="+q)
	var page struct {
		Total int `json:"total"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &page), body)
	return page.Total
}

// One Herald object, three subscriptions to one queue in three consumer
// groups over one WebSocket: ack "auto", ack "manual" (the handler acks
// with sub.ack), and "auto" with a handler that throws the first time it
// sees each message (nack → delivered again → succeeds). Every ack on such a
// socket used to be refused.
func groupsOnOneWebSocket(ctx context.Context, t *testing.T, base, dsn string) {
	const q, n = "js-groups", 20
	// On failure, the server's side too: each group's lag and leased
	// partitions, the waiting consumers and what woke them, and the
	// consumer rows themselves (cursor, the row's copy of the last offset
	// that marks it ready, the lease) beside each partition's last offset.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		_, body := get(t, base+"internal/api/status?queue="+q)
		t.Logf("server status: %s", body)
		conn, err := pgx.Connect(context.Background(), dsn)
		if err != nil {
			t.Logf("consumer rows: %v", err)
			return
		}
		defer func() { _ = conn.Close(context.Background()) }()
		rows, err := conn.Query(context.Background(), `SELECT p.name, c.consumer_group, c.cursor, c.last_offset,
			p.last_offset, coalesce(c.lease_from, 0), coalesce(c.lease_to, 0), c.lease_id IS NOT NULL, c.done::text
			FROM consumers c JOIN partitions p ON p.id = c.partition_id JOIN queues qu ON qu.id = p.queue_id
			WHERE qu.name = $1 ORDER BY 1, 2`, q)
		if err != nil {
			t.Logf("consumer rows: %v", err)
			return
		}
		defer rows.Close()
		for rows.Next() {
			var part, group, done string
			var cursor, rowLast, partLast, from, to int64
			var leased bool
			if err := rows.Scan(&part, &group, &cursor, &rowLast, &partLast, &from, &to, &leased, &done); err != nil {
				t.Logf("consumer rows: %v", err)
				return
			}
			t.Logf("row %s/%s: cursor %d, row last_offset %d, partition last_offset %d, lease %v [%d..%d], done %s",
				part, group, cursor, rowLast, partLast, leased, from, to, done)
		}
	})
	// Half the messages wait in the queue before anyone subscribes: the
	// three subscriptions are handed the same messages at once.
	postJSON(t, base+"api/v1/push", pushBody(q, 0, n/2))
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base+"herald.js")))
	evalJS[string](ctx, t, fmt.Sprintf(`(async () => {
		// Count the sockets the SDK opens: all three subscriptions share one.
		const Native = WebSocket;
		window.__sockets = 0;
		window.__ackItems = [];
		window.WebSocket = class extends Native {
			constructor(...a) { super(...a); window.__sockets++; }
			send(text) {
				const f = JSON.parse(text);
				if (f.type === "ack") window.__ackItems.push(...f.items);
				super.send(text);
			}
		};
		const { Herald } = await import("/herald.js");
		const t = window.__t = { runs: {}, acked: {}, nacked: {}, errors: [], manualResults: [] };
		// The "auto" handler and the "manual" ack wait until all three
		// groups hold the message, as slow handlers and a person clicking
		// would: the socket then holds three deliveries of it at once.
		const seen = new Map(); // message → groups that ran on it
		const waiting = new Map(); // message → resolves when all three have
		const key = (m) => m.partition + "/" + m.transactionId;
		const run = (g, m) => {
			const k = key(m);
			t.runs[g] ??= {};
			if (!seen.has(k)) seen.set(k, new Set());
			seen.get(k).add(g);
			if (seen.get(k).size === 3) waiting.get(k)?.forEach((f) => f());
			return (t.runs[g][k] = (t.runs[g][k] ?? 0) + 1);
		};
		const allHold = (m) => new Promise((resolve) => {
			const k = key(m);
			if (seen.get(k)?.size === 3) return resolve();
			waiting.set(k, [...(waiting.get(k) ?? []), resolve]);
		});
		const count = (o, g) => { o[g] = (o[g] ?? 0) + 1; };
		// maxInFlight covers every message: a group short of credit could
		// not take the partition the other groups wait on (auto holding p0's
		// five while its handler waits for manual to hold the first, manual
		// holding p1's five waiting for auto) and the handlers would wait on
		// each other for ever — the server right to give no more.
		const common = (g) => ({
			queue: %[1]q, consumerGroup: "g-" + g, maxInFlight: %[2]d,
			onAck: (m, status) => count(status === "completed" ? t.acked : t.nacked, g),
			onError: (e) => t.errors.push({ g, message: e.message, tx: e.herald?.message?.transactionId }),
		});
		const h = window.__h = new Herald();
		window.__subs = {
			auto: h.subscribe({ ...common("auto"), ack: "auto", onMessage: async (m) => {
				run("auto", m);
				await allHold(m);
			} }),
			manual: h.subscribe({ ...common("manual"), ack: "manual", onMessage: (m, sub) => {
				run("manual", m);
				allHold(m).then(() => sub.ack(m)).then((r) => t.manualResults.push(r?.success || r?.error || "no result"),
					(e) => t.manualResults.push(e.message));
			} }),
			throws: h.subscribe({ ...common("throws"), ack: "auto", onMessage: (m) => {
				if (run("throws", m) === 1) throw new Error("fails the first time");
			} }),
		};
		return "ok";
	})()`, q, n))
	waitState(ctx, t, 10*time.Second, "the three subscriptions are subscribed",
		`Object.values(window.__subs).every((s) => s.sub)`)

	// The second half arrives while the three subscriptions wait.
	postJSON(t, base+"api/v1/push", pushBody(q, n/2, n))

	waitState(ctx, t, 30*time.Second, "every handler ran on every message (the throwing one twice)", fmt.Sprintf(
		`(t => [["auto", 1], ["manual", 1], ["throws", 2]].every(([g, want]) =>
			Object.keys(t.runs[g] ?? {}).length === %[1]d && Object.values(t.runs[g]).every((r) => r === want)) &&
			t.manualResults.length === %[1]d)(window.__t)`, n))
	require.Eventually(t, func() bool { return settledEverywhere(t, base, q, "g-auto", "g-manual", "g-throws") },
		10*time.Second, 50*time.Millisecond, "every group at lag 0 with no lease, nothing in the DLQ")
	waitState(ctx, t, 10*time.Second, "onAck saw every ack and nack", fmt.Sprintf(
		`(t => t.acked.auto === %[1]d && t.acked.manual === %[1]d && t.acked.throws === %[1]d && t.nacked.throws === %[1]d)(window.__t)`, n))

	type record struct {
		Runs          map[string]map[string]int
		Acked, Nacked map[string]int
		Errors        []map[string]any
		ManualResults []any
		Sockets       int
	}
	got := evalJS[record](ctx, t, `(() => ({ ...window.__t, sockets: window.__sockets }))()`)
	assert.Equal(t, 1, got.Sockets, "one WebSocket for the three subscriptions")
	// Every ack item names its delivery: lease, sub and group.
	items := evalJS[[]map[string]any](ctx, t, `window.__ackItems`)
	assert.Len(t, items, 4*n, "an ack per message and group, and a nack per message of the throwing group")
	subOf := evalJS[map[string]string](ctx, t, `Object.fromEntries(Object.entries(window.__subs).map(([g, s]) => ["g-" + g, s.sub]))`)
	for _, it := range items {
		group, _ := it["consumerGroup"].(string)
		assert.Contains(t, subOf, group, "item %v names its group", it)
		assert.Equal(t, subOf[group], it["sub"], "item %v names the sub of its group", it)
		assert.NotEmpty(t, it["leaseId"], "item %v names its lease", it)
	}
	assert.Empty(t, got.Errors, "no ack was refused")
	for g, want := range map[string]int{"auto": 1, "manual": 1, "throws": 2} {
		assert.Len(t, got.Runs[g], n, "group %s saw every message", g)
		for k, runs := range got.Runs[g] {
			assert.Equal(t, want, runs, "group %s ran its handler on %s", g, k)
		}
	}
	for i, r := range got.ManualResults {
		assert.Equal(t, true, r, "manual ack %d resolved with success", i)
	}
	assert.Equal(t, 0, dlqTotal(t, base, q))
	_, err := chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void](`window.__h.close()`))
	require.NoError(t, err)
}

// A refused ack rejects the promise of sub.ack / herald.ack with the
// server's reason and reaches onError with the message attached, in
// "manual" mode and in "auto" mode (where the SDK acks by itself).
func refusedAckRejects(ctx context.Context, t *testing.T, base string) {
	const q = "js-refused"
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base+"herald.js")))
	evalJS[string](ctx, t, fmt.Sprintf(`(async () => {
		const { Herald } = await import("/herald.js");
		const t = window.__t = { manual: [], autoRuns: 0, errors: [] };
		const onError = (g) => (e) => t.errors.push({ g, message: e.message, tx: e.herald?.message?.transactionId,
			success: e.herald?.result?.success });
		const h = window.__h = new Herald();
		window.__subs = {
			manual: h.subscribe({ queue: %[1]q, consumerGroup: "manual", ack: "manual",
				onMessage: (m) => { t.manual.push(m); }, onError: onError("manual") }),
			// The handler spoils its message's lease: the SDK's own ack is refused.
			auto: h.subscribe({ queue: %[1]q, consumerGroup: "auto", ack: "auto",
				onMessage: (m) => { t.autoRuns++; t.autoTx = m.transactionId; m.leaseId = "forged-" + m.leaseId; },
				onError: onError("auto") }),
		};
		return "ok";
	})()`, q))
	waitState(ctx, t, 10*time.Second, "subscribed", `Object.values(window.__subs).every((s) => s.sub)`)
	pushOne(t, base, q, `{"refused":1}`)
	waitState(ctx, t, 10*time.Second, "both received it", `window.__t.manual.length === 1 && window.__t.autoRuns === 1`)

	// The SDK's own ack in "auto" mode, refused: onError with the message.
	waitState(ctx, t, 10*time.Second, "the refused auto ack reaches onError",
		`window.__t.errors.some((e) => e.g === "auto")`)

	type outcome struct {
		Rejected bool
		Message  string
		Tx       string
		Success  *bool
		Errors   []map[string]any
	}
	// sub.ack on a copy of the message with a forged lease.
	got := evalJS[outcome](ctx, t, `(async () => {
		const t = window.__t, m = t.manual[0];
		const before = t.errors.length;
		try {
			await window.__subs.manual.ack({ ...m, leaseId: "forged-" + m.leaseId });
			return { rejected: false };
		} catch (e) {
			return { rejected: true, message: e.message, tx: e.herald?.message?.transactionId,
				success: e.herald?.result?.success, errors: t.errors.slice(before) };
		}
	})()`)
	manualTx := evalJS[string](ctx, t, `window.__t.manual[0].transactionId`)
	assert.True(t, got.Rejected, "sub.ack of a forged lease rejects its promise")
	assert.NotEmpty(t, got.Message, "with the server's reason")
	assert.Equal(t, manualTx, got.Tx, "the error carries the message")
	if assert.NotNil(t, got.Success) {
		assert.False(t, *got.Success, "and the server's result")
	}
	if assert.Len(t, got.Errors, 1, "onError is called once") {
		assert.Equal(t, "manual", got.Errors[0]["g"])
		assert.Equal(t, got.Message, got.Errors[0]["message"])
	}

	// herald.ack over HTTP with the forged lease throws too.
	httpErr := evalJS[string](ctx, t, `(async () => {
		const m = window.__t.manual[0];
		try {
			await window.__h.ack({ ...m, leaseId: "forged-" + m.leaseId });
			return "";
		} catch (e) {
			return e.message + "|" + e.herald?.result?.success;
		}
	})()`)
	assert.Equal(t, "Invalid or expired lease|false", httpErr, "the HTTP ack helper throws the server's reason")

	autoErr := evalJS[map[string]any](ctx, t, `window.__t.errors.find((e) => e.g === "auto")`)
	assert.NotEmpty(t, autoErr["message"], "the auto ack's refusal names the server's reason")
	assert.Equal(t, evalJS[string](ctx, t, `window.__t.autoTx`), autoErr["tx"], "and carries the message")
	assert.Equal(t, false, autoErr["success"])

	// The real lease still acks.
	ok := evalJS[bool](ctx, t, `window.__subs.manual.ack(window.__t.manual[0]).then((r) => r.success === true)`)
	assert.True(t, ok, "the genuine ack succeeds")
	_, err := chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void](`window.__h.close()`))
	require.NoError(t, err)
}

// The demo page: two WebSocket subscriptions to one queue in two groups
// (auto and manual) and one to another queue. Every row says what became
// of it (acked, nacked, ack failed with the server's reason), and the live
// panel shows each subscribed queue.
func demoPageMarksRows(ctx context.Context, t *testing.T, base string) {
	const qa, qb = "page-a", "page-b"
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base), chromedp.WaitVisible(chromedp.ID("subscribe"))))
	subscribe := func(q, group, ack string) {
		t.Helper()
		require.NoError(t, chromedp.Do(ctx,
			chromedp.SetValue(chromedp.ID("queue"), q),
			chromedp.SetValue(chromedp.ID("group"), group),
			chromedp.SetValue(chromedp.ID("transport"), "ws"),
			chromedp.SetValue(chromedp.ID("ackmode"), ack),
			chromedp.Click(chromedp.ID("subscribe")),
		))
	}
	subscribe(qa, "auto", "auto")     // sub-1
	subscribe(qa, "manual", "manual") // sub-2
	subscribe(qb, "other", "auto")    // sub-3
	for _, id := range []string{"sub-1", "sub-2", "sub-3"} {
		waitJS(ctx, t, id+" connects", fmt.Sprintf(`document.getElementById(%q)?.dataset.state === "connected"`, id))
	}
	waitJS(ctx, t, "the live panel shows both subscribed queues",
		`(() => { const h = [...document.querySelectorAll("#queue-status [data-queue]")].map((e) => e.dataset.queue);
			return h.includes("page-a") && h.includes("page-b"); })()`)

	// 4 messages to page-a from the page's push form (the form's queue is
	// the last subscribed, page-b: set it back), 1 to page-b.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SetValue(chromedp.ID("queue"), qa),
		chromedp.SetValue(chromedp.ID("count"), "4"),
		chromedp.SetValue(chromedp.ID("rate"), "0"),
		chromedp.Click(chromedp.ID("push")),
	))
	pushOne(t, base, qb, `{"other":1}`)
	rows := func(id, class string) string {
		return fmt.Sprintf(`document.querySelectorAll("#%s tbody tr.%s").length`, id, class)
	}
	waitJS(ctx, t, "the auto subscription's 4 rows are acked by the server", rows("sub-1", "acked")+` === 4`)
	waitJS(ctx, t, "page-b's row is acked", rows("sub-3", "acked")+` === 1`)
	waitJS(ctx, t, "the manual subscription shows 4 rows", `document.querySelectorAll("#sub-2 tbody tr").length === 4`)
	status, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#sub-1 tbody tr:first-child td.status")))
	require.NoError(t, err)
	assert.Equal(t, "acked", status, "the status cell says so in words")

	// Name the manual subscription's first delivery, oldest first: later
	// deliveries of the same messages get rows of their own.
	_, err = chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void](
		`[...document.querySelectorAll("#sub-2 tbody tr")].reverse().forEach((r, i) => { r.dataset.test = "first-" + i; })`))
	require.NoError(t, err)
	row := func(i int) string { return fmt.Sprintf(`#sub-2 tbody tr[data-test="first-%d"]`, i) }
	// Ack the oldest, nack the next: a nack ends the lease of the delivery.
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(row(0)+" button.ack"))))
	waitJS(ctx, t, "the first row acked", fmt.Sprintf(`document.querySelector(%q).classList.contains("acked")`, row(0)))
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(row(1)+" button.nack"))))
	waitJS(ctx, t, "the second row nacked", fmt.Sprintf(`document.querySelector(%q).classList.contains("nacked")`, row(1)))
	nacked, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(row(1)+" td.status")))
	require.NoError(t, err)
	assert.Equal(t, "nacked", nacked)
	// The third row's lease ended with the nack: acking it is refused, and
	// the row shows the server's reason.
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(row(2)+" button.ack"))))
	waitJS(ctx, t, "the late ack is marked failed", fmt.Sprintf(`document.querySelector(%q).classList.contains("ack-failed")`, row(2)))
	failed, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(row(2)+" td.status")))
	require.NoError(t, err)
	assert.Regexp(t, `^ack failed: \S`, failed, "the row names the failure and the server's reason")
	waitJS(ctx, t, "the nacked message comes again", `document.querySelectorAll("#sub-2 tbody tr").length > 4`)
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	artifact(t, "demo-row-states.png", shot)

	// Ack what is left (the fourth row's old lease fails too; its new
	// delivery does not): both groups of page-a end at lag 0.
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#sub-2 .ack-all"))))
	require.Eventually(t, func() bool { return settledEverywhere(t, base, qa, "auto", "manual") },
		20*time.Second, 50*time.Millisecond, "page-a settled in both groups")
	waitJS(ctx, t, "the live panel shows page-a at lag 0 in both groups",
		`[...document.querySelectorAll('#queue-status [data-queue="page-a"] dd.lag')].map((e) => e.textContent).join() === "lag 0 · 0 leased,lag 0 · 0 leased"`)
}

// herald.js follow() keeps its position itself: when the browser gives an
// EventSource up (it is CLOSED: here forced, as after a non-200 answer),
// it opens a new one after the last event id it received, which a new
// EventSource would not send by itself; before the first message, after
// the start the server named (event: start). A page that closes a follow
// and follows again with its lastEventId gets exactly the rest. Every
// message once, in order.
func TestHeraldJS_FollowResumesAfterItsLastEventID(t *testing.T) {
	bin := buildHerald(t)
	p := startHerald(t, bin, dataDir(t), "--database-url", pgtest.DSN(t))
	ctx := browser(t)
	const q = "js-follow"
	push := func(from, to int) {
		var items []string
		for i := from; i <= to; i++ {
			items = append(items, fmt.Sprintf(`{"queue":%q,"partition":"p","payload":{"n":%d}}`, q, i))
		}
		postJSON(t, p.url+"api/v1/push", `{"items":[`+strings.Join(items, ",")+`]}`)
	}
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(p.url+"herald.js")))
	evalJS[string](ctx, t, `(async () => {
		const Native = EventSource;
		window.__es = [];
		window.EventSource = class extends Native {
			constructor(...a) { super(...a); window.__es.push(this); }
		};
		const { Herald } = await import("/herald.js");
		const t = window.__t = { got: [], got2: [], states: [], urls: () => window.__es.map((e) => e.url) };
		window.__h = new Herald(location.origin);
		window.__f = __h.follow("`+q+`", {
			onMessage: (m) => { t.got.push(m.data.n); },
			onState: (s) => t.states.push(s),
		});
		// The browser gives the stream up (readyState CLOSED, then error).
		window.__giveUp = () => { const es = window.__es.at(-1); es.close(); es.onerror(new Event("error")); };
		return "ok";
	})()`)
	waitState(ctx, t, 10*time.Second, "the follow connects and knows its start",
		`__t.states.some((s) => s.state === "connected") && __f.lastEventId !== ""`)
	start := evalJS[string](ctx, t, `__f.lastEventId`)
	assert.True(t, evalJS[bool](ctx, t, `__t.states.find((s) => s.state === "connected").resumedAfter === undefined`),
		"the first stream is no resume")

	evalJS[string](ctx, t, `(__giveUp(), "ok")`)
	push(1, 3)
	waitState(ctx, t, 20*time.Second, "a new EventSource after the start gets what was pushed meanwhile",
		`JSON.stringify(__t.got) === "[1,2,3]" && __es.length === 2`)
	assert.Contains(t, evalJS[string](ctx, t, `__es[1].url`), "lastEventId="+start, "the new stream names the start")

	evalJS[string](ctx, t, `(__giveUp(), "ok")`)
	push(4, 5)
	waitState(ctx, t, 20*time.Second, "and after its last message",
		`JSON.stringify(__t.got) === "[1,2,3,4,5]" && __es.length === 3`)
	assert.True(t, evalJS[bool](ctx, t, `__t.states.some((s) => s.state === "connected" && s.resumedAfter === new URL(__es[2].url).searchParams.get("lastEventId"))`),
		"onState says after which id it resumed")

	// The page closes the follow and, later, follows again from its id.
	evalJS[string](ctx, t, `(window.__last = __f.lastEventId, __f.close(), "ok")`)
	push(6, 7)
	evalJS[string](ctx, t, `(window.__g = __h.follow("`+q+`", { lastEventId: __last, onMessage: (m) => { __t.got2.push(m.data.n); } }), "ok")`)
	waitState(ctx, t, 20*time.Second, "a new follow with the last id gets exactly the rest", `JSON.stringify(__t.got2) === "[6,7]"`)
	push(8, 8)
	waitState(ctx, t, 20*time.Second, "and goes on", `JSON.stringify(__t.got2) === "[6,7,8]"`)
	assert.Equal(t, "[1,2,3,4,5]", evalJS[string](ctx, t, `JSON.stringify(__t.got)`), "the closed follow got nothing more")
	evalJS[string](ctx, t, `(__g.close(), "ok")`)
}

// herald.js sends again an ack the server could not take because its
// database was away (503 with Retry-After): the database freezes under a
// real herald, the page acks a message it popped, the first answer is 503;
// once the database is back the same ack goes through and the message is
// done (a pop finds nothing), with no error reported to the page.
func TestHeraldJS_AckAnsweredUnavailableIsSentAgain(t *testing.T) {
	proxy, dsn := pgtest.NewProxy(t, pgtest.DSN(t))
	bin := buildHerald(t)
	p := startHerald(t, bin, dataDir(t), "--database-url", dsn)
	ctx := browser(t)
	const q = "js-ack-retry"
	postJSON(t, p.url+"api/v1/push", `{"items":[{"queue":"`+q+`","payload":{"n":1}}]}`)
	code, popped := get(t, p.url+"api/v1/pop/queue/"+q+"?wait=false")
	require.Equal(t, http.StatusOK, code, popped)

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(p.url+"herald.js")))
	evalJS[string](ctx, t, `(async () => {
		const { Herald } = await import("/herald.js");
		const t = window.__t = { statuses: [], result: null, error: null };
		const fetch0 = window.fetch; // observed, not changed
		window.fetch = async (...a) => {
			const res = await fetch0(...a);
			if (String(a[0]).includes("/api/v1/ack")) t.statuses.push(res.status);
			return res;
		};
		window.__h = new Herald(location.origin);
		window.__m = (`+popped+`).messages[0];
		return "ok";
	})()`)
	proxy.Freeze()
	evalJS[string](ctx, t, `(__h.ack(__m).then((r) => { __t.result = r; }, (e) => { __t.error = String(e); }), "ok")`)
	waitState(ctx, t, 30*time.Second, "the ack is answered 503 while the database is frozen", `__t.statuses.includes(503)`)
	proxy.Thaw()
	waitState(ctx, t, 40*time.Second, "the ack is sent again and taken", `__t.result !== null || __t.error !== null`)
	assert.Equal(t, "null", evalJS[string](ctx, t, `JSON.stringify(__t.error)`), "no error reaches the page")
	assert.Equal(t, 200, evalJS[int](ctx, t, `__t.statuses.at(-1)`), "the last try was taken")
	assert.True(t, evalJS[bool](ctx, t, `JSON.stringify(__t.result).includes('"success":true')`), "%s", evalJS[string](ctx, t, `JSON.stringify(__t.result)`))
	code, body := get(t, p.url+"api/v1/pop/queue/"+q+"?wait=false")
	assert.Equal(t, http.StatusNoContent, code, "the message is done: %s", body)
}
