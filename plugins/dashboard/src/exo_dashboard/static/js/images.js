// The images view: shown only while an image model has a ready instance. It streams
// /v1/images/generations (OpenAI's shape: partial images, then the final one, plus exo's
// `progress` events, step i of N) and shows each picture as it arrives. Steps go in exo's
// `advanced_params`. Cancel aborts the request.

import { errorText, readEvents, request } from "./api.js";
import { h, render } from "./dom.js";
import { modelKind, readyModels } from "./model.js";
import { modelCards } from "./models.js";
import { store } from "./store.js";

let controller = null;

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
}

function picture(b64, label) {
  return h("img", { src: `data:image/png;base64,${b64}`, alt: label });
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
    const response = await request("/v1/images/generations", {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
      body: JSON.stringify({
        model,
        prompt,
        size: document.getElementById("image-size").value,
        n: 1,
        stream: true,
        partial_images: 2,
        advanced_params: { num_inference_steps: Number(document.getElementById("image-steps").value) || undefined },
      }),
      signal: controller.signal,
    });
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
        render(out, picture(event.b64_json, final ? prompt : `partial image ${event.partial_image_index ?? ""}`));
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
}
