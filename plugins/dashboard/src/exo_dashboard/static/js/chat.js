// The chat view: streaming chat completions (OpenAI endpoint) with conversations kept in this
// browser's localStorage. Stop aborts the request; the node cancels a generation whose client
// went away.

import { errorText, readEvents, request } from "./api.js";
import { attachedImages, clearAttachments, setAttachable, setupAttachments } from "./attachments.js";
import { h, render } from "./dom.js";
import { renderMarkdown } from "./markdown.js";
import { modelKind, readyModels } from "./model.js";
import { modelCards } from "./models.js";
import { store } from "./store.js";

const STORAGE = "exo.conversations";
const MAX_CONVERSATIONS = 100;
const DEFAULT_MODEL = "SmolLM2-135M-Instruct";
const MAX_TOKENS_STORAGE = "exo.chatMaxTokens";

let conversations = loadConversations();
let currentId = conversations[0]?.id ?? null;
let running = null; // {controller, conversationId}

function loadConversations() {
  try {
    const stored = JSON.parse(localStorage.getItem(STORAGE) || "[]");
    return Array.isArray(stored) ? stored.filter((c) => c && Array.isArray(c.messages)) : [];
  } catch {
    return [];
  }
}

function save() {
  conversations.sort((a, b) => b.updated - a.updated);
  conversations = conversations.slice(0, MAX_CONVERSATIONS);
  try {
    localStorage.setItem(STORAGE, JSON.stringify(conversations));
  } catch {
    // Storage full: the conversation still works, it just is not kept.
  }
}

function current() {
  return conversations.find((c) => c.id === currentId) ?? null;
}

function newConversation() {
  const conversation = { id: crypto.randomUUID(), title: "New chat", model: "", messages: [], updated: Date.now() };
  conversations.unshift(conversation);
  currentId = conversation.id;
  save();
  return conversation;
}

// -- rendering --------------------------------------------------------------------------------

function renderConversations() {
  render(
    document.getElementById("conversation-list"),
    conversations.map((c) => {
      const open = h("button.conversation", { type: "button", "aria-current": c.id === currentId ? "true" : null, "aria-label": `Open chat ${c.title}` }, c.title);
      open.addEventListener("click", () => {
        currentId = c.id;
        renderConversations();
        renderMessages();
      });
      const remove = h("button.icon", { type: "button", "aria-label": `Delete chat ${c.title}`, title: "Delete" }, "×");
      remove.addEventListener("click", () => {
        if (running?.conversationId === c.id) running.controller.abort();
        conversations = conversations.filter((x) => x.id !== c.id);
        if (currentId === c.id) currentId = conversations[0]?.id ?? null;
        save();
        renderConversations();
        renderMessages();
      });
      return h("li", {}, open, remove);
    }),
  );
}

function statsLine(stats) {
  if (!stats) return null;
  const parts = [];
  if (stats.prompt_tokens !== undefined) parts.push(`${stats.prompt_tokens} in`);
  if (stats.completion_tokens !== undefined) parts.push(`${stats.completion_tokens} out`);
  if (stats.tokens_per_s) parts.push(`${stats.tokens_per_s.toFixed(1)} tok/s`);
  if (stats.ttft_s !== undefined) parts.push(`first token ${stats.ttft_s.toFixed(2)} s`);
  if (stats.stopped) parts.push("stopped");
  return h("div.stats-line", {}, parts.join(" · "));
}

// Rendered messages by identity: while a reply streams, only that reply is rendered again.
const rendered = new WeakMap();

function messageView(message) {
  const key = JSON.stringify([message.content, message.images?.length, message.reasoning, message.error, message.stats, message.streaming, message.prefill]);
  const cached = rendered.get(message);
  if (cached?.key === key) return cached.node;
  const node = buildMessage(message);
  rendered.set(message, { key, node });
  return node;
}

