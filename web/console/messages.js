// messages.js: the messages of one partition, a page at a time (newest
// first), and one message: its payload, each group's state and its traces.
import { ago, enc, exact, get, json, query, when } from "./api.js";
import { badge, errorBox, h, link, pre, section, table } from "./ui.js";

const PAGE = 50;
// The messages route reads the last hour unless told: a partition is
// browsed over its whole life.
const SINCE = "2000-01-01T00:00:00Z";

const stateKind = { completed: "ok", processing: "info", pending: "", dead_letter: "bad" };

/** renderPartition(root, {args: [queue, partition], params: {offset, status}}) lists a partition's messages. */
export async function renderPartition(root, { args, params }) {
  const [queue, partition] = args;
  const offset = Math.max(0, Number(params.offset) || 0);
  const status = params.status ?? "";
  root.append(h("div", { className: "page-head" },
    h("h1", {}, h("span", { className: "muted" }, "Partition "), partition),
    h("div", { className: "tools" }, link(`#/queue/${enc(queue)}`, `‹ queue ${queue}`))));
  const sel = h("select", { id: "message-status", name: "status" },
    ["", "pending", "processing", "completed", "dead_letter"].map((s) => h("option", { value: s, selected: s === status }, s || "any")));
  const at = (o, s = status) => `#/partition/${enc(queue)}/${enc(partition)}${query({ status: s, offset: o || "" })}`;
  sel.addEventListener("change", () => {
    location.hash = at(0, sel.value);
  });
  const list = h("div", { id: "messages" }, h("p", { className: "muted" }, "Loading…"));
  root.append(section("Messages, newest first", h("div", { className: "inline-form" }, h("label", { for: "message-status" }, "State"), sel), list));
  try {
    const page = await get("/messages", { queue, partition, status, from: SINCE, limit: PAGE, offset });
    const msgs = page.messages ?? [];
    list.replaceChildren(
      h("div", { className: "pager" },
        h("button", { type: "button", className: "secondary", disabled: offset === 0, on: { click: () => { location.hash = at(Math.max(0, offset - PAGE)); } } }, "‹ Newer"),
        h("span", { className: "page-of" }, msgs.length ? `messages ${exact(offset + 1)}–${exact(offset + msgs.length)}` : "no message"),
        h("button", { type: "button", className: "secondary", disabled: msgs.length < PAGE, on: { click: () => { location.hash = at(offset + PAGE); } } }, "Older ›")),
      table({
        caption: `Messages of ${queue}/${partition}`,
        className: "messages",
        columns: [{ label: "transaction id" }, { label: "state" }, { label: "groups done", num: true }, { label: "pushed" }, { label: "trace id" }],
        rows: msgs.map((m) => ({
          attrs: { dataset: { tx: m.transactionId } },
          cells: [
            link(`#/message/${enc(m.partitionId)}/${enc(m.transactionId)}`, m.transactionId, { className: "mono" }),
            badge(m.status, stateKind[m.status]),
            m.busStatus ? `${m.busStatus.consumedBy}/${m.busStatus.totalGroups}` : "—",
            { v: ago(m.createdAt), title: when(m.createdAt) },
            m.traceId ?? "—",
          ],
        })),
        empty: status ? `No ${status} message.` : "No message in this partition.",
      }));
  } catch (e) {
    list.replaceChildren(errorBox(e, "Reading the messages"));
  }
}

/** renderMessage(root, {args: [partitionId, transactionId]}) shows one message and its traces. */
export async function renderMessage(root, { args }) {
  const [pid, tx] = args;
  root.append(h("div", { className: "page-head" }, h("h1", {}, h("span", { className: "muted" }, "Message "), h("span", { className: "mono" }, tx))));
  const [msg, tr] = await Promise.allSettled([get(`/messages/${enc(pid)}/${enc(tx)}`), get(`/traces/${enc(pid)}/${enc(tx)}`)]);
  if (msg.status === "rejected") {
    root.append(errorBox(msg.reason, msg.reason.status === 404 ? "No such message" : "Reading the message"));
  } else {
    const m = msg.value;
    root.append(section("Message",
      h("dl", { className: "facts" },
        fact("queue", link(`#/queue/${enc(m.queue)}`, m.queue)),
        fact("partition", link(`#/partition/${enc(m.queue)}/${enc(m.partition)}`, m.partition)),
        fact("state", badge(m.status, stateKind[m.status])),
        fact("pushed", `${ago(m.createdAt)} (${when(m.createdAt)})`),
        fact("partition id", h("span", { className: "mono" }, m.partitionId)),
        fact("trace id", m.traceId ?? "—"),
        fact("producer", m.producerSub ?? "—"),
        m.errorMessage ? fact("last error", `${m.errorMessage} (retries: ${m.retryCount ?? "?"})`) : null),
      h("h3", {}, "Payload"), pre(json(m.payload)),
      h("h3", {}, "Consumer groups"),
      table({
        caption: "Each group's state of this message",
        columns: [{ label: "group" }, { label: "state" }, { label: "lease expires" }],
        rows: (m.consumerGroups ?? []).map((g) => [link(`#/group/${enc(g.name)}`, g.name), badge(g.status, stateKind[g.status]), ago(g.leaseExpiresAt)]),
        empty: "No group reads this partition.",
      })));
  }
  root.append(tracesSection(tr));
}

function fact(k, v) {
  return [h("dt", {}, k), h("dd", {}, v)];
}

/** tracesSection(settled) → the traces of a message, oldest first. */
export function tracesSection(tr) {
  if (tr.status === "rejected") return section("Traces", errorBox(tr.reason, "Reading the traces"));
  return section("Traces", tracesTable(tr.value.traces ?? [], false));
}

/** tracesTable(traces, withMessage) → a table of traces (with their message's queue and payload for by-name). */
export function tracesTable(traces, withMessage) {
  const columns = [{ label: "recorded" }, { label: "event" }, { label: "group" }, { label: "names" }, { label: "instance" }, { label: "data" }];
  if (withMessage) columns.splice(1, 0, { label: "message" });
  return table({
    caption: "Traces",
    className: "traces",
    columns,
    rows: traces.map((t) => {
      const cells = [
        { v: ago(t.created_at), title: when(t.created_at) },
        t.event_type,
        t.consumer_group,
        (t.trace_names ?? []).join(", ") || "—",
        t.worker_id ?? "—",
        h("code", { className: "inline-json" }, JSON.stringify(t.data)),
      ];
      if (withMessage) {
        cells.splice(1, 0, link(`#/message/${enc(t.partition_id)}/${enc(t.transaction_id)}`, `${t.queue_name}/${t.partition_name}`));
      }
      return { attrs: { dataset: { trace: t.id } }, cells };
    }),
    empty: "No trace recorded for this message.",
  });
}
