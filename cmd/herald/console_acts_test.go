package main

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// confirmDialog waits for the console's confirmation dialog and presses
// its button: ok or cancel.
func confirmDialog(ctx context.Context, t *testing.T, ok bool) {
	t.Helper()
	waitJS(ctx, t, "the confirmation dialog opens", `document.getElementById("confirm").open`)
	button := "#confirm-cancel"
	if ok {
		button = "#confirm-ok"
	}
	click(ctx, t, button) // a DOM click: no coordinates to miss under a changed viewport
	waitJS(ctx, t, "the dialog closes", `!document.getElementById("confirm").open`)
}

func click(ctx context.Context, t *testing.T, selector string) {
	t.Helper()
	ok := evalJS[bool](ctx, t, fmt.Sprintf(`(() => { const b = document.querySelector(%q); if (!b) return false; b.click(); return true; })()`, selector))
	if !ok {
		t.Fatalf("no %s to click; page:\n%s", selector, evalJS[string](ctx, t, `document.getElementById("view").innerText`))
	}
}

type dlqList struct {
	Total    int `json:"total"`
	Messages []struct {
		ID            string `json:"dlqId"`
		TransactionID string `json:"transactionId"`
	} `json:"messages"`
}

// consoleDLQ: replay one dead letter (it is delivered to its group again),
// replay one whose group holds a lease (skipped: leased, shown), purge one,
// and purge all matching an error filter.
func consoleDLQ(ctx context.Context, t *testing.T, a *adminClient, seed *consoleSeed) {
	row := func(tx string) string { return fmt.Sprintf(`#dlq-list tr[data-tx=%q]`, tx) }
	goTo(ctx, t, "#/dlq?queue=orders&consumerGroup=billing", `document.querySelectorAll("#dlq-list tr[data-id]").length === 3`)
	assert.Equal(t, "page 1 of 1 (3 dead letters)", text(ctx, t, "#dlq-list .page-of"))
	assertAllLabelled(ctx, t)

	// View: payload and retries. The dead letter failed twice (retryLimit
	// 1): one retry, which is what retryCount counts, so the column and the
	// detail say "retries", not "attempts" (there were two).
	headers := evalJS[string](ctx, t, `Promise.resolve([...document.querySelectorAll("#dlq-list thead th")].map((th) => th.textContent).join("|"))`)
	assert.Contains(t, headers, "retries", "the column of retryCount is named for what it counts")
	assert.NotContains(t, headers, "attempts", "retryCount is not the number of attempts")
	click(ctx, t, row(seed.dead[0])+" .view")
	detail := evalJS[string](ctx, t, fmt.Sprintf(`document.querySelector(%q).nextElementSibling.innerText`, row(seed.dead[0])))
	assert.Contains(t, detail, `"n": 1`)
	assert.Regexp(t, `retries\s+1`, detail)
	assert.NotContains(t, detail, "attempts")
	assert.Contains(t, detail, "boom: card declined")

	// Replay the first, selected by its checkbox.
	click(ctx, t, row(seed.dead[0])+" input.pick")
	assert.Equal(t, "1 selected", text(ctx, t, "#dlq-selected"))
	click(ctx, t, "#dlq-replay")
	confirmDialog(ctx, t, true)
	waitJS(ctx, t, "the replay's outcome", `document.querySelector("#dlq-outcome")?.innerText.includes("Replayed 1")`)
	assert.Equal(t, 1, evalJS[int](ctx, t, `document.querySelectorAll('#dlq-outcome tr[data-status="replayed"]').length`))
	p := a.pop("orders", "eu", "billing", 1)
	require.Len(t, p.Messages, 1, "the replayed message is delivered to billing again")
	assert.Equal(t, seed.dead[0], p.Messages[0].TransactionID)

	// billing now holds eu's lease: replaying the second is skipped.
	waitJS(ctx, t, "the list is read again", fmt.Sprintf(`!!document.querySelector(%q)`, row(seed.dead[1])))
	click(ctx, t, row(seed.dead[1])+" .replay-one")
	confirmDialog(ctx, t, true)
	waitJS(ctx, t, "skipped: leased", `document.querySelector("#dlq-outcome")?.innerText.includes("skipped 1 leased")`)
	assert.Equal(t, "leased", text(ctx, t, `#dlq-outcome tr[data-status="skipped"] td:nth-child(3)`))
	shot(ctx, t, "console-dlq.png", false)
	phone(ctx, t, "console-dlq-phone.png")
	desktop(ctx, t)
	a.ack(p, "billing", "completed", "")

	// Purge the second: its row goes, and the API agrees.
	click(ctx, t, row(seed.dead[1])+" .purge-one")
	confirmDialog(ctx, t, true)
	waitJS(ctx, t, "purged", `document.querySelector("#dlq-outcome")?.innerText.includes("Purged 1")`)
	waitJS(ctx, t, "its row is gone", fmt.Sprintf(`!document.querySelector(%q)`, row(seed.dead[1])))
	var left dlqList
	a.call(http.MethodGet, "api/v1/dlq?queue=orders&consumerGroup=billing", nil, &left)
	for _, m := range left.Messages {
		assert.NotEqual(t, seed.dead[1], m.TransactionID, "the purged dead letter is gone")
	}

	// Purge all matching "timeout": the filter's one.
	goTo(ctx, t, "#/dlq", `!!document.querySelector("#dlq-error")`)
	require.NoError(t, chromedp.Do(ctx, chromedp.SetValue(chromedp.CSS("#dlq-queue"), "orders"), chromedp.SetValue(chromedp.CSS("#dlq-error"), "timeout"),
		chromedp.Click(chromedp.CSS(`#dlq-filter button[type="submit"]`))))
	waitJS(ctx, t, "one timeout", `document.querySelector("#dlq-list")?.dataset.query?.includes("error=timeout") &&
		document.querySelectorAll("#dlq-list tr[data-id]").length === 1`)
	// A cancelled purge does nothing.
	click(ctx, t, "#dlq-purge-all")
	confirmDialog(ctx, t, false)
	a.call(http.MethodGet, "api/v1/dlq?queue=orders&error=timeout", nil, &left)
	require.Equal(t, 1, left.Total, "cancelled: nothing purged")
	click(ctx, t, "#dlq-purge-all")
	confirmDialog(ctx, t, true)
	waitJS(ctx, t, "purged all matching", `document.querySelector("#dlq-outcome")?.innerText.includes("Purged 1") &&
		document.querySelectorAll("#dlq-list tr[data-id]").length === 0`)
	a.call(http.MethodGet, "api/v1/dlq?queue=orders&error=timeout", nil, &left)
	assert.Equal(t, 0, left.Total)
	assert.Zero(t, evalJS[int](ctx, t, `document.querySelectorAll("#dlq-outcome tr[data-status]").length`),
		"a purge by filter reports counts, no items")
}

