// Small DOM and formatting helpers. Text always goes in as text (textContent), never as HTML.

/** h("div.card", {attrs}, ...children): an element; strings become text nodes. */
export function h(tag, attrs = {}, ...children) {
  const [name, ...classes] = tag.split(".");
  const node = document.createElement(name || "div");
  if (classes.length) node.className = classes.join(" ");
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "text") node.textContent = value;
    else if (value === true) node.setAttribute(key, "");
    else node.setAttribute(key, String(value));
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replaces a container's children; keeps keyboard focus on the element with the same label. */
export function render(container, ...children) {
  const active = document.activeElement;
  const key = active && container.contains(active) ? focusKey(active) : null;
  container.replaceChildren();
  append(container, children);
  if (key) {
    const again = [...container.querySelectorAll("button, a, input, select, textarea, summary")].find((el) => focusKey(el) === key);
    again?.focus();
  }
}

function focusKey(el) {
  const label = el.getAttribute("aria-label") || el.id || el.textContent;
  return label ? `${el.tagName}:${label}` : null;
}

export function formatBytes(bytes) {
  if (!Number.isFinite(bytes) || bytes <= 0) return "0 B";
  const units = ["B", "KB", "MB", "GB", "TB"];
  const i = Math.min(units.length - 1, Math.floor(Math.log(bytes) / Math.log(1024)));
  const value = bytes / 1024 ** i;
  return `${value >= 100 || i === 0 ? value.toFixed(0) : value.toFixed(1)} ${units[i]}`;
}

export function formatDuration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "—";
  if (seconds < 1) return "<1 s";
  if (seconds < 60) return `${Math.round(seconds)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${Math.round(seconds % 60)} s`;
  return `${Math.floor(seconds / 3600)} h ${Math.round((seconds % 3600) / 60)} min`;
}

/** The end of an id: libp2p peer ids all begin alike ("12D3KooW..."), their ends differ. */
export function shortId(id) {
  return id && id.length > 12 ? `…${id.slice(-8)}` : id || "";
}

/** A progress bar (0..1) with an accessible value. */
export function progressBar(fraction, label) {
  const percent = Math.round(Math.max(0, Math.min(1, fraction)) * 100);
  const fill = h("div.bar-fill");
  fill.style.width = `${percent}%`;
  return h(
    "div.bar",
    { role: "progressbar", "aria-valuemin": 0, "aria-valuemax": 100, "aria-valuenow": percent, "aria-label": label },
    fill,
  );
}

/** A short-lived message at the bottom of the screen. */
export function toast(message, kind = "info") {
  let box = document.getElementById("toasts");
  if (!box) {
    box = h("div.toasts", { id: "toasts", role: "status", "aria-live": "polite" });
    document.body.append(box);
  }
  const item = h(`div.toast.${kind}`, {}, message);
  box.append(item);
  setTimeout(() => item.remove(), kind === "error" ? 8000 : 4000);
}
