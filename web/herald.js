// herald.js: the browser SDK for Herald (an ES module, no dependencies).
//
//   import { Herald } from "/herald.js";
//   const h = new Herald();                      // this page's server; or new Herald("https://host:6632")
//   const sub = h.subscribe({ queue: "orders", consumerGroup: "packing",     // a share of the orders
//     onMessage: async (m) => { render(m.data); },   // resolve: ack; throw: nack (retried, then DLQ)
//     onAck: (m, status) => mark(m, status),          // the server took the ack ("completed") or nack ("failed")
//     onError: (e) => warn(e.message, e.herald?.message), // a refused ack, a failed subscribe
//     onState: (s) => console.log(s.state, s.attempt, s.delay) });
//   const feed = h.follow("scores", { onMessage: (m) => show(m.data) });   // every message, to every page
//   await h.push("orders", { id: 1 });
//   sub.close(); feed.close();
//
// subscribe() runs over one WebSocket per Herald (subprotocol herald.v1),
// reconnects with exponential back-off and full jitter (100 ms → 10 s),
// subscribes again, and acks or nacks what onMessage settles. With
// ack: "manual" the handler settles each message itself with sub.ack(m) or
// sub.nack(m, error). eventSource() is the same over a browser
// EventSource (it reconnects and resumes by itself) with acks posted over
// HTTP.
//
// follow(queue, {from, onMessage, onGap}) is for "everyone sees everything"
// (a live feed, scores, a dashboard): no consumer group, no ack; each
// message's eventId is the follower's position, and a reconnect resumes
// after the last one. A subscription instead shares the queue's messages
// among the members of its consumer group (N browsers in one group split
// the feed): use it for work, not for broadcast.
//
// Every ack names its delivery (leaseId, the subscription's sub and
// consumerGroup), so any number of subscriptions, in any groups, share one
// socket. An ack the server refuses (success: false, e.g. "Invalid or
// expired lease") rejects the promise of ack() / nack() with an Error whose
// message is the server's reason and whose e.herald is {message, result},
// and reaches the subscription's onError, in every ack mode.
// An ack the server could not take because its database was away (503,
// an "unavailable" error frame) is sent again for up to 30 s before it
// counts as failed.

const BACKOFF_MIN = 100;
const BACKOFF_MAX = 10000;

// Close codes after which reconnecting cannot help (docs/clients.md: close codes).
const TERMINAL = new Set([1009, 4500, 4501, 4503]);

/** Full-jitter exponential back-off: a random delay up to min(max, min·2^attempt). */
export function backoff(attempt, min = BACKOFF_MIN, max = BACKOFF_MAX) {
  const cap = Math.min(max, min * 2 ** Math.min(attempt, 30));
  return Math.round(Math.random() * cap);
}

// lost is the Error of a frame that never got an answer: the socket was
// down or closed before it. Acks then go over HTTP.
function lost(text) {
  return Object.assign(new Error(text), { transport: true });
}

// An ack the server could not take because its database is away (HTTP 503,
// an error frame with code "unavailable") or that never reached it over
// HTTP is sent again: after the server's Retry-After, else 100 ms doubling
// to 2 s, for up to 30 s. A repeat is safe: an ack of a message already
// done answers success and changes nothing.
const ACK_RETRY_FOR = 30000;
const ACK_RETRY_MAX = 2000;

function unavailable(text, retryAfter) {
  return Object.assign(new Error(text), { unavailable: true, retryAfter });
}

async function retryUnavailable(send) {
  const until = Date.now() + ACK_RETRY_FOR;
  for (let attempt = 0; ; attempt++) {
    try {
      return await send();
    } catch (e) {
      const left = until - Date.now();
      if (!e.unavailable || left <= 0) throw e;
      const wait = e.retryAfter > 0 ? e.retryAfter * 1000 : Math.min(ACK_RETRY_MAX, 100 * 2 ** attempt);
      await new Promise((r) => setTimeout(r, Math.min(wait, left)));
    }
  }
}

