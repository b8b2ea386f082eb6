// The cluster view: nodes, how they connect, instances with their runners, and downloads.

import { errorText, request } from "./api.js";
import { formatBytes, formatDuration, h, progressBar, render, shortId, toast } from "./dom.js";
import { isReady, nodeName } from "./model.js";

const SVG = "http://www.w3.org/2000/svg";
// A node whose last logged report is older than this is shown as quiet. The master logs a
// node's telemetry when it changes or at least every 60 s (exo_core/coalesce.py), and times
// out a node silent for 30 s; a cluster without a majority cannot, so its dead nodes stay in
// state, and this is how the page shows them.
const QUIET_AFTER_S = 75;

const STATUS_WORDS = {
  pending: "pending",
  downloading: "downloading",
  connecting: "connecting",
  loading: "loading",
  warming_up: "warming up",
  ready: "ready",
  running: "running",
  failed: "failed",
  stopped: "stopped",
};

export function statusBadge(status) {
  return h(`span.badge.status-${status}`, {}, STATUS_WORDS[status] || status);
}

function nodeCard(store, node, position) {
  const { state, nodeId } = store;
  const r = node.resources || {};
  const used = Math.max(0, (r.memory_total || 0) - (r.memory_available || 0));
  const diskUsed = Math.max(0, (r.disk_total || 0) - (r.disk_available || 0));
  const isMaster = state.master?.node_id === node.node_id;
  const quiet = node.last_seen && Date.now() / 1000 - node.last_seen > QUIET_AFTER_S;
  return h(
    "article.node-card",
    { dataset: { nodeId: node.node_id }, "aria-label": `node ${nodeName(state, node.node_id)}` },
    h(
      "header",
      {},
      h("span.node-number", { "aria-hidden": "true" }, String(position)),
      h("h3", {}, nodeName(state, node.node_id)),
      isMaster ? h("span.badge.master", { title: "elected master" }, `master · term ${state.master.term}`) : null,
      node.node_id === nodeId ? h("span.badge.self", { title: "the node this page talks to" }, "this node") : null,
      quiet ? h("span.badge.status-failed", {}, "not reporting") : null,
    ),
    h("p.mono.muted", { title: node.node_id }, shortId(node.node_id), " · ", (node.addresses || []).join(", ")),
    h(
      "dl.stats",
      {},
      h("dt", {}, "Memory"),
      h("dd", {}, progressBar(r.memory_total ? used / r.memory_total : 0, "memory used"), `${formatBytes(used)} / ${formatBytes(r.memory_total)}`),
      h("dt", {}, "CPU"),
      h("dd", {}, progressBar((r.cpu_percent || 0) / 100, "CPU busy"), `${(r.cpu_percent || 0).toFixed(0)}% of ${r.cpu_count || "?"} cores`),
      h("dt", {}, "Disk"),
      h("dd", {}, progressBar(r.disk_total ? diskUsed / r.disk_total : 0, "disk used"), `${formatBytes(r.disk_available)} free of ${formatBytes(r.disk_total)}`),
    ),
    h("p.engines", {}, ...(r.engines || []).map((e) => h("span.chip", {}, e)), r.os ? h("span.muted", {}, r.os) : null),
  );
}

/** Links as undirected pairs; `both` when each side reports the other. */
export function links(state) {
  const found = new Map();
  for (const [from, peers] of Object.entries(state.topology || {})) {
    for (const to of peers) {
      if (!(from in state.nodes) || !(to in state.nodes) || from === to) continue;
      const key = [from, to].sort().join(" ");
      found.set(key, { a: [from, to].sort()[0], b: [from, to].sort()[1], both: found.has(key) });
    }
  }
  return [...found.values()];
}

