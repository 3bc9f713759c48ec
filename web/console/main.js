// main.js: the console's shell: the token form, the instance line, and
// hash routing ("#/dlq?queue=orders") to the pages, each a module with
// render(root, route) that may return a function to stop its timers.
import { api, errorText, setToken, token, TOKEN_COMMAND } from "./api.js";
import * as overview from "./overview.js";
import * as queuePage from "./queue.js";
import * as messages from "./messages.js";
import * as dlq from "./dlq.js";
import * as groups from "./groups.js";
import * as traces from "./traces.js";
import * as system from "./system.js";

const $ = (id) => document.getElementById(id);

// Routes: the first path segment names the page; the rest are its
// arguments (percent-encoded names).
const pages = {
  "": overview.render,
  queue: queuePage.render,
  partition: messages.renderPartition,
  message: messages.renderMessage,
  dlq: dlq.render,
  groups: groups.render,
  group: groups.renderGroup,
  traces: traces.render,
  system: system.render,
};

// The nav tab each page belongs to.
const tab = { "": "overview", queue: "overview", partition: "overview", message: "overview", group: "groups" };

/** parse("#/queue/orders?search=eu") → {page, args, params}. */
export function parse(hash) {
  const raw = hash.replace(/^#\/?/, "");
  const [path, q = ""] = raw.split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { page: parts[0] ?? "", args: parts.slice(1), params: Object.fromEntries(new URLSearchParams(q)) };
}

let stop = null;
let serial = 0;

async function route() {
  const r = parse(location.hash);
  const render = pages[r.page];
  if (stop) {
    stop();
    stop = null;
  }
  const mine = ++serial;
  for (const a of document.querySelectorAll("nav a")) {
    const on = a.dataset.page === (tab[r.page] ?? r.page);
    if (on) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  const root = $("view");
  if (!render) {
    root.replaceChildren(Object.assign(document.createElement("p"), { textContent: `No page "${r.page}".` }));
    return;
  }
  // A page that lands after the operator moved on is dropped.
  const view = document.createElement("div");
  view.className = "page";
  view.dataset.page = r.page || "overview";
  root.replaceChildren(view);
  try {
    const cleanup = await render(view, r, () => mine === serial);
    if (mine === serial) stop = cleanup ?? null;
    else cleanup?.();
  } catch (e) {
    view.textContent = errorText(e);
  }
}

function showTokenState() {
  $("token-state").textContent = token() ? "token set" : "no token";
}

$("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  setToken($("token").value);
  authHint(0);
  $("token").value = "";
  showTokenState();
  instance();
  route();
});
$("token-forget").addEventListener("click", () => {
  setToken("");
  authHint(0);
  showTokenState();
  instance();
  route();
});

// instance shows which Herald answers and its version (admin only).
async function instance() {
  try {
    const st = await api("GET", "/internal/api/status");
    $("instance").textContent = `${st.instance} · ${st.version}`;
  } catch (e) {
    $("instance").textContent = e.status === 401 || e.status === 403 ? "needs an admin token" : "unreachable";
  }
}

// authHint says, once for the whole page, what to do when Herald refused
// the token: 401 (none, expired or invalid) or 403 (below admin). It is
// cleared when the token changes and shown again by the next refusal.
function authHint(status) {
  const el = $("auth-hint");
  if (!status) {
    el.hidden = true;
    el.textContent = "";
    return;
  }
  const why = status === 401
    ? (token() ? "Auth is on and Herald refused this token (expired, or not signed with its secret)."
      : "Auth is on and this console has no token.")
    : "This token's role is below admin, and the console needs role admin.";
  const code = document.createElement("code");
  code.textContent = TOKEN_COMMAND;
  el.replaceChildren(`${why} Make an admin token where Herald runs, with its --auth-secret set: `, code,
    ", and paste it above.");
  el.hidden = false;
}
window.addEventListener("herald-auth", (e) => authHint(e.detail.status));

window.addEventListener("hashchange", route);
showTokenState();
instance();
route();
