// The demo page: subscriptions over WebSocket or EventSource, a push form,
// and a live panel fed by /internal/api/status every second for each queue
// subscribed to. It uses the browser SDK exactly as user code would: each
// row shows what the server said of its ack (onAck / onError).
import { Herald } from "/herald.js";

const $ = (id) => document.getElementById(id);
const token = new URLSearchParams(location.search).get("access_token") ?? "";
const herald = new Herald(location.origin, { token });
const MAX_ROWS = 200;

// Clock offset between this browser and the server (server − browser, ms),
// so that "latency since push" compares the server's createdAt with the
// server's idea of now.
let clockOffset = 0;
let bestRTT = Infinity;

// Latencies received in the current second, and the chart's history. Only
// a message pushed after its subscription started (or reconnected) has a
// latency: one that waited in the queue before is a backlog, shown apart
// (its age says how long it waited for a consumer, not how fast delivery is).
let thisSecond = [];
const history = []; // per second, the last 60: null or {n, p50, max, sample}
const SAMPLE = 200; // latencies kept per second for the chart's scale
// The backlog drained so far, over every subscription: count and the
// longest wait.
const backlog = { n: 0, oldest: 0 };

let cards = 0;
// The open subscription cards' queues (card id → queue): the live panel
// follows them.
const followed = new Map();
let rowSerial = 0;

// When this page sent each message it pushed (transactionId → performance
// time): their latency needs no clock estimate.
const sentAt = new Map();

