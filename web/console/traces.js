// traces.js: traces by name (one business flow across queues), the names
// most recently seen, and a jump to one message's traces by its ids.
import { ago, enc, exact, get, query } from "./api.js";
import { errorBox, h, link, pager, section, table } from "./ui.js";
import { tracesTable } from "./messages.js";

const PAGE = 50;

/** render(root, {params: {name, offset}}) draws the traces page. */
export async function render(root, { params }) {
  const name = params.name ?? "";
  const offset = Math.max(0, Number(params.offset) || 0);
  root.append(h("div", { className: "page-head" }, h("h1", {}, "Traces")));

  const nameInput = h("input", { id: "trace-name", name: "name", value: name, autocomplete: "off", required: true });
  const byName = h("form", { className: "inline-form", on: { submit: (ev) => {
    ev.preventDefault();
    location.hash = `#/traces${query({ name: nameInput.value.trim() })}`;
  } } }, h("label", { for: "trace-name" }, "Trace name"), nameInput, h("button", { type: "submit" }, "Find"));

  const pid = h("input", { id: "trace-pid", name: "partitionId", placeholder: "partition id (UUID)", autocomplete: "off", required: true });
  const tx = h("input", { id: "trace-tx", name: "transactionId", placeholder: "transaction id", autocomplete: "off", required: true });
  const byMessage = h("form", { className: "inline-form", on: { submit: (ev) => {
    ev.preventDefault();
    location.hash = `#/message/${enc(pid.value.trim())}/${enc(tx.value.trim())}`;
  } } }, h("label", { for: "trace-pid" }, "Partition id"), pid, h("label", { for: "trace-tx" }, "Transaction id"), tx,
  h("button", { type: "submit" }, "Show message"));
  root.append(section("Look up", byName, byMessage));

  const results = h("div", { id: "trace-results" });
  root.append(results);
  if (name) {
    try {
      const page = await get(`/traces/by-name/${enc(name)}`, { limit: PAGE, offset });
      results.append(section(`Traces named "${name}"`,
        pager({ offset, limit: PAGE, total: page.total, noun: "traces",
          go: (o) => { location.hash = `#/traces${query({ name, offset: o || "" })}`; } }),
        tracesTable(page.traces ?? [], true)));
    } catch (e) {
      results.append(errorBox(e, "Reading the traces"));
    }
  }
  try {
    const names = await get("/traces/names", { limit: 50 });
    root.append(section("Recent trace names", table({
      caption: "Trace names, most recently seen first",
      columns: [{ label: "name" }, { label: "traces", num: true }, { label: "messages", num: true }, { label: "last seen" }],
      rows: (names.trace_names ?? []).map((n) => [link(`#/traces${query({ name: n.trace_name })}`, n.trace_name),
        exact(n.trace_count), exact(n.message_count), ago(n.last_seen)]),
      empty: "No trace recorded yet.",
    })));
  } catch (e) {
    root.append(section("Recent trace names", errorBox(e, "Reading the trace names")));
  }
}