// groupLag is a group's lag on a queue as the API says (-1: no such group).
func groupLag(t *testing.T, a *adminClient, queue, group string) int64 {
	t.Helper()
	var st struct {
		Queue struct {
			Groups []struct {
				Group string `json:"group"`
				Lag   int64  `json:"lag"`
			} `json:"groups"`
		} `json:"queue"`
	}
	a.call(http.MethodGet, "internal/api/status?queue="+queue, nil, &st)
	for _, g := range st.Queue.Groups {
		if g.Group == group {
			return g.Lag
		}
	}
	return -1
}

// consoleGroups: seek to the end (lag 0), seek to a time an hour ago (every
// message again), delete a group on one queue and a group everywhere.
func consoleGroups(ctx context.Context, t *testing.T, a *adminClient) {
	row := func(g string) string { return fmt.Sprintf(`#groups tr[data-group=%q][data-queue="orders"]`, g) }
	goTo(ctx, t, "#/groups", fmt.Sprintf(`!!document.querySelector(%q) && !!document.querySelector(%q)`, row("shipping"), row("billing")))
	require.Positive(t, groupLag(t, a, "orders", "shipping"))
	assert.Equal(t, fmt.Sprint(groupLag(t, a, "orders", "shipping")), text(ctx, t, row("shipping")+" td.lag"))

	click(ctx, t, row("shipping")+" .seek")
	confirmDialog(ctx, t, true) // "to the end" is the default choice
	waitJS(ctx, t, "the seek's result", `document.getElementById("group-result").innerText.includes("to the end")`)
	waitJS(ctx, t, "shipping's lag is 0", fmt.Sprintf(`document.querySelector(%q)?.innerText === "0"`, row("shipping")+" td.lag"))
	assert.Equal(t, int64(0), groupLag(t, a, "orders", "shipping"), "the API agrees")

	click(ctx, t, row("billing")+" .seek")
	waitJS(ctx, t, "the seek dialog", `document.getElementById("confirm").open`)
	evalJS[bool](ctx, t, `(() => { const at = document.getElementById("seek-at");
		at.value = new Date(Date.now() - 3600e3 - new Date().getTimezoneOffset() * 60e3).toISOString().slice(0, 19);
		at.dispatchEvent(new Event("input")); return true; })()`)
	assert.True(t, evalJS[bool](ctx, t, `document.getElementById("seek-time").checked`))
	confirmDialog(ctx, t, true)
	waitJS(ctx, t, "billing sought back", `document.getElementById("group-result").innerText.includes("Moved billing on orders back to ")`)
	waitJS(ctx, t, "billing's lag is every message", fmt.Sprintf(`document.querySelector(%q)?.innerText === "8"`, row("billing")+" td.lag"))
	assert.Equal(t, int64(8), groupLag(t, a, "orders", "billing"), "the API agrees")
	shot(ctx, t, "console-groups.png", false)
	phone(ctx, t, "console-groups-phone.png")
	desktop(ctx, t)

	click(ctx, t, row("shipping")+" .delete-queue")
	confirmDialog(ctx, t, true)
	waitJS(ctx, t, "shipping's row is gone", fmt.Sprintf(`document.getElementById("group-result").innerText.includes("Deleted shipping on orders") && !document.querySelector(%q)`, row("shipping")))
	assert.Equal(t, int64(-1), groupLag(t, a, "orders", "shipping"))

	click(ctx, t, row("billing")+" .delete-group")
	confirmDialog(ctx, t, true)
	waitJS(ctx, t, "billing's row is gone", fmt.Sprintf(`!document.querySelector(%q)`, row("billing")))
	var groups []struct{ Name string }
	a.call(http.MethodGet, "api/v1/consumer-groups", nil, &groups)
	for _, g := range groups {
		assert.NotEqual(t, "billing", g.Name)
		assert.NotEqual(t, "shipping", g.Name)
	}
}