function randomID() {
  const b = crypto.getRandomValues(new Uint8Array(12)); // randomUUID needs a secure context
  return "demo-" + Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

// fmtMS formats a duration with the precision it has: "<0.1 ms",
// "0.4 ms", "12 ms", "16.8 s", "2.5 min".
// The number and its unit stay on one line (a no-break space).
function fmtMS(ms) {
  if (ms == null || !Number.isFinite(ms)) return "–";
  if (ms < 0.1) return "<0.1\u00a0ms";
  if (ms < 9.95) return `${ms.toFixed(1)}\u00a0ms`;
  if (ms < 999.5) return `${Math.round(ms)}\u00a0ms`;
  if (ms < 59950) return `${(ms / 1000).toFixed(1)}\u00a0s`;
  const min = ms / 60000;
  return `${min < 9.95 ? min.toFixed(1) : Math.round(min)}\u00a0min`;
}

// fmtUpTo is an upper bound, rounded up to the precision fmtMS shows.
function fmtUpTo(ms) {
  if (ms < 0.1) return fmtMS(0);
  const step = ms < 10 ? 0.1 : ms < 1000 ? 1 : 100;
  return `<${fmtMS(Math.ceil(ms / step - 1e-9) * step)}`;
}

// fmtEstimate shows a latency measured against the server's clock, whose
// estimate is off by up to err ms: "≈12 ms", or an upper bound when the
// error is as large as the value ("<0.6 ms" rather than "≈0.0 ms").
function fmtEstimate(ms, err) {
  if (!Number.isFinite(err)) return `≈${fmtMS(Math.max(0, ms))}`;
  if (ms <= err) return fmtUpTo(Math.max(0, ms) + err);
  // No tenths of a millisecond when the estimate is off by a millisecond or more.
  if (err >= 1 && ms < 9.95) return `≈${Math.round(ms)}\u00a0ms`;
  return `≈${fmtMS(ms)}`;
}

// plural(1, "stream") is "1 stream", plural(2, "stream") "2 streams".
function plural(n, one, many = `${one}s`) {
  return `${Number(n).toLocaleString("en")} ${n === 1 ? one : many}`;
}

function parseTime(s) {
  // Postgres gives microseconds; Date.parse wants at most milliseconds.
  return Date.parse(String(s).replace(/(\.\d{3})\d+/, "$1"));
}

function stateText(s) {
  switch (s.state) {
    case "reconnecting":
      return s.delay == null ? `reconnecting (attempt ${s.attempt})`
        : `reconnecting (attempt ${s.attempt}, in ${s.delay} ms)`;
    case "closed":
      return s.code ? `closed (${s.code}${s.reason ? ": " + s.reason : ""})` : "closed";
    default:
      return s.state;
  }
}

function addSubscription(opts) {
  cards++;
  const card = $("sub-card").content.firstElementChild.cloneNode(true);
  card.id = `sub-${cards}`;
  card.dataset.transport = opts.transport;
  const where = opts.partition ? `${opts.queue}/${opts.partition}` : opts.queue;
  const group = opts.consumerGroup || "queue mode";
  card.querySelector(".title").textContent =
    `${opts.transport === "ws" ? "WebSocket" : "EventSource"} · ${where} · ${group} · ack ${opts.ack}`;
  const stateEl = card.querySelector(".state");
  const countEl = card.querySelector(".count");
  const tbody = card.querySelector("tbody");
  const ackAll = card.querySelector(".ack-all");
  let count = 0;
  // When this subscription started, or last came back after a reconnect
  // (performance time): what was pushed before waited as a backlog.
  let since = performance.now();
  let lastState = "";
  const subBacklog = { n: 0, oldest: 0 };
  // The messages this subscription has had (the most recent SEEN): one
  // that comes again after a nack, or after a lease given back, which
  // counts no attempt, is a redelivery.
  const seen = new Set();
  const SEEN = 100000;
  const backlogEl = card.querySelector(".sub-backlog");
  // Rows waiting for a button, per delivery: a message delivered again
  // (a nack, an expired lease) gets a row and a lease of its own.
  const unsettled = new Map(); // row serial → {m, row}
  const rowOf = new WeakMap(); // message → its row

  const setState = (s) => {
    if (s.state === "connected" && lastState === "reconnecting") since = performance.now();
    lastState = s.state;
    stateEl.textContent = stateText(s);
    stateEl.className = `state ${s.state}`;
    card.dataset.state = s.state;
  };

  // mark says in the row what became of its message: the class colours
  // it, the status cell says it in words (with the server's reason).
  const mark = (row, state, text) => {
    if (!row) return;
    row.classList.remove("pending", "acked", "nacked", "ack-failed");
    row.classList.add(state);
    const cell = row.querySelector("td.status");
    cell.textContent = text;
    row.title = text;
  };
  const onAck = (m, status) => {
    const done = status === "completed";
    mark(rowOf.get(m), done ? "acked" : "nacked", done ? "acked" : "nacked");
  };
  const onError = (e) => {
    const m = e.herald?.message;
    const row = m && rowOf.get(m);
    if (!row) {
      // A subscribe the server refused (a token without the right to
      // this queue or partition, say): not a row's, the card's.
      stateEl.textContent = `refused: ${e.message}`;
      stateEl.title = e.message;
      stateEl.className = "state refused";
      card.dataset.state = "refused";
      return;
    }
    mark(row, "ack-failed", `${row.dataset.attempt ?? "ack"} failed: ${e.message}`);
  };

  const settle = async (key, ok) => {
    const u = unsettled.get(key);
    if (!u) return;
    unsettled.delete(key);
    u.row.dataset.attempt = ok ? "ack" : "nack";
    u.row.querySelector("td.status").textContent = ok ? "acking…" : "nacking…"; // the buttons go
    ackAll.hidden = unsettled.size === 0;
    // onAck / onError mark the row; the rejection is theirs to show.
    await (ok ? handle.ack(u.m) : handle.nack(u.m, "nacked from the demo page")).catch(() => {});
  };

  const onMessage = (m) => {
    // The wait since the push: exact for what this page pushed (from its
    // own send); otherwise the server's createdAt against its clock as
    // estimated, off by up to half the best round trip.
    const now = performance.now();
    const sent = sentAt.get(m.transactionId);
    let wait, err = 0, before;
    if (sent !== undefined) {
      wait = now - sent;
      before = sent < since;
    } else {
      const created = parseTime(m.createdAt);
      wait = performance.timeOrigin + now + clockOffset - created;
      err = bestRTT / 2;
      before = created < performance.timeOrigin + since + clockOffset;
    }
    // A message pushed before the subscription started is a backlog; a
    // later delivery of a message (a nack, an expired lease) is no push →
    // receipt latency either.
    const key = `${m.partitionId ?? m.partition}/${m.id ?? m.transactionId}`;
    const again = seen.has(key) || (m.retryCount ?? 0) > 0;
    seen.add(key);
    if (seen.size > SEEN) seen.delete(seen.values().next().value);
    const kind = before ? "backlog" : again ? "redelivery" : "live";
    const shown = sent !== undefined ? fmtMS(Math.max(0, wait)) : fmtEstimate(wait, err);
    let latencyText = shown;
    if (kind === "live") {
      if (Number.isFinite(wait)) thisSecond.push(Math.max(0, wait));
    } else if (kind === "backlog") {
      latencyText = `backlog, waited ${shown.replace(/^≈/, "")}`;
      if (Number.isFinite(wait)) {
        for (const b of [backlog, subBacklog]) {
          b.n++;
          b.oldest = Math.max(b.oldest, wait);
        }
        backlogEl.hidden = false;
        backlogEl.textContent = backlogText(subBacklog);
        showBacklog();
      }
    } else {
      latencyText = "redelivery";
    }
    count++;
    countEl.textContent = String(count);
    const row = document.createElement("tr");
    const delivery = String((m.retryCount ?? 0) + 1);
    row.dataset.delivery = delivery;
    row.dataset.offset = String(m.offset ?? "");
    rowOf.set(m, row);
    row.dataset.kind = kind;
    const cells = [["partition", m.partition], ["offset", m.offset ?? "–"], ["delivery", delivery],
      [kind === "live" ? "push → here" : "", latencyText, `latency ${kind}`]];
    for (const [label, text, className] of cells) {
      const td = document.createElement("td");
      td.textContent = text;
      if (label) td.dataset.label = label; // shown before the value on a phone
      if (className) td.className = className;
      row.appendChild(td);
    }
    const lat = row.lastElementChild;
    if (kind === "redelivery") lat.title = "delivered again (after a nack or an expired lease): not a push → receipt latency";
    else if (kind === "backlog") lat.title = "pushed before this subscription started: it waited in the queue, not in delivery";
    else if (sent === undefined) lat.title = Number.isFinite(err) ? `estimated against the server's clock, ±${fmtMS(err)}` : "estimated against the server's clock";
    const data = document.createElement("td");
    data.className = "data";
    data.textContent = JSON.stringify(m.data);
    row.appendChild(data);
    // The status cell: the Ack / Nack buttons while a manual row waits,
    // then what the server said.
    const status = document.createElement("td");
    status.className = "status";
    row.appendChild(status);
    if (opts.ack === "server") {
      mark(row, "acked", "acked by the server");
    } else if (opts.ack === "auto") {
      row.classList.add("pending");
      row.dataset.attempt = "ack";
      status.textContent = "acking…";
    } else {
      row.classList.add("pending");
      const key = ++rowSerial;
      unsettled.set(key, { m, row });
      for (const [label, ok] of [["Ack", true], ["Nack", false]]) {
        const b = document.createElement("button");
        b.type = "button";
        b.textContent = label;
        b.className = ok ? "ack" : "nack";
        b.setAttribute("aria-label", `${label} message ${m.partition}/${m.offset ?? m.transactionId}`);
        b.onclick = () => settle(key, ok);
        status.appendChild(b);
      }
      ackAll.hidden = false;
    }
    tbody.prepend(row);
    while (tbody.rows.length > MAX_ROWS) tbody.deleteRow(-1);
  };

  // One delivery may carry up to maxInFlight messages (capped at 1,000):
  // a partition is leased to one consumer of a group at a time, so with
  // manual acks a smaller batch would show only that many until acked.
  const common = {
    queue: opts.queue, partition: opts.partition || undefined, consumerGroup: opts.consumerGroup || undefined,
    maxInFlight: opts.maxInFlight, batch: Math.min(opts.maxInFlight, 1000), ack: opts.ack, onMessage,
    onAck, onError, onState: setState,
  };
  const handle = opts.transport === "ws" ? herald.subscribe(common) : herald.eventSource(common);
  if (opts.transport === "ws") setState(herald.state);

  ackAll.onclick = () => {
    for (const key of [...unsettled.keys()]) settle(key, true);
  };
  card.querySelector(".close").onclick = () => {
    handle.close();
    followed.delete(card.id);
    card.remove();
    refresh();
    $("no-subs").hidden = $("subs").children.length > 0;
  };
  $("subs").prepend(card);
  $("no-subs").hidden = true;
  followed.set(card.id, opts.queue);
  refresh();
}

$("sub-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  addSubscription({
    queue: $("queue").value.trim(),
    partition: $("partition").value.trim(),
    consumerGroup: $("group").value.trim(),
    transport: $("transport").value,
    ack: $("ackmode").value,
    maxInFlight: Number($("maxinflight").value) || 100,
  });
});

