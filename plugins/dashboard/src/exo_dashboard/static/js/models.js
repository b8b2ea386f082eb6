// The models view: the model picker, hub search, placements for a model, and launching one.

import { ApiError, getJson, sendJson } from "./api.js";
import { formatBytes, h, render, toast } from "./dom.js";
import { modelKind, nodeName, readyModels } from "./model.js";
import { store } from "./store.js";

let cards = [];
let selected = null;
let loading = null;

/** Cards from GET /models; fetched again when the cluster's cards change. */
export function loadModels() {
  loading ??= getJson("/models")
    .then((body) => {
      cards = body.models;
      store.notify();
      if (selected) renderDetail();
    })
    .catch((error) => {
      if (error instanceof ApiError) toast(`Models: ${error.detail}`, "error");
    })
    .finally(() => {
      loading = null;
    });
  return loading;
}

export function modelCards() {
  return cards;
}

function downloadedOn(state, modelId) {
  return Object.entries(state.downloads || {})
    .filter(([, perModel]) => perModel[modelId]?.status === "completed")
    .map(([nodeId]) => nodeName(state, nodeId));
}

export function renderList() {
  const state = store.state;
  const list = document.getElementById("model-list");
  if (!state || !list) return;
  const text = document.getElementById("model-filter").value.trim().toLowerCase();
  const kind = document.getElementById("model-kind").value;
  const ready = readyModels(state);
  const shown = cards
    .filter((c) => (kind === "all" || modelKind(c) === kind) && c.model_id.toLowerCase().includes(text))
    .sort((a, b) => Number(ready.has(b.model_id)) - Number(ready.has(a.model_id)) || a.storage_size_bytes - b.storage_size_bytes);
  render(
    list,
    shown.length
      ? shown.map((card) => {
          const where = downloadedOn(state, card.model_id);
          const button = h(
            "button.model-item",
            { type: "button", "aria-pressed": String(selected === card.model_id), dataset: { modelId: card.model_id }, "aria-label": card.model_id },
            h("span.model-name", {}, card.model_id),
            h(
              "span.model-meta",
              {},
              h(`span.badge.kind-${modelKind(card)}`, {}, modelKind(card)),
              h("span", {}, formatBytes(card.storage_size_bytes)),
              ready.has(card.model_id) ? h("span.badge.status-ready", {}, "running") : null,
              where.length ? h("span.muted", {}, `on ${where.join(", ")}`) : card.source.startsWith("embedded:") ? h("span.muted", {}, "built in") : h("span.muted", {}, "not downloaded"),
            ),
          );
          button.addEventListener("click", () => select(card.model_id));
          return h("li", {}, button);
        })
      : h("li.muted", {}, "No model matches."),
  );
}

function select(modelId) {
  selected = modelId;
  renderList();
  renderDetail();
  // On a phone the details are below the list: bring them into view.
  if (matchMedia("(max-width: 760px)").matches) {
    document.getElementById("model-detail").scrollIntoView({ block: "start" });
  }
}

async function renderDetail() {
  const detail = document.getElementById("model-detail");
  const card = cards.find((c) => c.model_id === selected);
  if (!card) return;
  const state = store.state;
  const previews = h("div.previews", {}, h("p.muted", {}, "Finding placements…"));
  render(
    detail,
    h("h2", {}, card.model_id),
    h(
      "dl.card-facts",
      {},
      h("dt", {}, "Kind"),
      h("dd", {}, modelKind(card) === "image" ? "image generation" : "text generation"),
      h("dt", {}, "Size"),
      h("dd", {}, formatBytes(card.storage_size_bytes), card.quantization !== "none" ? ` · ${card.quantization}` : ""),
      h("dt", {}, "Layers"),
      h("dd", {}, String(card.n_layers), card.supports_tensor ? " · tensor parallel" : ""),
      h("dt", {}, "Abilities"),
      h("dd", {}, (card.capabilities || []).join(", ")),
      h("dt", {}, "Downloaded on"),
      h("dd", {}, downloadedOn(state, card.model_id).join(", ") || "no node yet"),
    ),
    downloadButton(card),
    h("h3", {}, "Where it would run"),
    previews,
  );
  let body;
  try {
    body = await getJson(`/instance/previews?model_id=${encodeURIComponent(card.model_id)}`);
  } catch (error) {
    render(previews, h("p.error-text", {}, error.detail || String(error)));
    return;
  }
  if (selected !== card.model_id) return;
  if (!body.previews.length) {
    render(previews, h("p.error-text.refused", {}, `It does not fit: ${body.refused || "no placement found"}`));
    return;
  }
  render(previews, body.previews.map((preview, i) => previewCard(card, preview, i)));
}