/** tokenExpiry(jwt) → its exp in ms since the epoch, or 0 (read, not verified: the server verifies). */
function tokenExpiry(tok) {
  try {
    const b = tok.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    const exp = JSON.parse(atob(b + "===".slice((b.length + 3) % 4))).exp;
    return typeof exp === "number" ? exp * 1000 : 0;
  } catch {
    return 0;
  }
}

/** refreshIn(jwt) → ms until a token function should be asked again (80% of the token's life left), or -1: no exp. */
function refreshIn(tok) {
  const exp = tokenExpiry(tok);
  return exp ? Math.max(0, (exp - Date.now()) * 0.8) : -1;
}

/**
 * renewBefore(herald, tok, current, reopen) → a timer, or null without a token function or an exp: before tok
 * expires, unless current() says the stream was replaced or closed, asks the token function for a fresh token
 * and calls reopen(fresh). A token function that fails leaves the stream to end at exp.
 */
function renewBefore(herald, tok, current, reopen) {
  const wait = typeof herald.token === "function" ? refreshIn(tok) : -1;
  if (wait < 0) return null;
  return setTimeout(async () => {
    if (!current()) return;
    let fresh;
    try {
      fresh = await herald._token();
    } catch {
      return;
    }
    reopen(fresh);
  }, wait);
}

/**
 * reopenBefore(herald, tok, es, current, open, timer) → the timer to keep: renewBefore for an EventSource
 * stream, whose reopen closes es and calls open(fresh); the renewal's timer replaces timer (cleared) when
 * there is one.
 */
function reopenBefore(herald, tok, es, current, open, timer) {
  const renew = renewBefore(herald, tok, current, (fresh) => {
    es.close();
    open(fresh);
  });
  if (!renew) return timer;
  clearTimeout(timer);
  return renew;
}

export class Herald {
  /**
   * @param {string} [base] the server's URL; default: this page's origin
   * @param {{token?: string | (() => string | Promise<string>)}} [opts] a bearer token when auth is on,
   *   or a function giving one: it is called on every connection, HTTP request and EventSource,
   *   and before the live WebSocket's token expires (sent in an auth frame: the socket stays up)
   */
  constructor(base = globalThis.location?.origin ?? "", opts = {}) {
    this.base = base.replace(/\/$/, "");
    this.token = opts.token ?? "";
    this._refresh = null; // timer of the live socket's token refresh
    this._subs = new Map(); // local id → subscription
    this._nextId = 1;
    this._ws = null;
    this._attempt = 0;
    this._timer = null;
    this._pending = new Map(); // frame id → {resolve, reject}
    this._listeners = new Set();
    this.state = { state: "idle", attempt: 0, delay: 0 };
  }

  /** onState(f): f({state, attempt, delay, code, reason}) on every connection change; returns an unsubscribe. */
  onState(f) {
    this._listeners.add(f);
    f(this.state);
    return () => this._listeners.delete(f);
  }

  _setState(s) {
    this.state = s;
    for (const f of this._listeners) f(s);
    for (const sub of this._subs.values()) sub.onState?.(s);
  }

  /** _token() → the bearer token to send now ("" with auth off). */
  async _token() {
    return typeof this.token === "function" ? String((await this.token()) ?? "") : this.token;
  }

  async _headers() {
    // X-Herald-CSRF: with the token in a cookie (--auth-cookie) and none
    // given here, the server honours a change only with this header, which
    // a page of another site cannot send with the user's cookie.
    const h = { "Content-Type": "application/json", "X-Herald-CSRF": "1" };
    const tok = await this._token();
    if (tok) h.Authorization = `Bearer ${tok}`;
    return h;
  }