$("push-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const out = $("push-status");
  const queue = $("queue").value.trim();
  const template = $("payload").value;
  const count = Math.max(1, Number($("count").value) || 1);
  const rate = Math.max(0, Number($("rate").value) || 0);
  const partition = $("push-partition").value.trim() || undefined;
  const payloads = [];
  try {
    for (let i = 1; i <= count; i++) payloads.push(JSON.parse(template.replaceAll("{{n}}", String(i))));
  } catch (e) {
    out.textContent = `payload is not JSON: ${e.message}`;
    return;
  }
  $("push").disabled = true;
  let sent = 0;
  // Each item gets its transactionId here, so that its send time is known
  // before the server can deliver it.
  const items = payloads.map((payload) => {
    const it = { queue, payload, transactionId: randomID() };
    if (partition) it.partition = partition;
    return it;
  });
  const send = async (batch) => {
    const t = performance.now();
    for (const it of batch) sentAt.set(it.transactionId, t);
    await herald.pushItems(batch);
    refresh();
  };
  try {
    if (rate === 0) {
      for (let i = 0; i < items.length; i += 500) {
        await send(items.slice(i, i + 500));
        sent = Math.min(items.length, i + 500);
        out.textContent = `pushed ${sent} of ${count}`;
      }
    } else {
      const start = performance.now();
      for (let i = 0; i < items.length; i++) {
        const due = start + (i * 1000) / rate;
        const wait = due - performance.now();
        if (wait > 0) await new Promise((r) => setTimeout(r, wait));
        await send([items[i]]);
        sent = i + 1;
        out.textContent = `pushed ${sent} of ${count}`;
      }
    }
    out.textContent = `pushed ${plural(sent, "message")} to ${queue}`;
    out.dataset.pushed = String(sent);
  } catch (e) {
    out.textContent = `push failed after ${sent}: ${e.message}`;
  } finally {
    $("push").disabled = false;
    // Forget send times after a minute: what was not delivered by then is
    // measured against the clock estimate.
    setTimeout(() => items.forEach((it) => sentAt.delete(it.transactionId)), 60000);
  }
});

