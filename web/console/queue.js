// queue.js: one queue: its totals, each group's lag, and its partitions a
// page at a time, searchable by name: the server pages and searches
// (/resources/partitions), so a queue of 100,000 partitions costs one page.
// Pages follow each other by keyset (after: the last name of the page
// before), never by offset, which the server caps and which costs the
// index entries it skips; Previous pops a stack of the after cursors that
// led here. The search is by prefix (an index range) unless "contains" is
// ticked (a substring, any case: it reads every partition of the queue).
import { ago, api, count, enc, exact, get, query } from "./api.js";
import { badge, errorBox, h, link, pager, section, stat, table } from "./ui.js";

const PAGE = 50;

// trail is the after cursor of each page up to the one shown, for one
// queue and search: cursors[i] opened page i + 1 ("" the first).
let trail = { key: "", cursors: [""] };

/** render(root, {args: [queue], params: {search, contains, after, page}}) draws a queue's page. */
export async function render(root, { args, params }) {
  const name = args[0];
  const search = params.search ?? "";
  const contains = params.contains === "1";
  const after = params.after ?? "";
  let page = Math.max(1, Math.floor(Number(params.page)) || 1);
  const key = JSON.stringify([name, search, contains]);
  if (trail.key !== key) trail = { key, cursors: [""] };
  if (trail.cursors[page - 1] !== after) {
    // Opened from a link or a reload: the pages before are not known; a
    // Previous from here goes to the first.
    page = after ? 2 : 1;
    trail.cursors = after ? ["", after] : [""];
  }
  trail.cursors.length = page;
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
    stat("dead letters", count(t.deadLetter), exact(t.deadLetter)),
    status.status === "fulfilled"
      ? stat(`followers, ${exact(status.value.followers?.[name] ?? 0)} here`,
        count(status.value.clusterFollowers?.[name] ?? status.value.followers?.[name] ?? 0),
        "follow streams of this queue on every instance, each getting every message (the others' counts are up to two members beats old, 4 s by default; herald_followers counts this instance's)", { id: "followers" })
      : null));

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

  const input = h("input", { id: "partition-search", name: "search", type: "search", value: search, placeholder: "start of a name", autocomplete: "off" });
  const anywhere = h("input", { id: "partition-contains", type: "checkbox", checked: contains });
  const form = h("form", { className: "inline-form", role: "search", on: {
    submit: (ev) => {
      ev.preventDefault();
      location.hash = `#/queue/${enc(name)}${query({ search: input.value.trim(), contains: anywhere.checked ? "1" : "" })}`;
    },
  } }, h("label", { for: "partition-search" }, "Search partitions"), input,
  h("label", { className: "check", title: "a substring, any case: reads every partition of the queue (slow past 100,000)" },
    anywhere, " contains"),
  h("button", { type: "submit" }, "Search"));
  const list = h("div", { id: "partitions" }, h("p", { className: "muted" }, "Loading partitions…"));
  root.append(section("Partitions", form, list));

  try {
    const ans = await get("/resources/partitions", { queue: name, [contains ? "search" : "prefix"]: search, after, limit: PAGE });
    const go = (p, cursor) => {
      location.hash = `#/queue/${enc(name)}${query({ search, contains: contains ? "1" : "", after: cursor, page: p > 1 ? p : "" })}`;
    };
    const next = ans.pagination.next;
    list.replaceChildren(
      pager({ page, limit: PAGE, total: ans.pagination.total, noun: search ? "matching" : "partitions",
        prev: page > 1 ? () => go(page - 1, trail.cursors[page - 2]) : null,
        next: next ? () => { trail.cursors[page] = next; go(page + 1, next); } : null }),
      partitionsTable(name, ans.partitions, search),
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
  // An HTTP pop's lease is owned by "<instance>#pop" (a restart keeps it):
  // its client holds it, not a stream of that instance.
  const owner = l.owner ?? "?";
  const inst = owner.endsWith("#pop") ? `${owner.slice(0, -4)} by pop` : owner;
  const who = `${inst}${l.subject ? ` (${l.subject})` : ""}`;
  return l.live
    ? h("span", { title: `lease ${l.id}, offsets ${l.from}–${l.to}` }, badge("leased", "ok"), ` ${who}, expires ${ago(l.expiresAt)}`)
    : h("span", { title: `lease ${l.id}` }, badge("expired", "warn"), ` ${who}, ${ago(l.expiresAt)}`);
}
