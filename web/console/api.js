// api.js: the console's calls to Herald's API, through the browser SDK's
// request() (herald.js), with the admin token the operator pasted (kept in
// this browser's localStorage) or, as on the demo page, ?access_token= in
// the page's URL. Also the formatting every page shares.
import { Herald } from "/herald.js";

const KEY = "herald.console.token";

function stored() {
  try {
    return localStorage.getItem(KEY) ?? "";
  } catch {
    return ""; // storage off (a private window): the URL's token only
  }
}

let current = new URLSearchParams(location.search).get("access_token") || stored();

/** token() → the token the console sends now ("" when none: auth off). */
export function token() {
  return current;
}

/** setToken(t) keeps t for this browser ("" forgets it). */
export function setToken(t) {
  current = t.trim();
  try {
    if (current) localStorage.setItem(KEY, current);
    else localStorage.removeItem(KEY);
  } catch {
    // kept for this page only
  }
}

const herald = new Herald(location.origin, { token: () => current });

/** TOKEN_COMMAND makes an admin token where Herald runs (it signs with the server's --auth-secret). */
export const TOKEN_COMMAND = "herald token --sub ops --role admin";

/**
 * api(method, path, body) → the answer of /api/v1<path> (or of path when it
 * starts with /internal). A refusal for the token (401, 403) is also told
 * once to the page, as the event "herald-auth" with the status, so the
 * advice on getting a token is shown in one place (main.js), not per panel.
 */
export async function api(method, path, body) {
  const full = path.startsWith("/internal/") ? path : `/api/v1${path}`;
  try {
    return await herald.request(method, full, body);
  } catch (e) {
    if (e?.status === 401 || e?.status === 403) {
      window.dispatchEvent(new CustomEvent("herald-auth", { detail: { status: e.status } }));
    }
    throw e;
  }
}

/** get(path, params) → the answer of GET /api/v1<path>?params (empty params left out). */
export function get(path, params = {}) {
  return api("GET", path + query(params));
}

/** query({a: 1, b: ""}) → "?a=1": the non-empty parameters. */
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") q.set(k, String(v));
  }
  const s = q.toString();
  return s ? `?${s}` : "";
}

/** enc(name) → a path segment. */
export const enc = encodeURIComponent;

/** errorText(e) → what the operator should read for a failed call. */
export function errorText(e) {
  switch (e?.status) {
    case 0:
      return "Network error: the server does not answer. Is Herald running?";
    case 401:
      return "Needs an admin token (see above).";
    case 403:
      return "Needs a token with role admin (see above).";
    default:
      return e?.message ?? String(e);
  }
}

/** count(n) → "950", "12.3k", "4.5M": a human count. */
export function count(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "—";
  const a = Math.abs(n);
  if (a < 1000) return String(Math.round(n * 10) / 10);
  if (a < 1e6) return `${trim(n / 1e3)}k`;
  if (a < 1e9) return `${trim(n / 1e6)}M`;
  return `${trim(n / 1e9)}G`;
}

function trim(x) {
  return Math.abs(x) >= 100 ? String(Math.round(x)) : x.toFixed(1).replace(/\.0$/, "");
}

/** exact(n) → "12,345": a count with thousands separators (titles, totals). */
export function exact(n) {
  return n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US");
}

/** duration(s) → "45 s", "3 m", "2 h 5 m", "4 d". */
export function duration(s) {
  if (s === null || s === undefined || Number.isNaN(s)) return "—";
  s = Math.max(0, Math.round(s));
  if (s < 60) return `${s}\u00a0s`;
  if (s < 3600) return `${Math.floor(s / 60)}\u00a0m`;
  if (s < 86400) {
    const m = Math.floor((s % 3600) / 60);
    return `${Math.floor(s / 3600)}\u00a0h${m ? ` ${m}\u00a0m` : ""}`;
  }
  return `${Math.floor(s / 86400)}\u00a0d`;
}

/** ago(ts) → "3 m ago" ("in 4 m" for a time ahead); "—" for none. */
export function ago(ts) {
  if (!ts) return "—";
  const d = (Date.now() - new Date(ts).getTime()) / 1000;
  if (Number.isNaN(d)) return "—";
  if (d < 0) return `in ${duration(-d)}`;
  if (d < 2) return "just now";
  return `${duration(d)} ago`;
}

/** when(ts) → the local date and time, for titles. */
export function when(ts) {
  return ts ? new Date(ts).toLocaleString() : "";
}

/** json(v) → v pretty-printed. */
export function json(v) {
  return JSON.stringify(v, null, 2);
}