// The live feed: herald.follow() over the follow route (SSE). Every
// follower sees every message; the feed keeps its last event id and
// resumes after it when the stream comes back (the browser's reconnect,
// or a new stream herald.js opens).
let feed = null; // the follow handle
let feedQueue = "";
let feedCount = 0;
let feedResumes = 0;
const feedSeen = new Set(); // event ids shown: a duplicate would be counted apart
let feedDuplicates = 0;

function shortID(id) {
  return id.length > 14 ? `…${id.slice(-12)}` : id;
}

function feedRow(cells, className = "") {
  const tbody = $("feed").tBodies[0];
  const tr = document.createElement("tr");
  if (className) tr.className = className;
  for (const [text, cls, title] of cells) {
    const td = el("td", cls ?? "", text);
    if (title) td.title = title;
    tr.append(td);
  }
  tbody.prepend(tr);
  while (tbody.rows.length > MAX_ROWS) tbody.lastElementChild.remove();
  return tr;
}

function startFeed() {
  stopFeed();
  const queue = $("feed-queue").value.trim();
  if (!queue) return;
  const partition = $("feed-partition").value.trim();
  feedQueue = queue;
  feedCount = feedResumes = feedDuplicates = 0;
  feedSeen.clear();
  $("feed").tBodies[0].innerHTML = "";
  $("feed-count").textContent = "0";
  $("feed-resumed").hidden = true;
  const card = $("feed-card");
  card.dataset.queue = queue;
  card.dataset.resumes = "0";
  card.dataset.duplicates = "0";
  $("unfollow").disabled = false;
  const where = partition ? `${queue}/${partition}` : queue;
  feed = herald.follow(queue, {
    partition, from: $("feed-from").value,
    onMessage: (m) => {
      if (feedSeen.has(m.eventId)) {
        card.dataset.duplicates = String(++feedDuplicates);
      }
      feedSeen.add(m.eventId);
      feedCount++;
      $("feed-count").textContent = feedCount.toLocaleString("en");
      const tr = feedRow([[m.partition], [String(m.offset)], [shortID(m.eventId), "eid", m.eventId],
        [JSON.stringify(m.data), "fdata"]]);
      tr.dataset.eventId = m.eventId;
      card.dataset.lastEventId = m.eventId;
    },
    onGap: (g) => {
      feedRow([["—"], ["—"], [shortID(g.goneThrough), "eid", g.goneThrough],
        ["messages up to here were deleted by retention before this page read them"]], "gap");
    },
    onError: (e) => {
      $("feed-state").textContent = `Stopped: ${e.message}`;
    },
    onState: (st) => {
      card.dataset.state = st.state;
      const text = {
        connecting: `Connecting to ${where}…`,
        connected: `Following ${where}.`,
        reconnecting: `Connection lost: reconnecting${st.attempt ? ` (attempt ${st.attempt})` : ""}…`,
        closed: st.reason ? `Stopped: ${st.reason}` : "Not following.",
      }[st.state] ?? st.state;
      $("feed-state").textContent = text;
      if (st.state === "connected") setTimeout(refresh, 300); // the follower count, once it has joined
      if (st.state === "connected" && st.resumedAfter) {
        card.dataset.resumes = String(++feedResumes);
        card.dataset.resumedAfter = st.resumedAfter;
        const r = $("feed-resumed");
        r.hidden = false;
        r.textContent = `Resumed after event ${shortID(st.resumedAfter)} at ${new Date().toLocaleTimeString()}: ` +
          "the messages pushed while disconnected follow, none lost, none twice.";
        r.title = st.resumedAfter;
      }
    },
  });
  refresh();
}

