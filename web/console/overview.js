// overview.js: the console's first page, refreshed every 5 s (pausable):
// totals, queues with depth, oldest pending age, dead letters and push/ack
// rates, groups with their lag, the DLQ count and the instances. Lag,
// oldest pending age and dead letters per (queue, group) come from one
// call, /status/backlog: the hygiene loop's latest sample (up to 30 s old,
// the 100 pairs with the most waiting), which costs the server no query.
import { ago, api, count, duration, enc, exact, get } from "./api.js";
import { badge, errorBox, h, link, section, sparkline, stat, table } from "./ui.js";

const REFRESH_MS = 5000;
// SLOW_MS: the two reads that scan on the server (every group row; every
// dead letter for the total) are taken again at most this often, not at
// every refresh.
const SLOW_MS = 30000;
let paused = false;
const slow = { at: 0, groups: null, dlq: null };

function slowReads() {
  if (Date.now() - slow.at >= SLOW_MS) {
    slow.at = Date.now();
    slow.groups = get("/consumer-groups");
    slow.dlq = get("/dlq", { limit: 1 });
  }
  return slow;
}

/** render(root) draws the overview and refreshes it until the returned stop is called. */
export async function render(root, _route, live) {
  slow.at = 0; // a new visit (or a new token) reads everything afresh
  const toggle = h("button", { type: "button", className: "secondary", id: "pause", "aria-pressed": String(paused) });
  const stamp = h("span", { className: "muted", id: "refreshed", "aria-live": "off" });
  const body = h("div", { id: "overview" });
  const label = () => {
    toggle.textContent = paused ? "Resume auto-refresh" : "Pause auto-refresh";
    toggle.setAttribute("aria-pressed", String(paused));
  };
  label();
  toggle.addEventListener("click", () => {
    paused = !paused;
    label();
    if (!paused) refresh();
  });
  root.append(h("div", { className: "page-head" }, h("h1", {}, "Overview"), h("div", { className: "tools" }, stamp, toggle)), body);

  let busy = false;
  async function refresh() {
    if (busy || !live()) return; // a slow server: no pile-up of requests
    busy = true;
    try {
      const parts = await load();
      if (!live()) return;
      body.replaceChildren(...parts);
      stamp.textContent = `updated ${new Date().toLocaleTimeString()}`;
    } finally {
      busy = false;
    }
  }
  await refresh();
  const timer = setInterval(() => {
    if (!paused) refresh();
  }, REFRESH_MS);
  return () => clearInterval(timer);
}

// settle runs every read at once; each answer or error is drawn on its own.
async function settle(reads) {
  const out = await Promise.allSettled(Object.values(reads));
  const keys = Object.keys(reads);
  return Object.fromEntries(out.map((r, i) => [keys[i], r.status === "fulfilled" ? { ok: r.value } : { err: r.reason }]));
}

async function load() {
  const { groups, dlq } = slowReads();
  const r = await settle({
    overview: get("/resources/overview"),
    queues: get("/resources/queues", { limit: 200 }),
    rates: get("/status/rates"),
    groups,
    backlog: get("/status/backlog"),
    dlq,
    maint: get("/system/maintenance"),
    shared: get("/system/shared-state"),
    status: api("GET", "/internal/api/status"), // followers per queue: this instance's, every instance's
  });
  const queues = r.queues.ok?.queues ?? [];
  const backlog = r.backlog.ok ? backlogIndex(r.backlog.ok) : null;
  return [
    totals(r),
    maintenanceBanner(r.maint),
    queuesSection(r, queues, backlog),
    groupsSection(r, backlog),
    instancesSection(r.shared),
  ].filter(Boolean);
}

function totals(r) {
  if (r.overview.err) return errorBox(r.overview.err, "Totals");
  const o = r.overview.ok;
  const dl = r.dlq.ok?.total;
  return h("div", { className: "stats", id: "totals" },
    stat("queues", exact(o.queues)),
    stat("partitions", count(o.partitions), exact(o.partitions)),
    stat("pending", count(o.messages.pending), "messages waiting for a group, not leased"),
    stat("processing", count(o.messages.processing), "messages under a live lease"),
    stat("dead letters", dl === undefined ? "—" : count(dl), "rows in the dead-letter queue (one per message and group)",
      { id: "dlq-count" }),
    stat("max lag", duration(o.lag.time.max), "the oldest message a group waits for, over every queue"),
    stat("pushed/s", count(o.throughput.ingestedPerSecond), "messages pushed in the last minute ÷ 60"));
}

function maintenanceBanner(m) {
  if (!m.ok) return null;
  const on = [m.ok.maintenanceMode && "push", m.ok.popMaintenanceMode && "pop"].filter(Boolean);
  if (!on.length) return null;
  return h("div", { className: "alert warn", role: "status" },
    `Maintenance on: ${on.join(" and ")}. `, link("#/system", "Switch it off"));
}