function buildMessage(message) {
  if (message.role === "user") {
    const images = message.images || [];
    const thumbs = images.length ? h("div.thumbs", {}, images.map((url, i) => h("img", { src: url, alt: `image ${i + 1}` }))) : null;
    return h("div.message.user", {}, h("div.bubble", {}, thumbs, message.content));
  }
  const body = h("div.markdown", {}, renderMarkdown(message.content || ""));
  return h(
    "div.message.assistant",
    { dataset: { streaming: String(Boolean(message.streaming)) } },
    message.reasoning
      ? h("details.thinking", {}, h("summary", {}, message.streaming && !message.content ? "Thinking…" : "Thought"), h("div.thinking-text", {}, message.reasoning))
      : null,
    body,
    message.error ? h("p.error-text", {}, message.error) : null,
    message.streaming && message.prefill && !message.content && !message.reasoning ? prefillView(message.prefill) : null,
    message.streaming && !message.prefill && !message.content && !message.reasoning ? h("div.typing", { "aria-label": "waiting for the reply" }, h("span"), h("span"), h("span")) : null,
    statsLine(message.stats),
  );
}

/** A long prompt being read (prefilled) before the first token: how far the runner got. */
function prefillView({ done, total }) {
  return h(
    "div.prefill",
    {},
    h("progress", { max: String(total), value: String(done), "aria-label": "prompt read so far" }),
    h("span.muted", {}, `Reading the prompt: ${done} / ${total} tokens`),
  );
}

function renderMessages() {
  const box = document.getElementById("messages");
  const conversation = current();
  if (!conversation || !conversation.messages.length) {
    render(box, h("div.empty-chat", {}, h("h2", {}, "Ask anything"), h("p.muted", {}, "Replies stream from the model you pick above; chats stay in this browser.")));
  } else {
    const nearBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
    render(box, conversation.messages.map(messageView));
    if (nearBottom || running) box.scrollTop = box.scrollHeight;
  }
  const busy = Boolean(running);
  document.getElementById("send").hidden = busy;
  document.getElementById("stop").hidden = !busy;
  if (conversation?.model) document.getElementById("chat-model").value = conversation.model;
}

/** The model picker: ready text models first, then every other text model (placed on first use). */
export function renderModelPicker() {
  const select = document.getElementById("chat-model");
  const state = store.state;
  if (!select || !state) return;
  const ready = readyModels(state);
  const text = modelCards().filter((c) => modelKind(c) === "text");
  const ids = new Set(text.map((c) => c.model_id));
  for (const id of ready) ids.add(id);
  const readyIds = [...ids].filter((id) => ready.has(id)).sort();
  const others = [...ids].filter((id) => !ready.has(id)).sort();
  const previous = select.value || current()?.model || "";
  const options = [];
  if (readyIds.length) options.push(h("optgroup", { label: "Running" }, readyIds.map((id) => h("option", { value: id }, id))));
  if (others.length) options.push(h("optgroup", { label: "Starts on first message" }, others.map((id) => h("option", { value: id }, id))));
  const signature = JSON.stringify([readyIds, others]);
  if (select.dataset.signature !== signature) {
    select.dataset.signature = signature;
    select.replaceChildren(...options);
  }
  const fallback = readyIds[0] ?? (ids.has(DEFAULT_MODEL) ? DEFAULT_MODEL : others[0]) ?? "";
  select.value = ids.has(previous) ? previous : fallback;
  setAttachable(modelCards().find((c) => c.model_id === select.value));
  document.getElementById("chat-model-note").textContent = ready.has(select.value)
    ? "ready"
    : select.value
      ? "not running yet: the first message launches it (this can take a while)"
      : "no text model";
}

// -- sending ----------------------------------------------------------------------------------