function stopFeed() {
  feed?.close();
  feed = null;
  $("unfollow").disabled = true;
}

function renderFollowers(st) {
  const out = $("feed-followers");
  if (!feedQueue) {
    out.textContent = "";
    return;
  }
  const n = st.followers?.[feedQueue] ?? 0;
  const all = st.clusterFollowers?.[feedQueue] ?? n;
  out.textContent = all === n
    ? `${plural(n, "follower")} of ${feedQueue} on this instance`
    : `${plural(all, "follower")} of ${feedQueue}, ${n} on this instance`;
  $("feed-card").dataset.followers = String(n);
}

$("feed-form").addEventListener("submit", (e) => {
  e.preventDefault();
  startFeed();
});
$("unfollow").addEventListener("click", stopFeed);

// syncClock estimates the server's clock against this browser's from a
// status request that reads nothing (no queue): the server stamps its time
// mid-way, so the error is at most half the round trip; the fastest of the
// samples so far wins.
async function syncClock() {
  if (liveForbidden) return;
  const t0 = performance.now();
  try {
    const res = await fetch("/internal/api/status", { headers: authHeaders() });
    if (!res.ok) return;
    const st = await res.json();
    const t1 = performance.now();
    if (t1 - t0 <= bestRTT) {
      bestRTT = t1 - t0;
      clockOffset = st.time - (performance.timeOrigin + (t0 + t1) / 2);
    }
  } catch {
    // the status refresh reports the server unreachable
  }
}

function authHeaders() {
  return token ? { Authorization: `Bearer ${token}` } : {};
}

// The queues the live panel shows: those subscribed to, or the form's
// queue while there is no subscription (at most MAX_FOLLOWED, one status
// request each per second).
const MAX_FOLLOWED = 8;
function followedQueues() {
  const qs = [...new Set(followed.values())].sort();
  if (qs.length === 0) qs.push($("queue").value.trim());
  return qs.filter(Boolean).slice(0, MAX_FOLLOWED);
}

async function fetchStatus(queue) {
  const url = queue ? `/internal/api/status?queue=${encodeURIComponent(queue)}` : "/internal/api/status";
  const res = await fetch(url, { headers: authHeaders() });
  if (!res.ok) throw Object.assign(new Error(`HTTP ${res.status}`), { status: res.status });
  return res.json();
}

// liveForbidden: the token may not read /internal/api/status (it names
// every queue and instance: admin only). Subscribing and pushing still
// work; the live view says why it is empty and stops asking.
let liveForbidden = false;

let refreshing = false;
async function refresh() {
  if (refreshing || liveForbidden) return; // a slow server: no pile-up of requests
  refreshing = true;
  try {
    await refreshNow();
  } finally {
    refreshing = false;
  }
}

