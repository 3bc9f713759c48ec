// groups.js: consumer groups with their lag, and the acts on them: seek to
// a time or to the end, delete on one queue or everywhere, each after a
// confirmation; the result is shown and the lag read again.
import { ago, api, count, duration, enc, exact, get, when } from "./api.js";
import { badge, confirm, errorBox, h, link, notice, section, table } from "./ui.js";

const LAG_QUEUES = 50;

/** render(root) lists every (group, queue) pair with its lag and the acts on it. */
export async function render(root) {
  root.append(h("div", { className: "page-head" }, h("h1", {}, "Consumer groups")));
  const flash = h("div", { id: "group-result", "aria-live": "polite" });
  const body = h("div", { id: "groups", className: "card" }, h("p", { className: "muted" }, "Loading…"));
  root.append(flash, body);

  async function load() {
    let list;
    try {
      list = await get("/consumer-groups");
    } catch (e) {
      body.replaceChildren(errorBox(e, "Reading the consumer groups"));
      return;
    }
    // Exact lag per (group, queue): one status read per queue.
    const queues = [...new Set(list.map((g) => g.queueName))].slice(0, LAG_QUEUES);
    const st = await Promise.allSettled(queues.map((q) => api("GET", `/internal/api/status?queue=${enc(q)}`)));
    const lag = {};
    st.forEach((r, i) => {
      for (const g of r.value?.queue?.groups ?? []) lag[`${g.group}\u0000${queues[i]}`] = g;
    });
    body.replaceChildren(table({
      caption: "Consumer groups by queue",
      className: "groups",
      columns: [{ label: "group" }, { label: "queue" }, { label: "lag", num: true }, { label: "partitions", num: true },
        { label: "lagging", num: true }, { label: "leased", num: true }, { label: "time lag", num: true }, { label: "last read" }, { label: "state" }, { label: "actions" }],
      rows: list.map((g) => {
        const s = lag[`${g.name}\u0000${g.queueName}`];
        return {
          attrs: { dataset: { group: g.name, queue: g.queueName } },
          cells: [
            link(`#/group/${enc(g.name)}`, g.name),
            link(`#/queue/${enc(g.queueName)}`, g.queueName),
            s ? { v: count(s.lag), title: exact(s.lag), className: "lag" } : { v: "—", className: "lag" },
            exact(g.members),
            exact(g.partitionsWithLag),
            s ? exact(s.leased) : "—",
            { v: duration(g.maxTimeLag), title: "age of the newest message it has not finished" },
            { v: ago(g.lastSeenAt), title: idleTitle(g) },
            badge(g.state, g.state === "Lagging" ? "warn" : g.state === "Dead" ? "muted" : "ok"),
            h("div", { className: "row-actions" },
              h("button", { type: "button", className: "secondary seek", on: { click: () => seek(g.name, g.queueName) } }, "Seek…"),
              h("button", { type: "button", className: "danger delete-queue", on: { click: () => remove(g.name, g.queueName) } }, "Delete on queue"),
              h("button", { type: "button", className: "danger delete-group", on: { click: () => remove(g.name) } }, "Delete group")),
          ],
        };
      }),
      empty: "No consumer group has read anything yet.",
    }));
  }

  // What retention will do with a group nobody reads (idleGroupRetentionSeconds).
  function idleTitle(g) {
    if (g.name === "__QUEUE_MODE__" || !g.idleGroupRetentionSeconds) return "when a consumer last read; never removed for idleness";
    return `when a consumer last read; removed by retention after ${duration(g.idleGroupRetentionSeconds)} without one`;
  }

  function show(node) {
    flash.replaceChildren(node);
  }

  async function seek(group, queue) {
    const end = h("input", { type: "radio", name: "seek-to", id: "seek-end", value: "end", checked: true });
    const time = h("input", { type: "radio", name: "seek-to", id: "seek-time", value: "time" });
    const at = h("input", { type: "datetime-local", id: "seek-at", step: "1", "aria-label": "Time to seek to (local)" });
    at.addEventListener("input", () => { time.checked = true; });
    const ok = await confirm({
      title: `Seek ${group} on ${queue}`,
      ok: "Seek",
      body: [h("span", {}, "Move the group's cursors on every partition of the queue. Its leases end."),
        h("span", { className: "choice" }, end, h("label", { for: "seek-end" }, "to the end (skip everything waiting)")),
        h("span", { className: "choice" }, time, h("label", { for: "seek-time" }, "to a time (messages after it are delivered again)"), at)],
    });
    if (!ok) return;
    const req = end.checked ? { toEnd: true } : { timestamp: new Date(at.value).toISOString() };
    if (!end.checked && !at.value) {
      show(errorBox(new Error("choose a time to seek to"), "Seek"));
      return;
    }
    try {
      const r = await api("POST", `/consumer-groups/${enc(group)}/queues/${enc(queue)}/seek`, req);
      show(notice(`Moved ${group} on ${queue} ${r.seekToEnd ? "to the end" : `back to ${when(r.targetTimestamp)}`}: ${r.partitionsUpdated} partition(s) moved.`));
    } catch (e) {
      show(errorBox(e, "Seek"));
    }
    await load();
  }

  async function remove(group, queue) {
    const what = queue ? `${group} on ${queue}` : `${group} on every queue`;
    const ok = await confirm({
      title: `Delete consumer group ${what}?`,
      ok: "Delete",
      body: `Its positions, leases and subscription go; messages stay. Its next read starts it afresh (from the beginning unless it asks for new messages only). A consumer holding a lease has its acks refused.`,
    });
    if (!ok) return;
    try {
      const path = queue ? `/consumer-groups/${enc(group)}/queues/${enc(queue)}` : `/consumer-groups/${enc(group)}`;
      const r = await api("DELETE", path);
      show(notice(`Deleted ${what}: ${r.deletedPartitions} partition position(s).`));
    } catch (e) {
      show(errorBox(e, "Delete"));
    }
    await load();
  }

  await load();
}

/** renderGroup(root, {args: [group]}) shows a group's position on each partition of each queue. */
export async function renderGroup(root, { args }) {
  const group = args[0];
  root.append(h("div", { className: "page-head" }, h("h1", {}, h("span", { className: "muted" }, "Group "), group),
    h("div", { className: "tools" }, link("#/groups", "‹ all groups"))));
  let g;
  try {
    g = await get(`/consumer-groups/${enc(group)}`);
  } catch (e) {
    root.append(errorBox(e, e.status === 404 ? `No group ${group}` : "Reading the group"));
    return;
  }
  for (const [queue, v] of Object.entries(g)) {
    root.append(section(`Queue ${queue}`, table({
      caption: `${group} on ${queue}`,
      columns: [{ label: "partition" }, { label: "lag", num: true }, { label: "time lag", num: true }, { label: "consumed", num: true },
        { label: "lease holder" }, { label: "lease expires" }, { label: "last consumed" }],
      rows: v.partitions.map((p) => [
        link(`#/partition/${enc(queue)}/${enc(p.partition)}`, p.partition),
        exact(p.offsetLag),
        duration(p.timeLagSeconds),
        exact(p.totalConsumed),
        p.leaseActive ? p.workerId ?? "?" : h("span", { className: "muted" }, "none"),
        p.leaseActive ? ago(p.leaseExpiresAt) : "—",
        ago(p.lastConsumedAt),
      ]),
    })));
  }
}
