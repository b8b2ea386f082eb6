// Images attached to the next chat message (for vision models): read into data URLs in the
// browser, checked against the node's default limits before anything is sent (the node checks
// again and answers a 400 with words). Shown as thumbnails with a remove button.

import { h, render } from "./dom.js";

export const MAX_IMAGES = 8; // EXO_MAX_IMAGES_PER_REQUEST's default
export const MAX_BYTES = 20 * 1024 * 1024; // EXO_MAX_IMAGE_BYTES's default
const TYPES = new Set(["image/png", "image/jpeg", "image/gif", "image/webp", "image/bmp"]);

let pending = []; // [{name, url}]
let enabled = false;

/** The data URLs of the attached images, in order. */
export function attachedImages() {
  return pending.map((p) => p.url);
}

export function clearAttachments() {
  pending = [];
  note("");
  renderAttachments();
}

function note(text) {
  const out = document.getElementById("attach-note");
  if (out) out.textContent = text;
}

function readAsDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result));
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

/** Adds image files (a file input's, a drop's or a paste's); says in words what was refused. */
export async function attachFiles(files) {
  const refused = [];
  for (const file of files) {
    if (!TYPES.has(file.type)) refused.push(`${file.name}: not a PNG, JPEG, GIF, WebP or BMP image`);
    else if (file.size > MAX_BYTES) refused.push(`${file.name}: larger than ${MAX_BYTES / 1024 / 1024} MB`);
    else if (pending.length >= MAX_IMAGES) refused.push(`${file.name}: at most ${MAX_IMAGES} images a message`);
    else pending.push({ name: file.name, url: await readAsDataUrl(file) });
  }
  note(refused.join("; "));
  renderAttachments();
}

export function renderAttachments() {
  const box = document.getElementById("attachments");
  if (!box) return;
  box.hidden = pending.length === 0;
  render(
    box,
    pending.map((p, i) =>
      h(
        "figure.attachment",
        {},
        h("img", { src: p.url, alt: `attached image ${p.name}` }),
        h("button.icon", { type: "button", "aria-label": `Remove image ${p.name}`, title: "Remove", onclick: () => removeAt(i) }, "×"),
      ),
    ),
  );
}

function removeAt(index) {
  pending.splice(index, 1);
  renderAttachments();
}

/** Whether the chosen model reads images: the attach button is offered only then. */
export function setAttachable(card) {
  enabled = Boolean(card && (card.capabilities || []).includes("vision"));
  const button = document.getElementById("attach-button");
  if (!button) return;
  button.disabled = !enabled;
  button.title = enabled ? "Attach images" : "This model does not read images";
  if (!enabled && pending.length) clearAttachments();
}

export function setupAttachments() {
  const input = document.getElementById("attach");
  document.getElementById("attach-button").addEventListener("click", () => input.click());
  input.addEventListener("change", async () => {
    await attachFiles([...input.files]);
    input.value = "";
  });
  document.getElementById("prompt").addEventListener("paste", (event) => {
    const files = [...(event.clipboardData?.files || [])].filter((f) => f.type.startsWith("image/"));
    if (files.length && enabled) {
      event.preventDefault();
      attachFiles(files);
    }
  });
  renderAttachments();
}
