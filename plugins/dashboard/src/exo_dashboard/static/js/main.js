// Wires the page: views by URL hash, the API key prompt, the connection banner, and the
// store's updates to each view.

import { allowKeyPrompt, setKeyPrompt } from "./api.js";
import { renderModelPicker, setupChat, startFromQuery } from "./chat.js";
import { renderCluster } from "./cluster.js";
import { h, render } from "./dom.js";
import { readyImageModels, renderImagePicker, setupImages } from "./images.js";
import { loadModels, renderList, setupModels } from "./models.js";
import { store } from "./store.js";

const VIEWS = ["cluster", "models", "chat", "images"];

function showView() {
  let view = location.hash.slice(1);
  const imagesTab = document.querySelector('.tabs [data-view="images"]');
  if (!VIEWS.includes(view) || (view === "images" && imagesTab.hidden)) view = "cluster";
  for (const section of document.querySelectorAll("main > .view")) section.hidden = section.dataset.view !== view;
  for (const tab of document.querySelectorAll(".tabs a")) {
    if (tab.dataset.view === view) tab.setAttribute("aria-current", "page");
    else tab.removeAttribute("aria-current");
  }
  document.title = `exo · ${view}`;
  if (view === "models") loadModels();
  if (view === "chat") document.getElementById("prompt").focus({ preventScroll: true });
}

function askForKey() {
  const dialog = document.getElementById("key-dialog");
  const input = document.getElementById("key-input");
  return new Promise((resolve) => {
    const form = document.getElementById("key-form");
    const done = (event) => {
      event.preventDefault();
      form.removeEventListener("submit", done);
      dialog.close();
      resolve(input.value.trim() || null);
    };
    form.addEventListener("submit", done);
    dialog.addEventListener("cancel", () => resolve(null), { once: true });
    input.value = "";
    dialog.showModal();
  });
}

function renderConnection() {
  const conn = document.getElementById("conn");
  const banner = document.getElementById("banner");
  const text = conn.querySelector(".conn-text");
  const state = store.needsKey ? "locked" : store.reachable === null ? "connecting" : store.reachable ? "up" : "down";
  conn.dataset.state = state;
  text.textContent = { locked: "API key needed", connecting: "connecting", up: "live", down: "unreachable" }[state];
  banner.hidden = state !== "down" && state !== "locked";
  if (state === "down") {
    render(banner, `Cannot reach this exo node (${store.error}). Retrying…`);
  } else if (state === "locked") {
    const enter = h("button.small", { type: "button" }, "Enter API key");
    enter.addEventListener("click", allowKeyPrompt);
    render(banner, `This node needs an API key (${store.error}). `, enter);
  }
}

function renderAll() {
  renderConnection();
  if (!store.state) return;
  renderCluster(store);
  renderList();
  renderModelPicker();
  renderImagePicker();
  const imagesTab = document.querySelector('.tabs [data-view="images"]');
  const hasImages = readyImageModels(store.state).length > 0;
  if (imagesTab.hidden === hasImages) {
    imagesTab.hidden = !hasImages;
    if (!hasImages && location.hash === "#images") showView();
  }
}

async function main() {
  setKeyPrompt(askForKey);
  setupModels();
  setupChat();
  setupImages();
  window.addEventListener("hashchange", showView);
  const params = new URLSearchParams(location.search);
  const query = params.get("q");
  if (query) {
    history.replaceState(null, "", `${location.pathname}#chat`);
  }
  showView();
  store.subscribe(renderAll);
  let modelsLoaded = null;
  store.subscribe(() => {
    // Cards come from /models once the node answers (and again when they change).
    if (store.reachable && !modelsLoaded) modelsLoaded = loadModels();
    if (!store.reachable) modelsLoaded = null;
  });
  store.onEvent((indexed) => {
    if (indexed.event.type === "DownloadProgressed" && indexed.event.progress.status === "completed") renderList();
  });
  // Paints a node's "not reporting" badge even when no event comes.
  setInterval(() => store.state && renderCluster(store), 5000);
  store.run();
  if (query) {
    await new Promise((resolve) => {
      const unsubscribe = store.subscribe(() => {
        if (store.reachable && modelsLoaded) {
          unsubscribe();
          resolve();
        }
      });
    });
    await modelsLoaded;
    renderModelPicker();
    startFromQuery(query);
  }
}

main();