// consoleMaintenance: each switch on and off from the page, the API
// agreeing each time; a cancelled confirmation switches nothing.
func consoleMaintenance(ctx context.Context, t *testing.T, a *adminClient) {
	goTo(ctx, t, "#/system", `!!document.querySelector('#maintenance section[data-mode="pop"]')`)
	state := func() (push, pop bool) {
		var m struct{ MaintenanceMode, PopMaintenanceMode bool }
		a.call(http.MethodGet, "api/v1/system/maintenance", nil, &m)
		return m.MaintenanceMode, m.PopMaintenanceMode
	}
	click(ctx, t, "#maint-pop")
	confirmDialog(ctx, t, false)
	_, pop := state()
	assert.False(t, pop, "cancelled: pop maintenance stays off")
	for _, mode := range []string{"push", "pop"} {
		for _, on := range []bool{true, false} {
			want := map[bool]string{true: "on", false: "off"}[on]
			click(ctx, t, "#maint-"+mode)
			confirmDialog(ctx, t, true)
			waitJS(ctx, t, mode+" maintenance "+want, fmt.Sprintf(`document.querySelector('#maintenance section[data-mode=%q]')?.dataset.state === %q`, mode, want))
			push, pop := state()
			assert.Equal(t, on, map[string]bool{"push": push, "pop": pop}[mode], "the API agrees: %s %s", mode, want)
			if on && mode == "push" {
				assert.Contains(t, text(ctx, t, "#maint-result"), "aintenance", "the switch's answer is shown")
				shot(ctx, t, "console-maintenance.png", false)
			}
		}
	}
}