function drawTopology(svg, store) {
  const { state } = store;
  const ids = Object.keys(state.nodes).sort((x, y) => state.nodes[x].joined_index - state.nodes[y].joined_index);
  const width = 360;
  const height = 240;
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const radius = ids.length > 1 ? 80 : 0;
  const place = new Map(
    ids.map((id, i) => {
      const angle = -Math.PI / 2 + (2 * Math.PI * i) / Math.max(1, ids.length);
      return [id, { x: width / 2 + radius * Math.cos(angle), y: height / 2 + radius * Math.sin(angle) }];
    }),
  );
  svg.replaceChildren();
  const el = (name, attrs, text) => {
    const node = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    svg.append(node);
    return node;
  };
  for (const link of links(state)) {
    const a = place.get(link.a);
    const b = place.get(link.b);
    el("line", { x1: a.x, y1: a.y, x2: b.x, y2: b.y, class: link.both ? "link" : "link one-way" });
  }
  for (const id of ids) {
    const { x, y } = place.get(id);
    const master = state.master?.node_id === id;
    el("circle", { cx: x, cy: y, r: 22, class: master ? "vertex master" : "vertex" });
    el("text", { x, y: y + 5, class: "vertex-initial", "text-anchor": "middle" }, String(ids.indexOf(id) + 1));
    el("text", { x, y: y + 40, class: "vertex-label", "text-anchor": "middle" }, nodeName(state, id));
    if (master) el("title", {}, "master");
  }
  if (!ids.length) el("text", { x: width / 2, y: height / 2, class: "vertex-label", "text-anchor": "middle" }, "no nodes yet");
  svg.setAttribute("aria-label", `${ids.length} nodes, ${links(state).length} links`);
}

async function deleteInstance(instanceId, button) {
  button.disabled = true;
  const response = await request(`/instance/${encodeURIComponent(instanceId)}`, { method: "DELETE" });
  if (!response.ok) {
    toast(`Could not delete the instance: ${await errorText(response)}`, "error");
    button.disabled = false;
  }
}

/** While a runner waits for its weights: how far the download on that node is. */
function downloadNote(state, nodeId, modelId, status) {
  const progress = state.downloads?.[nodeId]?.[modelId];
  if (status !== "downloading" || !progress || progress.total_bytes <= 0) return null;
  return h("span.muted.small", {}, ` ${Math.floor((100 * progress.downloaded_bytes) / progress.total_bytes)}%`);
}

// Every node of an instance computes on its prompts (rank 0 gets the text, the others its
// tokens or activations): the operator sees who can read what is sent to this model.
function promptsLine(state, instance) {
  const names = [...new Set(instance.shards.map((s) => nodeName(state, s.node_id)))];
  const pinned = instance.nodes?.length ? ` (pinned to ${instance.nodes.map((n) => nodeName(state, n)).join(", ")})` : "";
  return h("p.prompts", { dataset: { nodes: instance.shards.map((s) => s.node_id).join(" ") } }, `Prompts go to ${names.join(", ")}${pinned}`);
}

function instanceCard(state, instance) {
  const tasks = Object.values(state.tasks || {}).filter((t) => t.instance_id === instance.instance_id);
  const remove = h("button.small.danger", { type: "button", "aria-label": `Delete instance of ${instance.model_id}` }, "Delete");
  remove.addEventListener("click", () => deleteInstance(instance.instance_id, remove));
  const ready = isReady(state, instance);
  return h(
    "article.instance",
    { dataset: { instanceId: instance.instance_id, ready: String(ready) } },
    h(
      "header",
      {},
      h("h3", {}, instance.model_id),
      h("span.badge", {}, instance.sharding),
      ready ? h("span.badge.status-ready", {}, "ready") : null,
      tasks.length ? h("span.badge.status-running", {}, `${tasks.length} running`) : null,
      h("span.spacer"),
      remove,
    ),
    promptsLine(state, instance),
    h(
      "table.runners",
      {},
      h("thead", {}, h("tr", {}, h("th", {}, "Node"), h("th", {}, "Rank"), h("th", {}, "Layers"), h("th", {}, "Status"))),
      h(
        "tbody",
        {},
        instance.shards.map((shard) => {
          const runner = state.runners[shard.runner_id];
          const status = runner ? runner.status : "pending";
          return h(
            "tr",
            { dataset: { runnerId: shard.runner_id, status } },
            h("td", {}, nodeName(state, shard.node_id)),
            h("td", {}, `${shard.rank} / ${shard.world_size}`),
            h("td", {}, `${shard.start_layer}–${shard.end_layer}`),
            h("td", {}, statusBadge(status), downloadNote(state, shard.node_id, instance.model_id, status), runner?.error ? h("div.error-text", {}, runner.error) : null),
          );
        }),
      ),
    ),
  );
}

