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

// Latencies received in the current second, and the chart's history.
let thisSecond = [];
const history = []; // {p50, max} per second, the last 60

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

function fmtMS(ms) {
  if (ms == null || !Number.isFinite(ms)) return "–";
  return ms < 10 ? ms.toFixed(1) : Math.round(ms).toString();
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
  // Rows waiting for a button, per delivery: a message delivered again
  // (a nack, an expired lease) gets a row and a lease of its own.
  const unsettled = new Map(); // row serial → {m, row}
  const rowOf = new WeakMap(); // message → its row

  const setState = (s) => {
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
      stateEl.title = e.message; // a subscribe that failed: not a row's
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
    // Exact for what this page pushed; otherwise the server's createdAt
    // against its clock as estimated (≈, within half a round trip).
    let latency, exact = false;
    const sent = sentAt.get(m.transactionId);
    if (sent !== undefined) {
      latency = performance.now() - sent;
      exact = true;
    } else {
      latency = Math.max(0, performance.timeOrigin + performance.now() + clockOffset - parseTime(m.createdAt));
    }
    if (Number.isFinite(latency)) thisSecond.push(latency);
    count++;
    countEl.textContent = String(count);
    const row = document.createElement("tr");
    const delivery = String((m.retryCount ?? 0) + 1);
    row.dataset.delivery = delivery;
    row.dataset.offset = String(m.offset ?? "");
    rowOf.set(m, row);
    const cells = [m.partition, m.offset ?? "–", delivery, `${exact ? "" : "≈"}${fmtMS(latency)} ms`];
    for (const text of cells) {
      const td = document.createElement("td");
      td.textContent = text;
      row.appendChild(td);
    }
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
    out.textContent = `pushed ${sent} to ${queue}`;
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

// syncClock estimates the server's clock against this browser's from a
// status request that reads nothing (no queue): the server stamps its time
// mid-way, so the error is at most half the round trip; the fastest of the
// samples so far wins.
async function syncClock() {
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
  if (!res.ok) throw new Error(`HTTP ${res.status}`);
  return res.json();
}

let refreshing = false;
async function refresh() {
  if (refreshing) return; // a slow server: no pile-up of requests
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
    $("instance").textContent = `unreachable (${e.message})`;
    $("peers").innerHTML = "";
    return;
  }
  const st = all[0];
  $("instance").textContent = st.instance;
  $("version").textContent = `· version ${st.version} · ${st.intentions} waiting · ${st.streams} streams`;
  renderPeers(st);
  renderQueues(all.map((s) => s.queue).filter(Boolean));
  const wk = $("wakeups");
  wk.innerHTML = "";
  const sources = Object.entries(st.wakeups ?? {}).sort();
  if (sources.length === 0) wk.innerHTML = "<dt>none yet</dt><dd></dd>";
  for (const [source, n] of sources) {
    const dt = document.createElement("dt");
    dt.textContent = source;
    const dd = document.createElement("dd");
    dd.textContent = String(n);
    wk.append(dt, dd);
  }
}

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

function tick() {
  const lat = thisSecond.sort((a, b) => a - b);
  thisSecond = [];
  history.push(lat.length ? { p50: lat[Math.floor(lat.length / 2)], max: lat[lat.length - 1], n: lat.length } : null);
  while (history.length > 60) history.shift();
  const last = history.at(-1);
  $("chart-now").textContent = last ? `· last second: ${last.n} msgs, median ${fmtMS(last.p50)} ms, max ${fmtMS(last.max)} ms` : "";
  draw();
}

function draw() {
  const c = $("chart");
  const ctx = c.getContext("2d");
  const css = getComputedStyle(document.documentElement);
  const w = c.width, h = c.height, pad = 24;
  ctx.clearRect(0, 0, w, h);
  const points = history.filter(Boolean);
  c.dataset.points = String(points.length);
  const top = Math.max(10, ...points.map((p) => p.max));
  ctx.fillStyle = css.getPropertyValue("--muted");
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillText(`${fmtMS(top)}`, 2, 11);
  ctx.fillText("0", 2, h - 4);
  ctx.strokeStyle = css.getPropertyValue("--line");
  ctx.beginPath();
  ctx.moveTo(pad, h - pad / 2);
  ctx.lineTo(w, h - pad / 2);
  ctx.stroke();
  const x = (i) => pad + ((w - pad) * i) / 59;
  const y = (v) => h - pad / 2 - ((h - pad) * v) / top;
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
    ctx.fillStyle = ctx.strokeStyle;
    history.forEach((p, i) => {
      if (!p) return;
      ctx.beginPath();
      ctx.arc(x(i + 60 - history.length), y(p[key]), 2.5, 0, 2 * Math.PI);
      ctx.fill();
    });
  }
}

// A few clock samples at start, then one every 10 s (a server restart or a
// new network path may change the best estimate only for the better).
for (let i = 0; i < 5; i++) setTimeout(syncClock, i * 200);
setInterval(syncClock, 10000);
refresh();
setInterval(refresh, 1000);
setInterval(tick, 1000);
draw();
