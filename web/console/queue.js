// queue.js: one queue: its totals, each group's lag, and its partitions a
// page at a time, searchable by name: the server pages and searches
// (/resources/partitions), so a queue of 100,000 partitions costs one page.
import { ago, api, count, enc, exact, get, query } from "./api.js";
import { badge, errorBox, h, link, pager, section, stat, table } from "./ui.js";

const PAGE = 50;

/** render(root, {args: [queue], params: {search, offset}}) draws a queue's page. */
export async function render(root, { args, params }) {
  const name = args[0];
  const search = params.search ?? "";
  const offset = Math.max(0, Number(params.offset) || 0);
  root.append(h("div", { className: "page-head" },
    h("h1", {}, h("span", { className: "muted" }, "Queue "), name),
    h("div", { className: "tools" }, link(`#/dlq?queue=${enc(name)}`, "Dead letters of this queue"))));

  const [head, status] = await Promise.allSettled([
    get(`/resources/queues/${enc(name)}`, { limit: 1 }),
    api("GET", `/internal/api/status?queue=${enc(name)}`),
  ]);
  if (head.status === "rejected") {
    root.append(errorBox(head.reason, head.reason.status === 404 ? `No queue ${name}` : "Reading the queue"));
    return;
  }
  const t = head.value.totals;
  root.append(h("div", { className: "stats" },
    stat("partitions", count(head.value.pagination.total), exact(head.value.pagination.total)),
    stat("pushed", count(t.total), exact(t.total)),
    stat("pending", count(t.pending), exact(t.pending)),
    stat("processing", count(t.processing), exact(t.processing)),
    stat("completed", count(t.completed), exact(t.completed)),
    stat("dead letters", count(t.deadLetter), exact(t.deadLetter))));

  if (status.status === "fulfilled") {
    root.append(section("Consumer groups", table({
      caption: `Consumer groups of ${name}`,
      columns: [{ label: "group" }, { label: "lag", num: true, title: "messages not finished, every partition" },
        { label: "leased partitions", num: true }],
      rows: (status.value.queue?.groups ?? []).map((g) => [link(`#/group/${enc(g.group)}`, g.group), { v: count(g.lag), title: exact(g.lag) }, count(g.leased)]),
      empty: "No group has read this queue yet.",
    })));
  } else {
    root.append(section("Consumer groups", errorBox(status.reason, "Group lag")));
  }

  const input = h("input", { id: "partition-search", name: "search", type: "search", value: search, placeholder: "part of a name", autocomplete: "off" });
  const form = h("form", { className: "inline-form", role: "search", on: {
    submit: (ev) => {
      ev.preventDefault();
      location.hash = `#/queue/${enc(name)}${query({ search: input.value.trim() })}`;
    },
  } }, h("label", { for: "partition-search" }, "Search partitions"), input, h("button", { type: "submit" }, "Search"));
  const list = h("div", { id: "partitions" }, h("p", { className: "muted" }, "Loading partitions…"));
  root.append(section("Partitions", form, list));

  try {
    const page = await get("/resources/partitions", { queue: name, search, limit: PAGE, offset });
    const go = (o) => {
      location.hash = `#/queue/${enc(name)}${query({ search, offset: o || "" })}`;
    };
    list.replaceChildren(
      pager({ offset, limit: PAGE, total: page.pagination.total, go, noun: search ? "matching" : "partitions" }),
      partitionsTable(name, page.partitions, search),
    );
  } catch (e) {
    list.replaceChildren(errorBox(e, "Reading the partitions"));
  }
}

function partitionsTable(queue, parts, search) {
  return table({
    caption: `Partitions of ${queue}`,
    className: "partitions",
    columns: [{ label: "partition" }, { label: "pushed", num: true }, { label: "pending", num: true },
      { label: "processing", num: true }, { label: "dead", num: true }, { label: "last push" },
      { label: "groups: cursor · lag · lease" }],
    rows: parts.map((p) => ({
      attrs: { dataset: { partition: p.name } },
      cells: [
        link(`#/partition/${enc(queue)}/${enc(p.name)}`, p.name),
        { v: count(p.messages.total), title: exact(p.messages.total) },
        count(p.messages.pending),
        count(p.messages.processing),
        count(p.messages.deadLetter),
        { v: ago(p.lastPushAt), title: p.lastPushAt ?? "never" },
        groupsCell(p.groups),
      ],
    })),
    empty: search ? `No partition matches "${search}".` : "No partition.",
  });
}

// groupsCell lists each group's position on one partition: its cursor,
// lag, and the lease (holder and expiry) when there is one.
function groupsCell(groups) {
  if (!groups?.length) return h("span", { className: "muted" }, "no group");
  return h("ul", { className: "group-list" }, groups.map((g) => h("li", { dataset: { group: g.name } },
    h("strong", {}, g.name), ` · cursor ${exact(g.cursor)} · lag ${exact(g.lag)}`,
    g.lease ? [" · ", leaseText(g.lease)] : null)));
}

function leaseText(l) {
  const who = `${l.owner ?? "?"}${l.subject ? ` (${l.subject})` : ""}`;
  return l.live
    ? h("span", { title: `lease ${l.id}, offsets ${l.from}–${l.to}` }, badge("leased", "ok"), ` ${who}, expires ${ago(l.expiresAt)}`)
    : h("span", { title: `lease ${l.id}` }, badge("expired", "warn"), ` ${who}, ${ago(l.expiresAt)}`);
}