// rateSeries reads the rates route's answer as {queue: {pushed: [], acked: []}}.
function rateSeries(ans) {
  const out = {};
  const list = Array.isArray(ans?.queues) ? ans.queues : Object.entries(ans?.queues ?? {}).map(([queue, v]) => ({ queue, ...v }));
  for (const q of list) {
    const name = q.queue ?? q.name;
    const pick = (k) => (q[k] ?? q.samples?.map((s) => s[k]) ?? []);
    out[name] = { pushed: pick("pushed"), acked: pick("acked") };
  }
  return out;
}

// rateCell: the sparkline of a queue's counts per interval and the mean
// rate over the last minute (the last interval is still running: alone it
// would read low).
function rateCell(values, what, seconds) {
  if (!values) return { v: "—", title: `nothing ${what} on this instance since it started` };
  const recent = values.slice(-Math.max(1, Math.round(60 / seconds)));
  const perSec = recent.reduce((a, b) => a + b, 0) / (recent.length * seconds);
  return { v: h("span", { className: "rate" }, sparkline(values, `${what} per ${seconds} s on this instance, last ${values.length} intervals`),
    ` ${count(perSec)}/s`), title: `${what} on this instance: ${values.join(", ")} per ${seconds} s, oldest first; the rate is the last minute's mean` };
}

// backlogIndex reads /status/backlog's answer: each pair by "queue\u0000group",
// and per queue the oldest pending age (the oldest over its groups; null when
// none waits) and the dead letters (summed over its groups). full says the
// sample reached its bound: a pair absent from it may lag all the same.
function backlogIndex(ans) {
  const pairs = new Map();
  const queues = new Map();
  for (const g of ans.groups ?? []) {
    pairs.set(`${g.queue}\u0000${g.group}`, g);
    const q = queues.get(g.queue) ?? { oldest: null, deadLetters: 0 };
    if (g.oldestPendingAgeSeconds != null) q.oldest = Math.max(q.oldest ?? 0, g.oldestPendingAgeSeconds);
    q.deadLetters += g.deadLetters;
    queues.set(g.queue, q);
  }
  return { pairs, queues, full: (ans.groups ?? []).filter((g) => g.lag > 0).length >= (ans.top ?? 100), sampledAt: ans.sampledAt };
}

// sampled: the tooltip's note on how fresh the backlog figures are.
function sampled(b) {
  return `sampled ${ago(b.sampledAt)} (the server samples every 30 s)`;
}

// oldestCell: a queue's oldest pending age from the backlog sample.
function oldestCell(b, name, read) {
  if (!b) return { v: "—", title: "backlog unavailable" };
  const q = b.queues.get(name);
  if (q?.oldest != null) return { v: duration(q.oldest), title: `age of the oldest message a group waits for; ${sampled(b)}` };
  if (!read) return { v: "no group", title: "no consumer group reads this queue yet", className: "muted" };
  if (b.full) return { v: "—", title: "not among the 100 groups with the most waiting" };
  return { v: "0\u00a0s", title: `every group is up to date; ${sampled(b)}` };
}

// deadLettersCell: a queue's dead letters over its groups, linked to the list.
function deadLettersCell(b, name) {
  if (!b) return { v: "—", title: "backlog unavailable" };
  const n = b.queues.get(name)?.deadLetters ?? 0;
  if (!n) return { v: "0", title: `no dead letter; ${sampled(b)}`, className: "muted" };
  return { v: link(`#/dlq?queue=${enc(name)}`, count(n)), title: `${exact(n)} dead letters over its groups; ${sampled(b)}` };
}

// followersCell is the queue's followers on every instance (the status
// route's clusterFollowers: the others' as of their last beat in the
// members table, up to two beats old: 4 s by default), and how many of
// them are here.
function followersCell(status, name) {
  if (status.err) return { v: "—", title: `unavailable: ${status.err.message}` };
  const here = status.ok.followers?.[name] ?? 0;
  const n = status.ok.clusterFollowers?.[name] ?? here;
  return { v: count(n), title: `${exact(n)} follow streams of ${name} on every instance, ${exact(here)} on this one` };
}