async function refreshNow() {
  const queues = followedQueues();
  let all;
  try {
    all = await Promise.all(queues.length ? queues.map(fetchStatus) : [fetchStatus("")]);
  } catch (e) {
    if (e.status === 403) {
      liveForbidden = true;
      $("instance").textContent = "not shown";
      $("version").textContent = "· the live view needs an admin token; this one may still subscribe and push as its rights allow";
      for (const id of ["peers", "queue-status", "wakeups"]) $(id).textContent = "needs an admin token";
      $("feed-followers").textContent = "";
      return;
    }
    if (e.status === 401) {
      // Auth is on and this page has no token Herald takes: say so, and how
      // to get one, once (the panels say only that they need it).
      $("instance").textContent = "needs a token";
      $("version").textContent = token
        ? "· auth is on and Herald refused this page's token (expired, or not signed with its secret)"
        : "· auth is on: open this page as /?access_token=<token>, with a token from "
          + "herald token --sub ops --role admin, run where Herald runs (its --auth-secret set)";
      for (const id of ["peers", "queue-status", "wakeups"]) $(id).textContent = "needs a token";
      $("feed-followers").textContent = "";
      return;
    }
    $("instance").textContent = `unreachable (${e.message})`;
    $("peers").innerHTML = "";
    return;
  }
  const st = all[0];
  $("instance").textContent = st.instance;
  $("version").textContent = `· version ${st.version} · ${plural(st.streams, "stream")} open · ${plural(st.intentions, "consumer")} waiting`;
  $("version").title = "streams: WebSocket and EventSource connections; consumers waiting: subscriptions and long-polls waiting for messages";
  renderPeers(st);
  renderFollowers(st);
  renderQueues(all.map((s) => s.queue).filter(Boolean));
  const wk = $("wakeups");
  wk.innerHTML = "";
  const sources = Object.entries(st.wakeups ?? {}).sort();
  if (sources.length === 0) wk.innerHTML = "<dt>none yet</dt><dd></dd>";
  for (const [source, n] of sources) {
    // Plain words first, the metric's label (herald_wakeups_total{source}) after.
    const dt = el("dt", "", WAKEUPS[source] ?? source);
    dt.title = `herald_wakeups_total{source="${source}"}`;
    if (WAKEUPS[source]) dt.append(" ", el("span", "src", `(${source})`));
    wk.append(dt, el("dd", "", Number(n).toLocaleString("en")));
  }
}

// What each wake-up source means (poller, pgnotify and syncnet name them).
const WAKEUPS = {
  push: "a push to this instance",
  notify: "a notification from PostgreSQL",
  logical: "PostgreSQL's change stream",
  syncnet: "a message from another instance",
  register: "a new subscriber",
  ack: "an ack that gave messages back",
  release: "a consumer that left",
};

function renderPeers(st) {
  const ul = $("peers");
  ul.innerHTML = "";
  const li = (html) => {
    const el = document.createElement("li");
    el.innerHTML = html;
    ul.appendChild(el);
    return el;
  };
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
  const sync = st.shared?.syncnet;
  if (!sync) {
    li(`<span class="dot alive"></span>${esc(st.instance)} (this instance; syncnet off: one instance)`);
    return;
  }
  const local = Object.keys(sync.localConsumers ?? {});
  li(`<span class="dot alive"></span><strong>${esc(sync.serverId)}</strong> (this) · consumers: ${local.length ? esc(local.join(", ")) : "none"}`);
  for (const p of sync.peers ?? []) {
    const queues = p.queuesWithSubscribers?.length ? esc(p.queuesWithSubscribers.join(", ")) : "none";
    const what = !p.alive ? "dead" : p.presenceKnown ? `consumers: ${queues}` : "presence not known yet";
    li(`<span class="dot ${p.alive ? "alive" : "dead"}"></span>${esc(p.id || p.name)} · ${what}`);
  }
}

function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

// renderQueues shows each followed queue: its partitions, what was pushed,
// and each group's lag and leased partitions.
function renderQueues(list) {
  const box = $("queue-status");
  box.classList.toggle("muted", list.length === 0);
  $("status-queue").textContent = followed.size ? "(subscribed)" : "";
  box.replaceChildren();
  if (list.length === 0) box.textContent = "…";
  for (const q of list) {
    const sec = el("section", "queue-box");
    sec.dataset.queue = q.queue;
    sec.append(el("h4", "", q.queue));
    if (!q.exists) {
      sec.append(el("p", "muted", "not created yet (a push or a subscription creates it)"));
      box.append(sec);
      continue;
    }
    const dl = el("dl");
    dl.append(el("dt", "", "partitions"), el("dd", "", String(q.partitions)),
      el("dt", "", "pushed"), el("dd", "", String(q.pushed)));
    for (const g of q.groups) {
      dl.append(el("dt", "", g.group === "__QUEUE_MODE__" ? "queue mode" : g.group),
        el("dd", "lag", `lag ${g.lag} · ${g.leased} leased`));
    }
    sec.append(dl);
    box.append(sec);
  }
}

