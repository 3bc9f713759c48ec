// system.js: the two maintenance switches (push and pop), each shown as
// the database holds it and flipped after a confirmation, and the state
// this instance shares (caches, syncnet).
import { api, exact, json } from "./api.js";
import { badge, confirm, errorBox, h, notice, pre, section } from "./ui.js";

const switches = [
  { key: "push", path: "/system/maintenance", field: "maintenanceMode",
    on: "Pushes are buffered on disk by each instance, not stored, until it ends; then they drain into the queues.",
    off: "Pushes go to the database." },
  { key: "pop", path: "/system/maintenance/pop", field: "popMaintenanceMode",
    on: "Nothing is delivered: pops answer 204, subscriptions wait. Pushes and acks go on.",
    off: "Messages are delivered." },
];

/** render(root) draws the maintenance page. */
export async function render(root) {
  root.append(h("div", { className: "page-head" }, h("h1", {}, "Maintenance")));
  const flash = h("div", { id: "maint-result", "aria-live": "polite" });
  const box = h("div", { id: "maintenance" });
  root.append(flash, box);

  async function load() {
    let st;
    try {
      const [push, pop] = await Promise.all([api("GET", "/system/maintenance"), api("GET", "/system/maintenance/pop")]);
      st = { push, pop };
    } catch (e) {
      box.replaceChildren(errorBox(e, "Reading the maintenance modes"));
      return;
    }
    box.replaceChildren(...switches.map((s) => card(s, st)));
  }

  function card(s, st) {
    const on = !!st[s.key][s.field];
    const extra = s.key === "push"
      ? h("p", { className: "muted" }, `This instance's buffer: ${exact(st.push.bufferedMessages)} message(s) waiting; ` +
        `${st.push.bufferHealthy ? "it accepts writes" : "no writable buffer (pushes are refused while push maintenance is on)"}.`)
      : null;
    return h("section", { className: "card switch", dataset: { mode: s.key, state: on ? "on" : "off" } },
      h("h2", {}, `${s.key === "push" ? "Push" : "Pop"} maintenance `, badge(on ? "ON" : "off", on ? "warn" : "ok")),
      h("p", {}, on ? s.on : s.off),
      extra,
      h("button", { type: "button", className: on ? "" : "danger", id: `maint-${s.key}`, on: { click: () => flip(s, !on) } },
        on ? `Switch ${s.key} maintenance off` : `Switch ${s.key} maintenance on`));
  }

  async function flip(s, enabled) {
    const ok = await confirm({
      title: `${enabled ? "Start" : "End"} ${s.key} maintenance?`,
      body: enabled ? `${s.on} It holds on every instance sharing this database.` : `${s.off} Every instance learns it within milliseconds.`,
      ok: enabled ? "Switch on" : "Switch off",
      danger: enabled,
    });
    if (!ok) return;
    try {
      const r = await api("POST", s.path, { enabled });
      flash.replaceChildren(notice(r.message ?? `${s.key} maintenance ${enabled ? "on" : "off"}`));
    } catch (e) {
      flash.replaceChildren(errorBox(e, `Switching ${s.key} maintenance`));
    }
    await load();
  }

  await load();
  try {
    const shared = await api("GET", "/system/shared-state");
    root.append(section("Shared state of this instance", h("details", {}, h("summary", {}, "caches and syncnet (JSON)"), pre(json(shared)))));
  } catch (e) {
    root.append(section("Shared state of this instance", errorBox(e, "Reading the shared state")));
  }
}