function queuesSection(r, queues, backlog) {
  if (r.queues.err) return section("Queues", errorBox(r.queues.err, "Queues"));
  const rates = r.rates.ok ? rateSeries(r.rates.ok) : null;
  const read = new Set((r.groups.ok ?? []).map((g) => g.queueName));
  const interval = r.rates.ok?.intervalSeconds ?? 10;
  const rows = queues.map((q) => ({
    attrs: { dataset: { queue: q.name } },
    cells: [
      link(`#/queue/${enc(q.name)}`, q.name),
      { v: count(q.partitions), title: exact(q.partitions) },
      { v: count(q.messages.pending), title: `${exact(q.messages.pending)} waiting, not leased` },
      { v: count(q.messages.processing), title: exact(q.messages.processing) },
      oldestCell(backlog, q.name, read.has(q.name)),
      rates ? rateCell(rates[q.name]?.pushed, "pushed", interval) : "—",
      rates ? rateCell(rates[q.name]?.acked, "acked", interval) : "—",
      { v: count(q.messages.total), title: `${exact(q.messages.total)} pushed ever` },
      deadLettersCell(backlog, q.name),
      followersCell(r.status, q.name),
    ],
  }));
  const more = r.queues.ok.pagination?.total > queues.length
    ? h("p", { className: "muted" }, `Showing the ${queues.length} newest of ${exact(r.queues.ok.pagination.total)} queues.`) : null;
  const ratesNote = r.rates.err
    ? h("p", { className: "muted small" }, `Rates unavailable: ${r.rates.err.status === 404 ? "this server has no /api/v1/status/rates" : r.rates.err.message}.`)
    : null;
  const backlogNote = r.backlog.err
    ? h("p", { className: "muted small" }, `Backlog unavailable: ${r.backlog.err.status === 404 ? "this server has no /api/v1/status/backlog" : r.backlog.err.message}.`)
    : null;
  return section("Queues", table({
    caption: "Queues",
    className: "queues",
    columns: [{ label: "queue" }, { label: "partitions", num: true }, { label: "depth", num: true, title: "pending: waiting, not leased" },
      { label: "processing", num: true }, { label: "oldest pending", num: true }, { label: "push rate", num: true },
      { label: "ack rate", num: true }, { label: "total", num: true }, { label: "dead letters", num: true },
      { label: "followers", num: true, title: "follow streams of the queue on every instance (each gets every message); the others' counts are up to two members beats old, 4 s by default" }],
    rows,
    empty: "No queue yet: a push or a subscription creates one.",
  }), more, ratesNote, backlogNote);
}

function groupsSection(r, backlog) {
  if (r.groups.err) return section("Consumer groups", errorBox(r.groups.err, "Consumer groups"));
  const rows = r.groups.ok.map((g) => {
    const b = backlog?.pairs.get(`${g.queueName}\u0000${g.name}`);
    // A pair absent from a sample that did not reach its bound has nothing waiting.
    const known = b || (backlog && !backlog.full);
    const fresh = backlog ? `; ${sampled(backlog)}` : "";
    return {
      attrs: { dataset: { group: g.name, queue: g.queueName } },
      cells: [
        link(`#/group/${enc(g.name)}`, g.name),
        link(`#/queue/${enc(g.queueName)}`, g.queueName),
        known ? { v: count(b?.lag ?? 0), title: `${exact(b?.lag ?? 0)} messages not finished${fresh}` } : "—",
        { v: count(g.partitionsWithLag), title: `of ${exact(g.members)} partitions` },
        b?.oldestPendingAgeSeconds != null
          ? { v: duration(b.oldestPendingAgeSeconds), title: `age of the oldest message it has not finished${fresh}` }
          : known ? { v: "—", title: `nothing waits${fresh}`, className: "muted" } : "—",
        known ? { v: count(b?.deadLetters ?? 0), title: `dead letters of this group${fresh}` } : "—",
        { v: duration(g.maxTimeLag), title: "age of the newest message it has not finished (a lower bound of its lag in time)" },
        badge(g.state, g.state === "Lagging" ? "warn" : g.state === "Dead" ? "muted" : "ok"),
      ],
    };
  });
  return section("Consumer groups", table({
    caption: "Consumer groups",
    className: "groups",
    columns: [{ label: "group" }, { label: "queue" }, { label: "lag", num: true }, { label: "partitions lagging", num: true },
      { label: "oldest pending", num: true }, { label: "dead letters", num: true }, { label: "time lag", num: true }, { label: "state" }],
    rows,
    empty: "No consumer group has read anything yet.",
  }));
}

function instancesSection(shared) {
  if (shared.err) return section("Instances", errorBox(shared.err, "Instances"));
  const s = shared.ok;
  const sync = s.syncnet;
  if (!sync) {
    return section("Instances", h("p", { id: "instances" }, "This instance only: syncnet is off (no peers to show)."));
  }
  const local = Object.entries(sync.localConsumers ?? {}).map(([q, n]) => `${q} (${n})`);
  const rows = [[h("strong", {}, `${sync.serverId} (this)`), badge("alive", "ok"), local.length ? local.join(", ") : "none", "—"]];
  for (const p of sync.peers ?? []) {
    rows.push([p.id || p.name, badge(p.alive ? "alive" : "dead", p.alive ? "ok" : "bad"),
      !p.presenceKnown ? "not known yet" : p.queuesWithSubscribers?.length ? p.queuesWithSubscribers.join(", ") : "none",
      p.lastHeartbeat ? ago(p.lastHeartbeat) : "—"]);
  }
  return section("Instances", table({
    caption: "Instances sharing this database",
    columns: [{ label: "instance" }, { label: "state" }, { label: "consumers (queue, count)" }, { label: "last heartbeat" }],
    rows,
  }));
}
