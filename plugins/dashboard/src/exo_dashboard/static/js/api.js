// Every request of the page goes through here: same origin only, with the API key (if one is
// saved) as a Bearer token. A 401 asks the person for the key and retries once.

const KEY_STORAGE = "exo.apiKey";

export class ApiError extends Error {
  constructor(status, detail) {
    super(detail || `HTTP ${status}`);
    this.status = status;
    this.detail = detail || `HTTP ${status}`;
  }
}

let askForKey = async () => null;

/** The dialog that asks for the key; set by main.js. Resolves to the key or null. */
export function setKeyPrompt(prompt) {
  askForKey = prompt;
}

export function apiKey() {
  return localStorage.getItem(KEY_STORAGE) || "";
}

export function saveApiKey(key) {
  if (key) localStorage.setItem(KEY_STORAGE, key);
  else localStorage.removeItem(KEY_STORAGE);
}

function withAuth(init = {}) {
  const headers = new Headers(init.headers || {});
  const key = apiKey();
  if (key) headers.set("Authorization", `Bearer ${key}`);
  return { ...init, headers };
}

let pendingKey = null;
// Set when the person closed the key dialog: no more asking until they choose to (keyPrompt()).
let declined = false;

/** Lets the next 401 ask for the key again (the banner's "Enter API key" button). */
export function allowKeyPrompt() {
  declined = false;
}

/** fetch() on this node; on 401 asks for the key once (shared by concurrent callers). */
export async function request(path, init = {}) {
  let response = await fetch(path, withAuth(init));
  if (response.status === 401 && !declined) {
    pendingKey ??= askForKey().finally(() => {
      pendingKey = null;
    });
    const key = await pendingKey;
    if (key) {
      saveApiKey(key);
      response = await fetch(path, withAuth(init));
    } else {
      declined = true;
    }
  }
  return response;
}

/** The error text of any of the API's error shapes (native, OpenAI, Anthropic, Ollama). */
export async function errorText(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    return `HTTP ${response.status}`;
  }
  const detail =
    body?.detail ?? body?.error?.message ?? body?.error ?? body?.message ?? `HTTP ${response.status}`;
  return typeof detail === "string" ? detail : JSON.stringify(detail);
}

/** JSON from the API, or an ApiError with the server's own words. */
export async function getJson(path, init = {}) {
  const response = await request(path, init);
  if (!response.ok) throw new ApiError(response.status, await errorText(response));
  return response.json();
}

export function sendJson(method, path, body, init = {}) {
  return getJson(path, {
    ...init,
    method,
    headers: { "Content-Type": "application/json", ...(init.headers || {}) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
}

/**
 * Server-sent events read with fetch (EventSource cannot send the key): calls onEvent with
 * {event, data, id} for each message until the stream ends or `signal` aborts, and onComment
 * (when given) with the text of each comment line (a long prompt's `prefill N/M`, say).
 */
export async function readEvents(response, onEvent, signal, onComment = null) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  const abort = () => reader.cancel().catch(() => {});
  signal?.addEventListener("abort", abort, { once: true });
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
        if (onComment) for (const line of block.split(/\r?\n/)) if (line.startsWith(":")) onComment(line.slice(1).trim());
        const message = parseBlock(block);
        if (message) onEvent(message);
      }
    }
  } finally {
    signal?.removeEventListener("abort", abort);
  }
}

function parseBlock(block) {
  const message = { event: "message", data: "", id: null };
  const data = [];
  for (const line of block.split(/\r?\n/)) {
    if (!line || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "data") data.push(value);
    else if (field === "event") message.event = value;
    else if (field === "id") message.id = value;
  }
  if (!data.length) return null;
  message.data = data.join("\n");
  return message;
}