function backlogText(b) {
  return `drained ${plural(b.n, "older message")} (backlog: pushed before the subscription started), oldest waited ${fmtMS(b.oldest)}`;
}

// showBacklog says under the chart what was drained as a backlog: never
// points on it.
function showBacklog() {
  const p = $("backlog");
  p.hidden = backlog.n === 0;
  p.textContent = backlog.n ? `Not in the chart: ${backlogText(backlog)}.` : "";
  p.dataset.count = String(backlog.n);
  p.dataset.oldest = String(backlog.oldest);
}

function tick() {
  const lat = thisSecond.sort((a, b) => a - b);
  thisSecond = [];
  let entry = null;
  if (lat.length) {
    // Every latency of the second, or an even spread of SAMPLE of them.
    const step = Math.max(1, lat.length / SAMPLE);
    const sample = [];
    for (let k = 0; k < lat.length; k += step) sample.push(lat[Math.floor(k)]);
    entry = { n: lat.length, p50: lat[Math.floor((lat.length - 1) / 2)], max: lat[lat.length - 1], sample };
  }
  history.push(entry);
  while (history.length > 60) history.shift();
  const last = history.at(-1);
  $("chart-now").textContent = last
    ? `Last second: ${plural(last.n, "message")}, median ${fmtMS(last.p50)}, slowest ${fmtMS(last.max)}.` : "";
  draw();
}

// quantile of weighted values [[v, w]], sorted by v.
function quantile(vals, total, q) {
  let acc = 0;
  for (const [v, w] of vals) {
    acc += w;
    if (acc >= q * total - 1e-9) return v;
  }
  return vals.at(-1)[0];
}

// niceCeil rounds up to a round number: 1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8
// times a power of ten.
function niceCeil(v) {
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10]) if (m * p >= v - 1e-9) return m * p;
  return 10 * p;
}

// chartTop is the y-scale: the p99 of the minute's latencies, but at most
// four times their median (or their p90 if higher), so that one slow
// message among few does not flatten the rest: what lies above is marked.
function chartTop(points) {
  const vals = [];
  let total = 0;
  for (const p of points) {
    const w = p.n / p.sample.length;
    for (const v of p.sample) vals.push([v, w]);
    total += p.n;
  }
  if (vals.length === 0) return 1;
  vals.sort((a, b) => a[0] - b[0]);
  const q = (f) => quantile(vals, total, f);
  const robust = Math.min(q(0.99), Math.max(4 * q(0.5), q(0.9)));
  return niceCeil(Math.max(0.5, robust * 1.1));
}