  /**
   * push(queue, payload | payload[], {partition, transactionId}) → the push results.
   * Each payload is one message.
   */
  push(queue, payloads, opts = {}) {
    const list = Array.isArray(payloads) ? payloads : [payloads];
    return this.pushItems(list.map((payload) => {
      const it = { queue, payload };
      if (opts.partition) it.partition = opts.partition;
      if (opts.transactionId && list.length === 1) it.transactionId = opts.transactionId;
      return it;
    }));
  }

  /** pushItems([{queue, partition?, payload?, transactionId?, traceId?}]) → the push results. */
  async pushItems(items) {
    const res = await fetch(`${this.base}/api/v1/push`, {
      method: "POST", headers: await this._headers(), body: JSON.stringify({ items }),
    });
    const body = await res.json().catch(() => null);
    if (!res.ok) throw new Error(body?.error ?? `push: HTTP ${res.status}`);
    return body;
  }

  /**
   * ack(message, status = "completed", error) over HTTP: for messages from eventSource() or anywhere.
   * Resolves with the server's results; rejects when the server refuses it (see refused).
   */
  async ack(m, status = "completed", error = undefined) {
    const body = { transactionId: m.transactionId, partitionId: m.partitionId, leaseId: m.leaseId,
      consumerGroup: m.consumerGroup, status };
    if (error !== undefined) body.error = String(error);
    const [res, out] = await retryUnavailable(async () => {
      let res;
      try {
        res = await fetch(`${this.base}/api/v1/ack`, {
          method: "POST", headers: await this._headers(), body: JSON.stringify(body),
        });
      } catch (e) {
        throw unavailable(`ack: ${e.message}`); // no answer: the server unreachable
      }
      const out = await res.json().catch(() => null);
      if (res.status === 503) throw unavailable(out?.error ?? "ack: HTTP 503", Number(res.headers.get("Retry-After")));
      return [res, out];
    });
    if (!res.ok) throw new Error(out?.error ?? `ack: HTTP ${res.status}`);
    const result = Array.isArray(out) ? out[0] : out;
    if (result?.success === false) throw refused(m, result);
    return out;
  }