async function deleteDownload(nodeId, modelId, button) {
  if (!confirm(`Delete ${modelId} from ${nodeId}?`)) return;
  button.disabled = true;
  const response = await request(`/download/${encodeURIComponent(nodeId)}/${modelId}`, { method: "DELETE" });
  if (!response.ok) {
    toast(`Could not delete: ${await errorText(response)}`, "error");
    button.disabled = false;
  } else {
    toast(`Deleted ${modelId}`);
  }
}

export function downloadRow(state, nodeId, progress) {
  const fraction =
    progress.status === "completed" ? 1 : progress.total_bytes > 0 ? progress.downloaded_bytes / progress.total_bytes : 0;
  const inUse = Object.values(state.instances).some(
    (i) => i.model_id === progress.model_id && i.shards.some((s) => s.node_id === nodeId),
  );
  let detail;
  if (progress.status === "ongoing" || progress.status === "pending") {
    detail = `${formatBytes(progress.downloaded_bytes)} of ${formatBytes(progress.total_bytes)} · ${formatBytes(
      progress.speed_bytes_per_s,
    )}/s · ETA ${formatDuration(progress.eta_s)}`;
  } else if (progress.status === "failed") {
    detail = progress.error || "failed";
  } else {
    detail = `${formatBytes(progress.total_bytes || progress.downloaded_bytes)}${progress.read_only ? " · read-only" : ""}`;
  }
  let action = null;
  if (progress.status === "completed" && !progress.read_only && !inUse) {
    action = h("button.small.danger", { type: "button", "aria-label": `Delete ${progress.model_id} on ${nodeName(state, nodeId)}` }, "Delete");
    action.addEventListener("click", () => deleteDownload(nodeId, progress.model_id, action));
  }
  return h(
    "div.download",
    { dataset: { nodeId, modelId: progress.model_id, status: progress.status } },
    h("div.download-head", {}, h("strong", {}, progress.model_id), h("span.muted", {}, ` on ${nodeName(state, nodeId)}`), h("span.spacer"), statusBadge(progress.status === "ongoing" ? "downloading" : progress.status), action),
    progress.status === "completed" ? null : progressBar(fraction, `download of ${progress.model_id}`),
    h(progress.status === "failed" ? "p.error-text" : "p.muted.small", {}, detail),
  );
}

export function renderCluster(store) {
  const { state } = store;
  const nodes = Object.values(state.nodes).sort((a, b) => a.joined_index - b.joined_index);
  const instances = Object.values(state.instances);
  render(
    document.getElementById("cluster-summary"),
    `${nodes.length} node${nodes.length === 1 ? "" : "s"}`,
    state.master ? ` · master ${nodeName(state, state.master.node_id)} (term ${state.master.term})` : " · no master yet",
    ` · ${instances.length} instance${instances.length === 1 ? "" : "s"}`,
  );
  render(document.getElementById("nodes"), nodes.map((node, i) => nodeCard(store, node, i + 1)));
  drawTopology(document.getElementById("topology"), store);
  render(
    document.getElementById("instances"),
    instances.length ? instances.map((i) => instanceCard(state, i)) : h("p.muted", {}, "No model is running. Launch one from Models, or just start a chat."),
  );
  const rows = Object.entries(state.downloads || {}).flatMap(([nodeId, perModel]) =>
    Object.values(perModel).map((progress) => downloadRow(state, nodeId, progress)),
  );
  render(document.getElementById("downloads"), rows.length ? rows : h("p.muted", {}, "Nothing downloaded yet."));
}