function draw() {
  const c = $("chart");
  const ctx = c.getContext("2d");
  const css = getComputedStyle(document.documentElement);
  // Draw in CSS pixels on a backing store of the element's size.
  const dpr = window.devicePixelRatio || 1;
  const w = Math.max(200, c.clientWidth), h = Math.max(120, c.clientHeight);
  if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) {
    c.width = Math.round(w * dpr);
    c.height = Math.round(h * dpr);
  }
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  // The plot area leaves room for the axis labels and for a whole dot
  // at every edge.
  const R = 3.5;
  const x0 = 48, x1 = w - 12, y0 = 12, y1 = h - 24;
  const points = history.filter(Boolean);
  const top = chartTop(points);
  const x = (i) => x0 + ((x1 - x0) * i) / 59;
  const y = (v) => y1 - ((y1 - y0) * Math.min(v, top)) / top;

  ctx.font = "11px system-ui, sans-serif";
  ctx.lineWidth = 1;
  ctx.textBaseline = "middle";
  for (const v of [0, top / 2, top]) {
    ctx.strokeStyle = css.getPropertyValue("--line");
    ctx.beginPath();
    ctx.moveTo(x0, Math.round(y(v)) + 0.5);
    ctx.lineTo(x1, Math.round(y(v)) + 0.5);
    ctx.stroke();
    ctx.fillStyle = css.getPropertyValue("--muted");
    ctx.textAlign = "right";
    ctx.fillText(v === 0 ? "0" : fmtMS(v), x0 - 6, y(v));
  }
  ctx.textBaseline = "alphabetic";
  ctx.textAlign = "left";
  ctx.fillText("60 s ago", x0, h - 6);
  ctx.textAlign = "right";
  ctx.fillText("now", x1, h - 6);
  ctx.textAlign = "left";

  if (points.length === 0) {
    ctx.fillStyle = css.getPropertyValue("--muted");
    ctx.textAlign = "center";
    ctx.fillText("Each second in which messages pushed after subscribing arrive gets a point here.", (x0 + x1) / 2, (y0 + y1) / 2);
    ctx.textAlign = "left";
  }
  const drawn = [];
  let above = 0, highest = 0;
  for (const [key, color] of [["max", "--warn"], ["p50", "--accent"]]) {
    ctx.strokeStyle = css.getPropertyValue(color);
    ctx.lineWidth = 2;
    ctx.beginPath();
    let pen = false;
    history.forEach((p, i) => {
      const xi = x(i + 60 - history.length);
      if (!p) {
        pen = false;
        return;
      }
      if (pen) ctx.lineTo(xi, y(p[key]));
      else ctx.moveTo(xi, y(p[key]));
      pen = true;
    });
    ctx.stroke();
    history.forEach((p, i) => {
      if (!p) return;
      const xi = x(i + 60 - history.length), yi = y(p[key]);
      ctx.beginPath();
      if (p[key] > top) {
        // Off the scale: a triangle at the top edge.
        if (key === "max") above++;
        highest = Math.max(highest, p[key]);
        ctx.fillStyle = css.getPropertyValue("--bad");
        ctx.moveTo(xi, yi - R);
        ctx.lineTo(xi + R + 1, yi + R);
        ctx.lineTo(xi - R - 1, yi + R);
        ctx.closePath();
      } else {
        ctx.fillStyle = ctx.strokeStyle;
        ctx.arc(xi, yi, R, 0, 2 * Math.PI);
      }
      ctx.fill();
      drawn.push({ key, x: xi, y: yi, r: R, v: p[key] });
    });
  }
  // The newest second's median, written beside its dot: one message alone
  // on the chart still says what it measured.
  const li = history.findLastIndex(Boolean);
  if (li >= 0) {
    const p = history[li];
    const xi = x(li + 60 - history.length), yi = y(p.p50);
    ctx.fillStyle = css.getPropertyValue("--fg");
    ctx.font = "600 11px system-ui, sans-serif";
    const label = `median ${fmtMS(p.p50)}`;
    const left = xi - R - 5 - ctx.measureText(label).width >= x0; // else on its right
    ctx.textAlign = left ? "right" : "left";
    ctx.textBaseline = "middle";
    ctx.fillText(label, left ? xi - R - 5 : xi + R + 5, Math.min(y1 - 8, Math.max(y0 + 8, yi - 10)));
    ctx.textAlign = "left";
    ctx.textBaseline = "alphabetic";
  }
  // For tests and tools: what was drawn where, in CSS pixels.
  c.dataset.points = String(points.length);
  c.dataset.samples = String(points.reduce((n, p) => n + p.n, 0));
  c.dataset.top = String(top);
  c.dataset.above = String(above);
  c.dataset.plot = JSON.stringify({ x0, y0, x1, y1, w, h });
  c.dataset.drawn = JSON.stringify(drawn);
  c.setAttribute("aria-label", points.length
    ? `Latency chart, last 60 seconds: scale 0 to ${fmtMS(top)}; latest second ${plural(points.at(-1).n, "message")}, median ${fmtMS(points.at(-1).p50)}`
    : "Latency chart, last 60 seconds: no message pushed after subscribing yet");
  $("chart-above").textContent = above
    ? `▲ off the scale: ${plural(above, "second")} peaked above ${fmtMS(top)} (highest ${fmtMS(highest)})` : "";
  $("chart-above").className = above ? "above" : "";
}

// A few clock samples at start, then one every 10 s (a server restart or a
// new network path may change the best estimate only for the better).
for (let i = 0; i < 5; i++) setTimeout(syncClock, i * 200);
setInterval(syncClock, 10000);
refresh();
setInterval(refresh, 1000);
setInterval(tick, 1000);
addEventListener("resize", draw);
draw();

// For the browser test (cmd/herald): the formatting, the chart's scale for
// a list of latencies, and a way to feed the chart latencies as deliveries
// do (a slow outlier cannot be had on demand from a real server).
window.heraldDemo = {
  fmtMS, plural,
  feed: () => feed,
  chartTop: (lat) => chartTop([{ n: lat.length, sample: [...lat].sort((a, b) => a - b) }]),
  addLatency: (ms) => thisSecond.push(ms),
};