/** A model from the hub not yet on this node can be fetched ahead of launching it. */
function downloadButton(card) {
  const state = store.state;
  const here = state.downloads?.[store.nodeId]?.[card.model_id];
  if (!card.source.startsWith("hf:") || (here && here.status !== "failed")) return null;
  const button = h("button", { type: "button" }, "Download to this node");
  button.addEventListener("click", async () => {
    button.disabled = true;
    const path = card.model_id.split("/").map(encodeURIComponent).join("/");
    try {
      await sendJson("POST", `/download/${path}`);
      toast(`Downloading ${card.model_id}`);
      location.hash = "#cluster";
    } catch (error) {
      button.disabled = false;
      toast(`Could not download: ${error.detail || error}`, "error");
    }
  });
  return h("p", {}, button);
}

function previewCard(card, preview, index) {
  const state = store.state;
  const launch = h(
    "button.primary",
    { type: "button", "aria-label": `Launch ${card.model_id} on ${preview.nodes.length} node${preview.nodes.length > 1 ? "s" : ""} (${preview.sharding}, option ${index + 1})` },
    "Launch",
  );
  launch.addEventListener("click", async () => {
    launch.disabled = true;
    try {
      const body = await sendJson("POST", "/instance", {
        model_id: card.model_id,
        sharding: preview.sharding,
        min_nodes: preview.nodes.length,
      });
      toast(`Launching ${body.model_id}`);
      location.hash = "#cluster";
    } catch (error) {
      toast(`Could not launch: ${error.detail || error}`, "error");
    } finally {
      launch.disabled = false;
    }
  });
  return h(
    "div.preview",
    { dataset: { sharding: preview.sharding } },
    h("div.preview-head", {}, h("strong", {}, `${preview.nodes.length} node${preview.nodes.length > 1 ? "s" : ""} · ${preview.sharding}`), h("span.spacer"), launch),
    h(
      "table",
      {},
      h("thead", {}, h("tr", {}, h("th", {}, "Node"), h("th", {}, "Layers"), h("th", {}, "Memory"))),
      h(
        "tbody",
        {},
        preview.nodes.map((n) =>
          h("tr", {}, h("td", {}, nodeName(state, n.node_id)), h("td", {}, `${n.start_layer}–${n.end_layer}`), h("td", {}, formatBytes(n.memory_bytes))),
        ),
      ),
    ),
  );
}

async function searchHub(query) {
  const results = document.getElementById("hub-results");
  render(results, h("li.muted", {}, "Searching…"));
  try {
    const body = await getJson(`/models/search?query=${encodeURIComponent(query)}&limit=20`);
    render(
      results,
      body.models.length
        ? body.models.map((m) => {
            const add = h("button.small", { type: "button", disabled: m.added, "aria-label": `Add ${m.model_id}` }, m.added ? "Added" : "Add");
            add.addEventListener("click", () => addModel(m.model_id, add));
            return h(
              "li",
              {},
              h("span.model-name", {}, m.model_id),
              h("span.muted", {}, ` ${m.downloads ?? 0} downloads`, m.pipeline_tag ? ` · ${m.pipeline_tag}` : ""),
              add,
            );
          })
        : h("li.muted", {}, "Nothing found."),
    );
  } catch (error) {
    render(results, h("li.error-text", {}, error.status === 404 ? "This node has no hub plugin." : error.detail || String(error)));
  }
}

async function addModel(modelId, button) {
  button.disabled = true;
  try {
    await sendJson("POST", "/models/add", { model_id: modelId });
    button.textContent = "Added";
    toast(`Added ${modelId}`);
    await loadModels();
    select(modelId);
  } catch (error) {
    button.disabled = false;
    toast(`Could not add ${modelId}: ${error.detail || error}`, "error");
  }
}

export function setupModels() {
  document.getElementById("model-filter").addEventListener("input", renderList);
  document.getElementById("model-kind").addEventListener("change", renderList);
  document.getElementById("hub-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const query = document.getElementById("hub-query").value.trim();
    if (query) searchHub(query);
  });
  store.onEvent((indexed) => {
    if (indexed.event.type === "ModelCardAdded" || indexed.event.type === "ModelCardRemoved") loadModels();
  });
}
