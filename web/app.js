// The demo page: subscriptions over WebSocket or EventSource, a push form,
// and a live panel fed by /internal/api/status every second. It uses the
// browser SDK exactly as user code would.
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
  const unsettled = new Map(); // transactionId → {m, row}

  const setState = (s) => {
    stateEl.textContent = stateText(s);
    stateEl.className = `state ${s.state}`;
    card.dataset.state = s.state;
  };

  const settle = async (key, ok) => {
    const u = unsettled.get(key);
    if (!u) return;
    unsettled.delete(key);
    u.row.querySelectorAll("button").forEach((b) => b.remove());
    try {
      if (ok) await handle.ack(u.m);
      else await handle.nack(u.m, "nacked from the demo page");
      u.row.classList.add(ok ? "acked" : "nacked");
    } catch (e) {
      u.row.title = String(e);
    }
    ackAll.hidden = unsettled.size === 0;
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
    const cells = [m.partition, m.offset ?? "–", String((m.retryCount ?? 0) + 1),
      `${exact ? "" : "≈"}${fmtMS(latency)} ms`];
    for (const text of cells) {
      const td = document.createElement("td");
      td.textContent = text;
      row.appendChild(td);
    }
    const data = document.createElement("td");
    data.className = "data";
    data.textContent = JSON.stringify(m.data);
    row.appendChild(data);
    const actions = document.createElement("td");
    row.appendChild(actions);
    if (opts.ack === "manual") {
      const key = `${m.partitionId}/${m.transactionId}`;
      unsettled.set(key, { m, row });
      for (const [label, ok] of [["Ack", true], ["Nack", false]]) {
        const b = document.createElement("button");
        b.type = "button";
        b.textContent = label;
        b.className = ok ? "ack" : "nack";
        b.setAttribute("aria-label", `${label} message ${m.partition}/${m.offset ?? m.transactionId}`);
        b.onclick = () => settle(key, ok);
        actions.appendChild(b);
      }
      ackAll.hidden = false;
    } else {
      row.classList.add("acked");
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
    onState: setState,
  };
  const handle = opts.transport === "ws" ? herald.subscribe(common) : herald.eventSource(common);
  if (opts.transport === "ws") setState(herald.state);

  ackAll.onclick = () => {
    for (const key of [...unsettled.keys()]) settle(key, true);
  };
  card.querySelector(".close").onclick = () => {
    handle.close();
    card.remove();
    $("no-subs").hidden = $("subs").children.length > 0;
  };
  $("subs").prepend(card);
  $("no-subs").hidden = true;
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

async function refresh() {
  const queue = $("queue").value.trim();
  let st;
  try {
    const res = await fetch(`/internal/api/status?queue=${encodeURIComponent(queue)}`, { headers: authHeaders() });
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    st = await res.json();
  } catch (e) {
    $("instance").textContent = `unreachable (${e.message})`;
    $("peers").innerHTML = "";
    return;
  }
  $("instance").textContent = st.instance;
  $("version").textContent = `· version ${st.version} · ${st.intentions} waiting · ${st.streams} streams`;
  renderPeers(st);
  renderQueue(st.queue);
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

function renderQueue(q) {
  const box = $("queue-status");
  $("status-queue").textContent = q ? q.queue : "";
  if (!q || !q.exists) {
    box.textContent = "not created yet (a push or a subscription creates it)";
    return;
  }
  const groups = q.groups.map((g) =>
    `<dt>${g.group === "__QUEUE_MODE__" ? "queue mode" : g.group.replace(/</g, "&lt;")}</dt><dd>lag ${g.lag} · ${g.leased} leased</dd>`).join("");
  box.innerHTML = `<dl><dt>partitions</dt><dd>${q.partitions}</dd><dt>pushed</dt><dd>${q.pushed}</dd>${groups}</dl>`;
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
