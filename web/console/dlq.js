// dlq.js: the dead-letter queue: filter by queue, group, partition, error
// and time; view a dead letter's payload and retries; replay (back to its
// partition for its group) or purge one, a selection, or everything
// matching the filter, after a confirmation; each item's outcome shown.
import { ago, api, enc, exact, get, json, query, when } from "./api.js";
import { confirm, errorBox, h, link, notice, pager, pre, section, table } from "./ui.js";

const PAGE = 50;
// "All matching" acts on at most this many per request (the route's cap).
const BULK = 1000;

const fields = [
  { key: "queue", label: "Queue" },
  { key: "consumerGroup", label: "Consumer group" },
  { key: "partition", label: "Partition" },
  { key: "error", label: "Error contains" },
  { key: "from", label: "Failed from", type: "datetime-local" },
  { key: "to", label: "Failed before", type: "datetime-local" },
];

/** dlID(d) → the dead letter's own id, which replay and purge name. */
const dlID = (d) => String(d.dlqId);

// iso reads a datetime-local value (local time) as an RFC 3339 time.
function iso(v) {
  if (!v) return "";
  const t = new Date(v);
  return Number.isNaN(t.getTime()) ? "" : t.toISOString();
}

/** render(root, {params}) draws the dead letters matching the filter in params. */
export async function render(root, { params }) {
  const offset = Math.max(0, Number(params.offset) || 0);
  const filter = Object.fromEntries(fields.map((f) => [f.key, params[f.key] ?? ""]));
  root.append(h("div", { className: "page-head" }, h("h1", {}, "Dead letters")));

  const inputs = {};
  const form = h("form", { className: "filters", id: "dlq-filter", on: { submit: (ev) => {
    ev.preventDefault();
    location.hash = `#/dlq${query(Object.fromEntries(fields.map((f) => [f.key, inputs[f.key].value.trim()])))}`;
  } } },
  fields.map((f) => {
    inputs[f.key] = h("input", { id: `dlq-${f.key}`, name: f.key, type: f.type ?? "text", value: filter[f.key], autocomplete: "off", step: f.type ? "1" : undefined });
    return h("div", { className: "field" }, h("label", { for: `dlq-${f.key}` }, f.label), inputs[f.key]);
  }),
  h("div", { className: "field buttons" },
    h("button", { type: "submit" }, "Filter"),
    h("button", { type: "button", className: "secondary", on: { click: () => { location.hash = "#/dlq"; } } }, "Clear")));
  root.append(section("Filter", form));

  const outcome = h("div", { id: "dlq-outcome", "aria-live": "polite" });
  const list = h("div", { id: "dlq-list" }, h("p", { className: "muted" }, "Loading…"));
  root.append(outcome, list);

  // The filter as the API takes it (times as RFC 3339).
  const apiFilter = { ...filter, from: iso(filter.from), to: iso(filter.to) };
  const selected = new Set();
  let page;

  async function load() {
    try {
      page = await get("/dlq", { ...apiFilter, limit: PAGE, offset });
    } catch (e) {
      list.replaceChildren(errorBox(e, "Reading the dead letters"));
      return;
    }
    selected.clear();
    draw();
    // Which filter this list shows (tests wait on it, not on the hash).
    list.dataset.query = query(filter);
  }

  function draw() {
    const msgs = page.messages ?? [];
    const count = h("span", { id: "dlq-selected", className: "muted" }, "none selected");
    const replaySel = h("button", { type: "button", id: "dlq-replay", disabled: true, on: { click: () => act("replay", [...selected]) } }, "Replay selected");
    const purgeSel = h("button", { type: "button", id: "dlq-purge", className: "danger", disabled: true, on: { click: () => act("purge", [...selected]) } }, "Purge selected");
    const sync = () => {
      const n = selected.size;
      count.textContent = n ? `${n} selected` : "none selected";
      replaySel.disabled = purgeSel.disabled = n === 0;
      all.checked = n > 0 && n === msgs.length;
      all.indeterminate = n > 0 && n < msgs.length;
    };
    const boxes = [];
    const all = h("input", { type: "checkbox", id: "dlq-all", "aria-label": "Select every dead letter on this page", on: { change: () => {
      for (const [b, id] of boxes) {
        b.checked = all.checked;
        if (all.checked) selected.add(id);
        else selected.delete(id);
      }
      sync();
    } } });
    const rows = [];
    for (const d of msgs) {
      const id = dlID(d);
      const box = h("input", { type: "checkbox", className: "pick", "aria-label": `Select dead letter ${id}`, on: { change: () => {
        if (box.checked) selected.add(id);
        else selected.delete(id);
        sync();
      } } });
      boxes.push([box, id]);
      const detail = h("tr", { className: "detail", hidden: true }, h("td", { colspan: "8" }, details(d)));
      const view = h("button", { type: "button", className: "secondary view", "aria-expanded": "false", on: { click: () => {
        detail.hidden = !detail.hidden;
        view.setAttribute("aria-expanded", String(!detail.hidden));
        view.textContent = detail.hidden ? "View" : "Hide";
      } } }, "View");
      rows.push({ attrs: { dataset: { id, tx: d.transactionId } }, cells: [
        box,
        { v: ago(d.failedAt), title: when(d.failedAt) },
        link(`#/queue/${enc(d.queue)}`, d.queue),
        link(`#/partition/${enc(d.queue)}/${enc(d.partition)}`, d.partition),
        d.consumerGroup,
        { v: d.errorMessage || "—", className: "error-text", title: d.errorMessage },
        exact(d.retryCount),
        h("span", { className: "cell-actions" }, view,
          h("button", { type: "button", className: "secondary replay-one", on: { click: () => act("replay", [id]) } }, "Replay"),
          h("button", { type: "button", className: "danger purge-one", on: { click: () => act("purge", [id]) } }, "Purge")),
      ] }, detail);
    }
    const t = table({
      caption: "Dead letters, newest first",
      className: "dlq",
      columns: [{ label: "" }, { label: "failed" }, { label: "queue" }, { label: "partition" }, { label: "group" }, { label: "error" },
        { label: "retries", num: true, title: "retryCount: how many times the message was retried before it was dead-lettered" }, { label: "" }],
      rows: rows.filter((r) => !(r instanceof Node)),
      empty: "No dead letter matches.",
    });
    // Put each detail row right after its row.
    const trs = [...t.querySelectorAll("tbody > tr")];
    rows.filter((r) => r instanceof Node).forEach((d, i) => trs[i]?.after(d));
    t.querySelector("thead th").replaceChildren(all);
    list.replaceChildren(
      h("div", { className: "toolbar" }, count, replaySel, purgeSel,
        h("span", { className: "spacer" }),
        h("button", { type: "button", id: "dlq-replay-all", className: "secondary", disabled: page.total === 0, on: { click: () => act("replay", null) } },
          `Replay all ${exact(page.total)} matching`),
        h("button", { type: "button", id: "dlq-purge-all", className: "danger", disabled: page.total === 0, on: { click: () => act("purge", null) } },
          `Purge all ${exact(page.total)} matching`)),
      pager({ offset, limit: PAGE, total: page.total, noun: "dead letters",
        go: (o) => { location.hash = `#/dlq${query({ ...filter, offset: o || "" })}`; } }),
      t);
  }

  // act replays or purges ids, or (ids null) everything matching the filter.
  async function act(verb, ids) {
    const n = ids ? ids.length : Math.min(page.total, BULK);
    const described = Object.entries(filter).filter(([, v]) => v).map(([k, v]) => `${k} = ${v}`).join(", ") || "no filter: every dead letter";
    const ok = await confirm({
      title: `${verb === "replay" ? "Replay" : "Purge"} ${n} dead letter${n === 1 ? "" : "s"}?`,
      ok: verb === "replay" ? "Replay" : "Purge",
      danger: verb === "purge",
      body: [verb === "replay"
        ? "Each goes back to its partition for its consumer group, to be delivered again (at least once). One whose group holds a lease there, or whose message is gone, is skipped."
        : "Each is deleted from the dead-letter queue for good; its message is not delivered again.",
      ids ? "" : ` Matching: ${described}.${page.total > BULK ? ` At most ${BULK} per click.` : ""}`],
    });
    if (!ok) return;
    const body = ids ? { ids } : { filter: Object.fromEntries(Object.entries(apiFilter).filter(([, v]) => v)), limit: BULK };
    try {
      const r = await api("POST", `/dlq/${verb}`, body);
      // Dead letters skipped because their group held a lease may go
      // back once it ends: one click asks again.
      const leased = (r.items ?? []).filter((it) => it.reason === "leased").map((it) => String(it.id));
      const again = leased.length && verb === "replay"
        ? h("button", { type: "button", id: "dlq-retry", className: "secondary", on: { click: () => act("replay", leased) } },
          `Retry the ${leased.length} skipped (leased)`)
        : null;
      outcome.replaceChildren(result(verb, r, again));
    } catch (e) {
      outcome.replaceChildren(errorBox(e, verb === "replay" ? "Replaying" : "Purging"));
    }
    await load();
  }

  await load();
}