  /**
   * request(method, path, body) → the parsed JSON answer of any API call ("/api/v1/..."), null
   * for an empty one, sent with this Herald's token. Rejects with an Error whose status is the
   * HTTP status (0: no answer, the server unreachable) and body the server's answer.
   */
  async request(method, path, body = undefined) {
    let res;
    try {
      res = await fetch(`${this.base}${path}`, {
        method, headers: await this._headers(), body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (e) {
      throw Object.assign(new Error(`network error: ${e?.message ?? e}`), { status: 0, body: null });
    }
    const text = await res.text();
    let out = null;
    try {
      out = text ? JSON.parse(text) : null;
    } catch {
      out = text;
    }
    if (!res.ok) {
      throw Object.assign(new Error(out?.error ?? `${method} ${path}: HTTP ${res.status}`), { status: res.status, body: out });
    }
    return out;
  }

  /**
   * subscribe({queue, partition, consumerGroup, batch, maxInFlight, ack: "auto"|"manual"|"server",
   *            onMessage(m, sub), onAck(m, status, result), onState(s), onError(e)})
   *   → a subscription {ack(m), nack(m, err), close()}.
   *
   * ack "auto" (default): the SDK acks when onMessage resolves and nacks when it throws.
   * "manual": the handler calls sub.ack / sub.nack. "server": autoAck on the server (at most once).
   * onAck runs when the server took an ack (status "completed") or a nack ("failed"); onError
   * when it refused one (e.message: its reason; e.herald: {message, result}) or an ack was lost.
   */
  subscribe(opts) {
    if (!opts?.queue) throw new Error("subscribe: queue is required");
    const sub = new Subscription(this, this._nextId++, opts);
    this._subs.set(sub.localId, sub);
    this._connect();
    if (this._ws?.readyState === WebSocket.OPEN) sub._send();
    return sub;
  }

  _wsURL(tok) {
    const u = new URL(`${this.base || globalThis.location.origin}/api/v1/ws`);
    u.protocol = u.protocol === "https:" ? "wss:" : "ws:";
    if (tok) u.searchParams.set("access_token", tok);
    return u.toString();
  }

  _connect() {
    if (this._ws || this._timer || this._closed || this._connecting) return;
    this._setState({ state: this._attempt ? "reconnecting" : "connecting", attempt: this._attempt, delay: 0 });
    this._connecting = true;
    this._token().then((tok) => {
      this._connecting = false;
      if (this._closed || this._ws) return;
      this._open(tok);
    }, (e) => {
      this._connecting = false;
      this._retry(0, `token: ${e?.message ?? e}`);
    });
  }

  _open(tok) {
    let ws;
    try {
      ws = new WebSocket(this._wsURL(tok), "herald.v1");
    } catch (e) {
      this._retry(0, String(e));
      return;
    }
    this._ws = ws;
    ws.onopen = () => {
      this._attempt = 0;
      this._setState({ state: "connected", attempt: 0, delay: 0 });
      for (const sub of this._subs.values()) sub._send();
      this._armRefresh(ws, tok);
    };
    ws.onmessage = (ev) => this._frame(ev.data);
    ws.onclose = (ev) => {
      this._ws = null;
      clearTimeout(this._refresh);
      for (const { reject } of this._pending.values()) reject(lost("connection closed"));
      this._pending.clear();
      for (const sub of this._subs.values()) sub.sub = null;
      // An expired token (4501) is not the end when a function gives fresh ones.
      if (TERMINAL.has(ev.code) && !(ev.code === 4501 && typeof this.token === "function")) {
        this._setState({ state: "closed", attempt: this._attempt, delay: 0, code: ev.code, reason: ev.reason });
        return;
      }
      this._retry(ev.code, ev.reason);
    };
  }

  /** _armRefresh sends ws a fresh token (auth frame) at 80% of its token's life, while it is open. */
  _armRefresh(ws, tok) {
    clearTimeout(this._refresh);
    const wait = typeof this.token === "function" ? refreshIn(tok) : -1;
    if (wait < 0) return;
    this._refresh = setTimeout(async () => {
      if (this._ws !== ws) return;
      try {
        const fresh = await this._token();
        await this._send({ type: "auth", token: fresh });
        this._armRefresh(ws, fresh);
      } catch {
        // The server closes the socket at exp (4501); the reconnect asks for a token again.
      }
    }, wait);
  }

  _retry(code, reason) {
    if (this._closed) return; // close() reported "closed"; its socket's close event says nothing more
    if (this._subs.size === 0) {
      this._setState({ state: "idle", attempt: 0, delay: 0 });
      return;
    }
    const delay = backoff(this._attempt);
    this._attempt++;
    this._setState({ state: "reconnecting", attempt: this._attempt, delay, code, reason });
    this._timer = setTimeout(() => {
      this._timer = null;
      this._connect();
    }, delay);
  }

  _send(frame) {
    if (this._ws?.readyState !== WebSocket.OPEN) return Promise.reject(lost("not connected"));
    const id = `c${this._nextId++}`;
    frame.id = id;
    return new Promise((resolve, reject) => {
      this._pending.set(id, { resolve, reject });
      this._ws.send(JSON.stringify(frame));
    });
  }

  _frame(text) {
    let f;
    try {
      f = JSON.parse(text);
    } catch {
      return;
    }
    if (f.type === "deliver") {
      for (const sub of this._subs.values()) {
        if (sub.sub === f.sub) sub._deliver(f.messages ?? []);
      }
      return;
    }
    const p = f.id && this._pending.get(f.id);
    if (!p) {
      if (f.type === "error") {
        const e = Object.assign(new Error(f.message), { code: f.code });
        for (const sub of this._subs.values()) sub.onError?.(e);
      }
      return;
    }
    this._pending.delete(f.id);
    if (f.type === "error") {
      const e = Object.assign(new Error(f.message), { code: f.code });
      p.reject(f.code === "unavailable" ? Object.assign(e, { unavailable: true, retryAfter: f.retryAfter }) : e);
    }
    else p.resolve(f);
  }

  /** close() ends every subscription and the socket. */
  close() {
    this._closed = true;
    clearTimeout(this._timer);
    clearTimeout(this._refresh);
    this._timer = null;
    this._subs.clear();
    this._ws?.close(1000);
    this._ws = null;
    this._setState({ state: "closed", attempt: 0, delay: 0 });
  }

  /**
   * eventSource({queue, partition, consumerGroup, batch, maxInFlight, ack: "auto"|"manual"|"server",
   *              onMessage, onAck, onState, onError}) → {ack(m), nack(m, err), close()}: the same over EventSource,
   * which reconnects by itself and resumes from its last event id; acks go over HTTP.
   */
  eventSource(opts) {
    if (!opts?.queue) throw new Error("eventSource: queue is required");
    const mode = opts.ack ?? "auto";
    let path = `/api/v1/sse/queue/${encodeURIComponent(opts.queue)}`;
    if (opts.partition) path += `/partition/${encodeURIComponent(opts.partition)}`;
    const q = new URLSearchParams();
    if (opts.consumerGroup) q.set("consumerGroup", opts.consumerGroup);
    if (opts.batch) q.set("batch", String(opts.batch));
    if (opts.maxInFlight) q.set("maxInFlight", String(opts.maxInFlight));
    if (mode === "server") q.set("autoAck", "true");
    const herald = this;
    let attempt = 0;
    let closed = false;
    let lastId = ""; // the last event's id: a reopened stream resumes after it
    let timer = null;
    const handle = {
      source: null,
      ack: (m) => reported(opts, m, "completed", herald.ack(m, "completed")),
      nack: (m, err) => reported(opts, m, "failed", herald.ack(m, "failed", errorText(err))),
      close() {
        closed = true;
        clearTimeout(timer);
        this.source?.close();
        opts.onState?.({ state: "closed", attempt: 0, delay: 0 });
      },
    };
    const open = (tok) => {
      if (closed) return;
      const qq = new URLSearchParams(q);
      if (tok) qq.set("access_token", tok);
      if (lastId) qq.set("lastEventId", lastId);
      const es = new EventSource(`${herald.base}${path}?${qq}`);
      handle.source = es;
      es.onopen = () => {
        attempt = 0;
        opts.onState?.({ state: "connected", attempt: 0, delay: 0 });
      };
      es.onerror = () => {
        if (es.readyState === EventSource.CLOSED) {
          if (handle.source === es) opts.onState?.({ state: "closed", attempt, delay: 0 });
          return;
        }
        attempt++;
        opts.onState?.({ state: "reconnecting", attempt, delay: null }); // the browser picks the delay (retry:)
      };
      es.onmessage = async (ev) => {
        if (ev.lastEventId) lastId = ev.lastEventId;
        const m = eventJSON(ev);
        if (m !== undefined) await settle(mode, m, () => opts.onMessage?.(m, handle), handle);
      };
      // With a token function: before this token expires, reopen with a
      // fresh one, resuming after the last event (the server acks what it
      // covers and hands the rest back to this stream first).
      timer = reopenBefore(herald, tok, es, () => !closed && handle.source === es, open, timer);
    };
    opts.onState?.({ state: "connecting", attempt: 0, delay: 0 });
    if (typeof this.token === "function") {
      this._token().then(open, (e) => opts.onState?.({ state: "closed", attempt: 0, delay: 0, reason: `token: ${e?.message ?? e}` }));
    } else {
      open(this.token);
    }
    return handle;
  }

  /**
   * follow(queue, {partition, from, lastEventId, onMessage, onGap, onState, onError}) → {lastEventId, close()}:
   * every message pushed to the queue (or one partition) after `from` ("now", the default; "beginning";
   * an RFC 3339 time; an event id), in order, with no consumer group, lease or ack: every follower sees
   * every message. Over an EventSource on the follow route; it resumes after the last event id it
   * received, whether the browser reconnects (it sends Last-Event-ID) or this SDK opens a new stream
   * (after the server closed it for good, or to refresh the token): none lost, none twice, while the
   * queue's retention keeps them. From "now" it first asks for the start (one long-poll that does not
   * wait), so that a stream cut before the first message resumes after it. onMessage(m) gets each message (m.eventId names its position; an
   * async handler is awaited before the next); onGap({goneThrough, nextEventId}) says retention
   * deleted messages after the position; onState({state, attempt, delay, resumedAfter}).
   */
  follow(queue, opts = {}) {
    if (!queue) throw new Error("follow: queue is required");
    let path = `/api/v1/follow/queue/${encodeURIComponent(queue)}`;
    if (opts.partition) path += `/partition/${encodeURIComponent(opts.partition)}`;
    const herald = this;
    let attempt = 0;
    let closed = false;
    let lastId = opts.lastEventId ?? ""; // the last event's id: a new stream resumes after it
    let opens = 0; // streams opened
    let timer = null;
    let chain = Promise.resolve(); // handlers run one after another, in order
    const run = (f) => {
      chain = chain.then(f).catch((e) => opts.onError?.(e));
    };
    const state = (s) => opts.onState?.(s);
    const handle = {
      source: null,
      get lastEventId() {
        return lastId;
      },
      close() {
        closed = true;
        clearTimeout(timer);
        this.source?.close();
        state({ state: "closed", attempt: 0, delay: 0 });
      },
    };
    // refused: a stream the browser gave up on (not 200): ask the long-poll
    // why; 400, 401, 403 and 404 are the server's last word.
    const refused = async (tok) => {
      const q = new URLSearchParams({ wait: "false", batch: "1" });
      if (lastId) q.set("after", lastId);
      else if (opts.from) q.set("from", opts.from);
      const headers = tok ? { Authorization: `Bearer ${tok}` } : {};
      try {
        const res = await fetch(`${herald.base}${path}?${q}`, { headers });
        if ([400, 401, 403, 404].includes(res.status)) {
          const body = await res.json().catch(() => ({}));
          return Object.assign(new Error(body.error ?? res.statusText), { status: res.status });
        }
      } catch {
        // down: try again later
      }
      return null;
    };
    const open = (tok) => {
      if (closed) return;
      const q = new URLSearchParams();
      if (tok) q.set("access_token", tok);
      if (lastId) q.set("lastEventId", lastId);
      else if (opts.from) q.set("from", opts.from);
      // Resumed: a stream after another, or a first one given lastEventId
      // (not the start asked for from "now").
      const resumedFrom = opens++ > 0 || opts.lastEventId ? lastId : "";
      const es = new EventSource(`${herald.base}${path}?${q}`);
      handle.source = es;
      let reopened = false; // the browser reconnected this EventSource by itself
      es.onopen = () => {
        attempt = 0;
        const after = reopened ? lastId : resumedFrom;
        state({ state: "connected", attempt: 0, delay: 0, ...(after ? { resumedAfter: after } : {}) });
      };
      es.onerror = async () => {
        if (closed || handle.source !== es) return;
        attempt++;
        if (es.readyState !== EventSource.CLOSED) {
          reopened = true;
          state({ state: "reconnecting", attempt, delay: null }); // the browser picks the delay (retry:)
          return;
        }
        es.close();
        const err = await refused(tok);
        if (err) {
          closed = true;
          opts.onError?.(err);
          state({ state: "closed", attempt, delay: 0, reason: err.message });
          return;
        }
        const delay = backoff(attempt);
        state({ state: "reconnecting", attempt, delay });
        clearTimeout(timer);
        timer = setTimeout(() => herald._token().then(open, () => open(tok)), delay);
      };
      // A message and a gap alike move the position and hand their JSON on
      // (an event whose data is not JSON is skipped).
      const listen = (type, deliver) =>
        es.addEventListener(type, (ev) => {
          if (ev.lastEventId) lastId = ev.lastEventId;
          const v = eventJSON(ev);
          if (v !== undefined) run(() => deliver(v));
        });
      listen("message", (m) => opts.onMessage?.(m, handle));
      listen("gap", (g) => opts.onGap?.(g, handle));
      // With a token function: before this token expires, reopen with a
      // fresh one, after the last event (a token function that fails: the
      // stream ends at exp, and reopens then).
      timer = reopenBefore(herald, tok, es, () => !closed && handle.source === es, open, timer);
    };
    // From "now" (the default) the start is asked for first (a long-poll
    // that does not wait), so that a new stream before the first message
    // resumes after it, not at a later "now". "beginning" or a time is the
    // same start again until a message comes.
    const begin = async (tok) => {
      if (!lastId && (opts.from ?? "now") === "now") {
        try {
          const headers = tok ? { Authorization: `Bearer ${tok}` } : {};
          const res = await fetch(`${herald.base}${path}?from=now&wait=false&batch=1000`, { headers });
          if (res.ok) {
            const b = await res.json();
            if (b.gap) run(() => opts.onGap?.(b.gap, handle));
            for (const m of b.messages ?? []) run(() => opts.onMessage?.(m, handle));
            lastId = b.lastEventId ?? "";
          }
        } catch {
          // the stream starts from now, and reports what fails
        }
      }
      open(tok);
    };
    state({ state: "connecting", attempt: 0, delay: 0 });
    if (typeof this.token === "function") {
      this._token().then(begin, (e) => state({ state: "closed", attempt: 0, delay: 0, reason: `token: ${e?.message ?? e}` }));
    } else {
      begin(this.token);
    }
    return handle;
  }
}

/**
 * settle runs a handler and, in "auto" mode, acks on success and nacks on
 * failure. Handlers run one after another (order is kept); acks are not
 * waited for, so a slow ack never holds the next message back.
 */
async function settle(mode, m, run, handle) {
  let err;
  try {
    await run();
  } catch (e) {
    err = e;
  }
  if (mode !== "auto") return;
  const done = err === undefined ? handle.ack(m) : handle.nack(m, err);
  // ack / nack already told onError; nobody else awaits this promise.
  done.catch(() => {});
}

/**
 * eventJSON is an SSE event's data parsed as JSON, or undefined when it is
 * not JSON (JSON.parse never gives undefined): such an event is skipped.
 */
function eventJSON(ev) {
  try {
    return JSON.parse(ev.data);
  } catch {
    return undefined;
  }
}

function errorText(err) {
  return err instanceof Error ? err.message : err;
}

/**
 * refused is the Error of an ack the server refused: its message is the
 * server's reason, e.herald = {message, result} says which message and
 * what the server answered.
 */
function refused(m, result) {
  const e = new Error(result?.error || "ack refused");
  e.herald = { message: m, result };
  return e;
}

/**
 * reported settles an ack or nack for its subscription: onAck when the
 * server took it, onError (with the message attached) when it refused it
 * or the ack was lost. The promise keeps its outcome for the caller.
 */
function reported(opts, m, status, p) {
  return p.then((res) => {
    const result = Array.isArray(res) ? res[0] : res;
    opts.onAck?.(m, status, result);
    return result;
  }, (e) => {
    if (!e.herald) e.herald = { message: m, result: null };
    opts.onError?.(e);
    throw e;
  });
}

class Subscription {
  constructor(herald, localId, opts) {
    this.herald = herald;
    this.localId = localId;
    this.opts = opts;
    this.mode = opts.ack ?? "auto";
    this.onState = opts.onState;
    this.onError = opts.onError;
    this.sub = null; // the server's id while subscribed on the current socket
    this.epoch = 0; // bumped per socket: stale acks are not sent on a new one
    this.acks = []; // waiting for the next ack frame
    // Where each message came from: the socket and the server's sub id.
    this.delivered = new WeakMap();
  }

  _send() {
    const o = this.opts;
    const frame = { type: "subscribe", queue: o.queue };
    if (o.partition) frame.partition = o.partition;
    if (o.consumerGroup) frame.consumerGroup = o.consumerGroup;
    if (o.batch) frame.batch = o.batch;
    if (o.maxInFlight) frame.maxInFlight = o.maxInFlight;
    if (this.mode === "server") frame.autoAck = true;
    if (o.subscriptionMode) frame.subscriptionMode = o.subscriptionMode;
    const epoch = ++this.epoch;
    this.herald._send(frame).then((f) => {
      if (epoch === this.epoch && this.herald._subs.has(this.localId)) this.sub = f.sub;
    }, (e) => this.onError?.(e));
  }

  async _deliver(messages) {
    const from = { ws: this.herald._ws, sub: this.sub };
    for (const m of messages) this.delivered.set(m, from);
    for (const m of messages) {
      await settle(this.mode, m, () => this.opts.onMessage?.(m, this), this);
    }
  }

  // Acks settled in the same turn go out as one frame (one transaction on
  // the server): a delivery of 100 messages is acked with one frame. Each
  // item names its delivery: the lease, the sub it came to and the group,
  // because one socket may hold the same message for several
  // subscriptions. The promise resolves with the server's result for the
  // item; it rejects with a lost frame ("not connected", "connection
  // closed": e.transport) or an error frame.
  _ackFrame(m, status, error, sub) {
    const item = { transactionId: m.transactionId, partitionId: m.partitionId, leaseId: m.leaseId,
      consumerGroup: m.consumerGroup || this.opts.consumerGroup || "__QUEUE_MODE__", status };
    if (sub) item.sub = sub;
    if (error !== undefined) item.error = String(error);
    return new Promise((resolve, reject) => {
      this.acks.push({ item, resolve, reject });
      if (this.acks.length === 1) setTimeout(() => this._flushAcks(), 0);
    });
  }

  _flushAcks() {
    const batch = this.acks;
    this.acks = [];
    this.herald._send({ type: "ack", items: batch.map((b) => b.item) }).then(
      (f) => batch.forEach((b, i) => b.resolve(f.results?.[i])),
      (e) => batch.forEach((b) => b.reject(e)),
    );
  }

  // _settle acks or nacks m where it was delivered: over the socket it came
  // on, or over HTTP when that socket is gone (the lease may still hold).
  async _settle(m, status, error) {
    const from = this.delivered.get(m);
    const ws = this.herald._ws;
    if (from && from.ws !== ws) return this.herald.ack(m, status, error);
    let result;
    try {
      result = await retryUnavailable(() => this._ackFrame(m, status, error, from?.sub ?? this.sub));
    } catch (e) {
      if (!e.transport) throw e;
      return this.herald.ack(m, status, error);
    }
    if (!result || result.success === false) throw refused(m, result);
    return result;
  }

  /**
   * ack(m): the message is done. Over the socket it came on; over HTTP when
   * that is gone. Resolves with the server's result; rejects with its
   * reason when it refuses (and calls onError).
   */
  ack(m) {
    return reported(this.opts, m, "completed", this._settle(m, "completed"));
  }

  /** nack(m, error): the message failed; it is retried, then dead-lettered. As ack otherwise. */
  nack(m, error) {
    const text = errorText(error);
    return reported(this.opts, m, "failed", this._settle(m, "failed", text));
  }

  /** close() unsubscribes; leases still held are given back at once. */
  close() {
    this.herald._subs.delete(this.localId);
    if (this.sub) this.herald._send({ type: "unsubscribe", sub: this.sub }).catch(() => {});
    this.sub = null;
  }
}