/** Sends `text` in the current conversation (a new one when there is none) and streams the reply. */
export async function send(text) {
  text = text.trim();
  const images = attachedImages();
  if ((!text && !images.length) || running) return;
  const model = document.getElementById("chat-model").value || DEFAULT_MODEL;
  const conversation = current() ?? newConversation();
  if (!conversation.messages.length) conversation.title = text.slice(0, 60) || "Image";
  conversation.model = model;
  conversation.messages.push(images.length ? { role: "user", content: text, images } : { role: "user", content: text });
  clearAttachments();
  const reply = { role: "assistant", content: "", reasoning: "", streaming: true };
  conversation.messages.push(reply);
  conversation.updated = Date.now();
  const controller = new AbortController();
  running = { controller, conversationId: conversation.id };
  save();
  renderConversations();
  renderMessages();

  const history = conversation.messages.slice(0, -1).filter((m) => !m.error).map(apiMessage);
  const started = performance.now();
  let firstToken = null;
  let frame = 0;
  const redraw = () => {
    if (frame) return;
    frame = requestAnimationFrame(() => {
      frame = 0;
      if (currentId === conversation.id) renderMessages();
    });
  };
  try {
    const response = await request("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
      body: JSON.stringify({
        model,
        messages: history,
        stream: true,
        stream_options: { include_usage: true },
        ...(maxTokens() ? { max_tokens: maxTokens() } : {}),
      }),
      signal: controller.signal,
    });
    if (!response.ok) throw new Error(await errorText(response));
    reply.id = response.headers.get("x-request-id") || null;
    await readEvents(
      response,
      (message) => {
        if (message.data === "[DONE]") return;
        const chunk = JSON.parse(message.data);
        if (chunk.error) throw new Error(chunk.error.message || "generation failed");
        reply.id ??= chunk.id;
        const delta = chunk.choices?.[0]?.delta;
        if (delta?.content || delta?.reasoning_content) {
          firstToken ??= performance.now();
          delete reply.prefill;
        }
        if (delta?.content) reply.content += delta.content;
        if (delta?.reasoning_content) reply.reasoning += delta.reasoning_content;
        if (chunk.usage) reply.stats = usageStats(chunk.usage, started, firstToken);
        redraw();
      },
      controller.signal,
      (comment) => {
        const progress = /^prefill (\d+)\/(\d+)$/.exec(comment);
        if (!progress || firstToken) return;
        reply.prefill = { done: Number(progress[1]), total: Number(progress[2]) };
        redraw();
      },
    );
  } catch (error) {
    if (!controller.signal.aborted) {
      reply.error = String(error.message || error);
      controller.abort();
    }
  } finally {
    // Stopped: the stream ends early (abort cancels the reader) or the fetch rejects.
    if (controller.signal.aborted && !reply.error) reply.stats = { ...(reply.stats || {}), stopped: true };
    reply.streaming = false;
    delete reply.prefill;
    if (!reply.stats?.completion_tokens && firstToken) {
      reply.stats = { ...(reply.stats || {}), ttft_s: (firstToken - started) / 1000 };
    }
    running = null;
    conversation.updated = Date.now();
    save();
    renderConversations();
    renderMessages();
  }
}

/** A kept message as OpenAI's chat format has it: images as `image_url` parts before the text. */
function apiMessage(m) {
  if (!m.images?.length) return { role: m.role, content: m.content };
  const parts = m.images.map((url) => ({ type: "image_url", image_url: { url } }));
  return { role: m.role, content: [...parts, ...(m.content ? [{ type: "text", text: m.content }] : [])] };
}

function usageStats(usage, started, firstToken) {
  const now = performance.now();
  const generating = firstToken ? (now - firstToken) / 1000 : 0;
  return {
    prompt_tokens: usage.prompt_tokens,
    completion_tokens: usage.completion_tokens,
    tokens_per_s: generating > 0 && usage.completion_tokens > 1 ? (usage.completion_tokens - 1) / generating : 0,
    ttft_s: firstToken ? (firstToken - started) / 1000 : undefined,
  };
}

function maxTokens() {
  const value = Number(document.getElementById("chat-max-tokens").value);
  return Number.isInteger(value) && value > 0 ? value : null;
}

export function stop() {
  running?.controller.abort();
}

export function setupChat() {
  const prompt = document.getElementById("prompt");
  const form = document.getElementById("composer");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (running) return; // a reply still streams: what was typed waits in the box, not lost
    const text = prompt.value;
    prompt.value = "";
    send(text);
  });
  prompt.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
  document.getElementById("stop").addEventListener("click", stop);
  setupAttachments();
  const limit = document.getElementById("chat-max-tokens");
  limit.value = localStorage.getItem(MAX_TOKENS_STORAGE) || "";
  limit.addEventListener("change", () => localStorage.setItem(MAX_TOKENS_STORAGE, limit.value));
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && running) stop();
  });
  document.getElementById("new-chat").addEventListener("click", () => {
    newConversation();
    renderConversations();
    renderMessages();
    prompt.focus();
  });
  document.getElementById("chat-model").addEventListener("change", (event) => {
    const conversation = current();
    if (conversation) {
      conversation.model = event.target.value;
      save();
    }
    renderModelPicker();
  });
  renderConversations();
  renderMessages();
}

/** `?q=...`: a new chat that sends the text at once (browsers' custom search engines use it). */
export function startFromQuery(text) {
  newConversation();
  renderConversations();
  renderMessages();
  send(text);
}