// details shows a dead letter whole: payload, retries, ids, its message.
function details(d) {
  return h("div", { className: "dl-detail" },
    h("dl", { className: "facts" },
      h("dt", {}, "retries"), h("dd", {}, exact(d.retryCount)),
      h("dt", {}, "error"), h("dd", {}, d.errorMessage || "—"),
      h("dt", {}, "failed at"), h("dd", {}, when(d.failedAt)),
      h("dt", {}, "pushed at"), h("dd", {}, when(d.createdAt)),
      h("dt", {}, "transaction id"), h("dd", { className: "mono" }, d.transactionId),
      h("dt", {}, "message"), h("dd", {}, link(`#/message/${enc(d.partitionId)}/${enc(d.transactionId)}`, "state and traces"))),
    h("h3", {}, "Payload"), pre(json(d.data)));
}

// Why a dead letter was skipped, in the operator's words.
const reasons = {
  leased: "its group holds a lease on the partition now: retry once the lease ends",
  not_found: "no such dead letter any more (replayed or purged before)",
  message_gone: "retention or a delete removed the message: it cannot be put back in its place",
  too_far: "the group's cursor is over 50,000 offsets past it: push its payload again instead",
  expired: "the queue's maxWaitTimeSeconds has passed for it: retention would dead-letter it again; push its payload again or raise maxWaitTimeSeconds",
  group_gone: "the group was deleted from that partition",
};

