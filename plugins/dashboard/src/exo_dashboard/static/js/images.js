// The images view: shown only while an image model has a ready instance. It streams
// /v1/images/generations (OpenAI's shape: partial images, then the final one, plus exo's
// `progress` events, step i of N) and shows each picture as it arrives. Steps, seed and
// guidance go in exo's `advanced_params`. With an image to edit (uploaded, or the last result)
// it streams /v1/images/edits instead (a multipart form). Cancel aborts the request.

import { errorText, readEvents, request } from "./api.js";
import { h, render } from "./dom.js";
import { modelKind, readyModels } from "./model.js";
import { modelCards } from "./models.js";
import { store } from "./store.js";

let controller = null;
let source = null; // the image to edit: {name, blob, url}
let lastResult = null; // the last final image, as base64 PNG

/** Image models with a ready instance. */
export function readyImageModels(state) {
  const ready = readyModels(state);
  return modelCards().filter((c) => modelKind(c) === "image" && ready.has(c.model_id)).map((c) => c.model_id);
}

export function renderImagePicker() {
  const select = document.getElementById("image-model");
  if (!store.state) return;
  const models = readyImageModels(store.state);
  const signature = models.join(" ");
  if (select.dataset.signature !== signature) {
    select.dataset.signature = signature;
    const previous = select.value;
    select.replaceChildren(...models.map((id) => h("option", { value: id }, id)));
    if (models.includes(previous)) select.value = previous;
  }
  const input = document.getElementById("image-input");
  input.disabled = !canEdit(selectedCard());
  if (input.disabled && source) setSource(null);
}

function picture(b64, label) {
  return h("img", { src: `data:image/png;base64,${b64}`, alt: label });
}

function selectedCard() {
  const model = document.getElementById("image-model").value;
  return modelCards().find((c) => c.model_id === model);
}

function canEdit(card) {
  return (card?.tasks || []).includes("image_edit");
}

/** exo's options beside OpenAI's: only the ones the person set. */
function advancedParams() {
  const number = (id) => {
    const raw = document.getElementById(id).value;
    return raw === "" || !Number.isFinite(Number(raw)) ? undefined : Number(raw);
  };
  const params = {
    num_inference_steps: number("image-steps") || undefined,
    seed: number("image-seed"),
    guidance: number("image-guidance"),
  };
  return Object.fromEntries(Object.entries(params).filter(([, v]) => v !== undefined));
}

function renderSource() {
  const box = document.getElementById("image-source");
  box.hidden = !source;
  if (!source) return render(box);
  const clear = h("button.small", { type: "button", onclick: () => setSource(null) }, "Generate instead");
  render(box, h("img", { src: source.url, alt: `image to edit ${source.name}` }), h("span.muted", {}, `Editing ${source.name}`), clear);
  document.getElementById("image-go").textContent = "Edit";
}

function setSource(next) {
  if (source?.url.startsWith("blob:")) URL.revokeObjectURL(source.url);
  source = next;
  if (!next) {
    document.getElementById("image-input").value = "";
    document.getElementById("image-go").textContent = "Generate";
  }
  renderSource();
}

function editLastResult() {
  if (!lastResult) return;
  const bytes = Uint8Array.from(atob(lastResult), (c) => c.charCodeAt(0));
  const blob = new Blob([bytes], { type: "image/png" });
  setSource({ name: "the last result", blob, url: `data:image/png;base64,${lastResult}` });
}

function imageRequest(model, prompt) {
  const fields = { model, prompt, size: document.getElementById("image-size").value, n: 1, stream: true, partial_images: 2, advanced_params: advancedParams() };
  if (!source) {
    return ["/v1/images/generations", { headers: { "Content-Type": "application/json", Accept: "text/event-stream" }, body: JSON.stringify(fields) }];
  }
  const form = new FormData();
  for (const [key, value] of Object.entries(fields)) form.append(key, typeof value === "object" ? JSON.stringify(value) : String(value));
  form.append("image", source.blob, source.name.endsWith(".png") ? source.name : "image.png");
  // No Content-Type: the browser writes the multipart boundary.
  return ["/v1/images/edits", { headers: { Accept: "text/event-stream" }, body: form }];
}

async function generate() {
  const status = document.getElementById("image-status");
  const out = document.getElementById("image-out");
  const prompt = document.getElementById("image-prompt").value.trim();
  const model = document.getElementById("image-model").value;
  if (!prompt || !model || controller) return;
  controller = new AbortController();
  const go = document.getElementById("image-go");
  const stopButton = document.getElementById("image-stop");
  go.hidden = true;
  stopButton.hidden = false;
  status.textContent = "Generating…";
  const started = performance.now();
  try {
    const [path, init] = imageRequest(model, prompt);
    const response = await request(path, { method: "POST", ...init, signal: controller.signal });
    if (!response.ok) throw new Error(await errorText(response));
    await readEvents(
      response,
      (message) => {
        if (message.data === "[DONE]") return;
        const event = JSON.parse(message.data);
        if (event.error) throw new Error(event.error.message || "generation failed");
        const kind = String(event.type || message.event);
        if (kind.endsWith("progress")) {
          status.textContent = `Step ${event.step} of ${event.total}…`;
          return;
        }
        if (!event.b64_json) return;
        const final = kind.endsWith("completed");
        const shown = picture(event.b64_json, final ? prompt : `partial image ${event.partial_image_index ?? ""}`);
        if (final) lastResult = event.b64_json;
        const again = final && canEdit(selectedCard()) ? h("button.small", { type: "button", onclick: editLastResult }, "Edit this image") : null;
        render(out, shown, again);
        status.textContent = final
          ? `Done in ${((performance.now() - started) / 1000).toFixed(1)} s`
          : `Partial image ${(event.partial_image_index ?? 0) + 1}…`;
      },
      controller.signal,
    );
    if (controller.signal.aborted) status.textContent = "Cancelled";
  } catch (error) {
    status.textContent = controller.signal.aborted ? "Cancelled" : `Failed: ${error.message || error}`;
  } finally {
    controller = null;
    go.hidden = false;
    stopButton.hidden = true;
  }
}

export function setupImages() {
  document.getElementById("image-form").addEventListener("submit", (event) => {
    event.preventDefault();
    generate();
  });
  document.getElementById("image-stop").addEventListener("click", () => controller?.abort());
  document.getElementById("image-model").addEventListener("change", renderImagePicker);
  document.getElementById("image-input").addEventListener("change", (event) => {
    const file = event.target.files?.[0];
    setSource(file ? { name: file.name, blob: file, url: URL.createObjectURL(file) } : null);
  });
}
