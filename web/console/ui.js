// ui.js: the DOM pieces every page builds from: elements (text is always
// set as text, never parsed as HTML), tables with right-aligned numbers,
// sparklines, the confirmation dialog, inline errors and pagers.
import { errorText } from "./api.js";

/**
 * h(tag, attrs, ...children) → an element. attrs: className, dataset
 * ({k: v}), on ({event: f}), anything else as an attribute (false/null
 * left out). Children: nodes, strings (as text) or arrays of them.
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v === false || v === null || v === undefined) continue;
    if (k === "className") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k === "on") for (const [ev, f] of Object.entries(v)) el.addEventListener(ev, f);
    else if (k === "text") el.textContent = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** link(href, text) → an <a>. */
export const link = (href, text, attrs = {}) => h("a", { href, ...attrs }, text);

/**
 * table({caption, columns: [{label, num?, title?}], rows: [[cell…]], empty, className})
 * → a scrollable table. A cell is a node, a string, or {v, title, className}.
 * Numeric columns are right-aligned.
 */
export function table({ caption, columns, rows, empty = "Nothing here.", className = "" }) {
  const head = h("tr", {}, columns.map((c) => h("th", { scope: "col", className: c.num ? "num" : "", title: c.title }, c.label)));
  const body = h("tbody");
  for (const row of rows) {
    const tr = h("tr", row.attrs ?? {});
    (row.cells ?? row).forEach((cell, i) => {
      const plain = cell === null || cell === undefined || typeof cell !== "object" || cell instanceof Node || Array.isArray(cell);
      const td = h("td", {
        className: [columns[i]?.num ? "num" : "", plain ? "" : cell.className ?? ""].join(" ").trim(),
        title: plain ? undefined : cell.title,
        "data-label": columns[i]?.label,
      }, plain ? cell : cell.v);
      tr.append(td);
    });
    body.append(tr);
  }
  if (rows.length === 0) {
    body.append(h("tr", { className: "empty" }, h("td", { colspan: String(columns.length), className: "muted" }, empty)));
  }
  return h("div", { className: "table-wrap" },
    h("table", { className },
      caption ? h("caption", { className: "visually-hidden" }, caption) : null,
      h("thead", {}, head), body));
}

/** sparkline(values, label) → an SVG line of the values (the last at the right), scaled to their max. */
export function sparkline(values, label) {
  const w = 96;
  const hgt = 22;
  const vs = (values ?? []).map((v) => Number(v) || 0);
  let shape = "";
  if (vs.length >= 2) {
    const max = Math.max(1, ...vs);
    const step = w / (vs.length - 1);
    const pts = vs.map((v, i) => `${(i * step).toFixed(1)},${(hgt - 2 - (v / max) * (hgt - 4)).toFixed(1)}`).join(" ");
    shape = `<polygon class="area" points="0,${hgt} ${pts} ${w},${hgt}"></polygon><polyline points="${pts}"></polyline>`;
  }
  // Parsed as HTML, <svg> gets the SVG namespace by itself; only numbers
  // go into the markup, the label is set as an attribute.
  const box = document.createElement("span");
  box.innerHTML = `<svg class="spark" viewBox="0 0 ${w} ${hgt}" width="${w}" height="${hgt}" role="img">${shape}</svg>`;
  const svg = box.firstElementChild;
  svg.setAttribute("aria-label", label);
  return svg;
}

// The answer of the confirmation dialog open now, if any. It is settled
// by the button pressed (or Escape) as it happens, not by the dialog's
// close event: that one is queued, and can arrive after the next dialog
// has opened.
let pending = null;

function settle(v) {
  const r = pending;
  pending = null;
  r?.(v);
}

let wired = false;
function wire(dlg) {
  if (wired) return;
  wired = true;
  document.getElementById("confirm-ok").addEventListener("click", () => settle(true));
  document.getElementById("confirm-cancel").addEventListener("click", () => settle(false));
  dlg.addEventListener("cancel", () => settle(false)); // Escape
}

/**
 * confirm({title, body, ok, danger}) → a promise of true when the operator
 * confirmed in the modal dialog, false when they cancelled or pressed Escape.
 */
export function confirm({ title, body, ok = "Confirm", danger = true }) {
  const dlg = document.getElementById("confirm");
  wire(dlg);
  settle(false); // one dialog at a time
  document.getElementById("confirm-title").textContent = title;
  const b = document.getElementById("confirm-body");
  b.replaceChildren(...(Array.isArray(body) ? body : [body]).map((x) => (x instanceof Node ? x : document.createTextNode(x))));
  const okButton = document.getElementById("confirm-ok");
  okButton.textContent = ok;
  okButton.className = danger ? "danger" : "";
  return new Promise((resolve) => {
    pending = resolve;
    if (!dlg.open) dlg.showModal();
    document.getElementById("confirm-cancel").focus();
  });
}

/** errorBox(e, what) → an inline alert saying what failed and why. */
export function errorBox(e, what) {
  const box = h("div", { className: "alert error", role: "alert" },
    what ? h("strong", {}, `${what}: `) : null, errorText(e));
  box.dataset.status = String(e?.status ?? "");
  return box;
}

/** notice(text, kind) → an inline status line ("ok", "warn", "info"). */
export function notice(text, kind = "ok") {
  return h("div", { className: `alert ${kind}`, role: "status" }, text);
}

/**
 * pager({offset, limit, total, go(offset)}) → "page 3 of 40 (1,990 items)"
 * with Previous and Next buttons. For keyset paging give page, prev and
 * next instead of offset and go (prev, next: functions, or null when
 * there is no such page).
 */
export function pager({ offset = 0, limit, total, go, noun = "items", page, prev, next }) {
  const pages = Math.max(1, Math.ceil(total / limit));
  const keyset = page !== undefined;
  if (!keyset) {
    page = Math.floor(offset / limit) + 1;
    prev = offset > 0 ? () => go(Math.max(0, offset - limit)) : null;
    next = offset + limit < total ? () => go(offset + limit) : null;
  }
  return h("div", { className: "pager" },
    h("button", { type: "button", className: "secondary", disabled: !prev, on: { click: () => prev?.() } }, "‹ Previous"),
    h("span", { className: "page-of", "aria-live": "polite" },
      `page ${page.toLocaleString("en-US")} of ${pages.toLocaleString("en-US")} (${total.toLocaleString("en-US")} ${noun})`),
    h("button", { type: "button", className: "secondary", disabled: !next || page >= pages, on: { click: () => next?.() } }, "Next ›"));
}

/** section(title, ...children) → a titled card. */
export function section(title, ...children) {
  return h("section", { className: "card" }, h("h2", {}, title), ...children);
}

/** stat(label, value, title) → one figure of a row of figures. */
export function stat(label, value, title, attrs = {}) {
  return h("div", { className: "stat", title, ...attrs }, h("span", { className: "v" }, value), h("span", { className: "k" }, label));
}

/** badge(text, kind) → a small coloured label. */
export const badge = (text, kind = "") => h("span", { className: `badge ${kind}` }, text);

/** pre(value) → a JSON block. */
export const pre = (text) => h("pre", { className: "json" }, text);