// result shows what a replay or purge did, in total and per item.
function result(verb, r, again) {
  const done = verb === "replay" ? r.replayed : r.purged;
  const skipped = Object.entries(r.skipped ?? {}).filter(([, n]) => n > 0);
  const head = `${verb === "replay" ? "Replayed" : "Purged"} ${done ?? 0}` +
    (skipped.length ? `; skipped ${skipped.map(([k, n]) => `${n} ${k.replace(/_/g, " ")}`).join(", ")}` : "") + ".";
  const items = r.items ?? [];
  return section(verb === "replay" ? "Replay outcome" : "Purge outcome",
    notice(head, skipped.length ? "warn" : "ok"),
    items.length ? table({
      caption: `${verb} outcome per dead letter`,
      className: "outcome-items",
      columns: [{ label: "dead letter" }, { label: "outcome" }, { label: "reason" }],
      rows: items.map((it) => ({ attrs: { dataset: { id: String(it.id), status: it.status } },
        cells: [String(it.id), it.status, it.reason ? it.reason.replace(/_/g, " ") : "—"] })),
    }) : null,
    skipped.length ? h("ul", { className: "reasons muted" }, skipped.map(([k]) => h("li", {}, h("strong", {}, k.replace(/_/g, " ")), `: ${reasons[k] ?? k}`))) : null,
    again);
}
