// The cluster state as the node sees it: one GET /state, then every event from /events applied
// in order (the same rules as exo_core/reducer.py); a `snapshot` message replaces the state. An event this page does not know, or a gap
// in the indexes, makes it fetch the state again. When the node cannot be reached the store
// says so (`reachable`) and keeps retrying; it resynchronises when the node is back.

import { ApiError, getJson, readEvents, request } from "./api.js";

const TERMINAL_TASK = new Set(["complete", "failed", "cancelled"]);
const RETRY_MS = [500, 1000, 2000, 3000];

const without = (map, key) => {
  const copy = { ...map };
  delete copy[key];
  return copy;
};
const filterValues = (map, keep) =>
  Object.fromEntries(Object.entries(map).filter(([, value]) => keep(value)));

/** Changes one event makes to the state, or null when this page does not know the event. */
const HANDLERS = {
  MasterElected: (s, e) => ({ master: { node_id: e.node_id, term: e.term } }),
  NodeTelemetry: (s, e, index) => {
    const old = s.nodes[e.node_id];
    const node = {
      node_id: e.node_id,
      hostname: e.hostname,
      addresses: e.addresses || [],
      resources: e.resources,
      last_seen: Math.max(e.timestamp, old ? old.last_seen : 0),
      joined_index: old ? old.joined_index : index,
    };
    return { nodes: { ...s.nodes, [e.node_id]: node } };
  },
  NodeTimedOut: (s, e) => ({
    nodes: without(s.nodes, e.node_id),
    topology: Object.fromEntries(
      Object.entries(without(s.topology, e.node_id)).map(([n, peers]) => [
        n,
        peers.filter((p) => p !== e.node_id),
      ]),
    ),
    downloads: without(s.downloads, e.node_id),
    runners: filterValues(s.runners, (r) => r.node_id !== e.node_id),
  }),
  TopologyReported: (s, e) => ({ topology: { ...s.topology, [e.node_id]: [...e.peers].sort() } }),
  ModelCardAdded: (s, e) => ({ model_cards: { ...s.model_cards, [e.card.model_id]: e.card } }),
  ModelCardRemoved: (s, e) => ({ model_cards: without(s.model_cards, e.model_id) }),
  DownloadProgressed: (s, e) => {
    const p = e.progress;
    return { downloads: { ...s.downloads, [p.node_id]: { ...(s.downloads[p.node_id] || {}), [p.model_id]: p } } };
  },
  DownloadDeleted: (s, e) => ({
    downloads: { ...s.downloads, [e.node_id]: without(s.downloads[e.node_id] || {}, e.model_id) },
  }),
  InstanceCreated: (s, e) => ({ instances: { ...s.instances, [e.instance.instance_id]: e.instance } }),
  InstanceDeleted: (s, e) => ({
    instances: without(s.instances, e.instance_id),
    runners: filterValues(s.runners, (r) => r.instance_id !== e.instance_id),
    tasks: filterValues(s.tasks, (t) => t.instance_id !== e.instance_id),
  }),
  RunnerStatusChanged: (s, e) =>
    e.runner.instance_id in s.instances ? { runners: { ...s.runners, [e.runner.runner_id]: e.runner } } : {},
  TaskCreated: (s, e) =>
    e.task.instance_id in s.instances ? { tasks: { ...s.tasks, [e.task.task_id]: e.task } } : {},
  TaskStatusChanged: (s, e) => {
    const task = s.tasks[e.task_id];
    if (!task) return {};
    if (TERMINAL_TASK.has(e.status)) return { tasks: without(s.tasks, e.task_id) };
    return { tasks: { ...s.tasks, [e.task_id]: { ...task, status: e.status, error: e.error } } };
  },
};

/** The state after one indexed event, or null when the page must refetch the state. */
export function applyEvent(state, indexed) {
  if (indexed.index !== state.last_index + 1) return null;
  const handler = HANDLERS[indexed.event?.type];
  if (!handler) return null;
  return { ...state, ...handler(state, indexed.event, indexed.index), last_index: indexed.index };
}

class StreamError extends Error {}

export class ClusterStore {
  constructor() {
    this.state = null;
    this.nodeId = null;
    this.reachable = null; // null until the first answer
    this.error = "";
    this.needsKey = false; // the node answers 401: no key, or a wrong one
    this.listeners = new Set();
    this.eventListeners = new Set();
    this.scheduled = false;
  }

  /** Calls fn(store) after every change (at most once a frame). */
  subscribe(fn) {
    this.listeners.add(fn);
    if (this.state) this.notify();
    return () => this.listeners.delete(fn);
  }

  /** Calls fn(indexedEvent) for each live event (to refresh things the state does not hold). */
  onEvent(fn) {
    this.eventListeners.add(fn);
    return () => this.eventListeners.delete(fn);
  }

  notify() {
    if (this.scheduled) return;
    this.scheduled = true;
    requestAnimationFrame(() => {
      this.scheduled = false;
      for (const fn of this.listeners) fn(this);
    });
  }

  setReachable(reachable, error = "") {
    if (this.reachable === reachable && this.error === error) return;
    this.reachable = reachable;
    this.error = error;
    this.notify();
  }

  /** Runs forever: state, then events; after any failure waits a little and starts over. */
  async run() {
    for (let attempt = 0; ; attempt++) {
      try {
        await this.syncOnce();
        attempt = 0;
      } catch (error) {
        const answered = error instanceof ApiError;
        this.needsKey = answered && error.status === 401;
        // A fetch that fails outright is a TypeError; an /events stream that broke says why.
        const detail = answered ? error.detail : error instanceof StreamError ? error.message : "the node does not answer";
        this.setReachable(answered, detail);
      }
      await new Promise((resolve) => setTimeout(resolve, RETRY_MS[Math.min(attempt, RETRY_MS.length - 1)]));
    }
  }

  async syncOnce() {
    const [state, who] = await Promise.all([getJson("/state"), getJson("/node_id")]);
    this.state = state;
    this.nodeId = who.node_id;
    this.needsKey = false;
    this.setReachable(true);
    this.notify();
    const controller = new AbortController();
    const response = await request(`/events?since=${state.last_index + 1}`, {
      signal: controller.signal,
      headers: { Accept: "text/event-stream" },
    });
    if (!response.ok) throw new ApiError(response.status, `events: HTTP ${response.status}`);
    let stale = false;
    let streamError = "";
    const reading = readEvents(
      response,
      (message) => {
        if (stale) return;
        if (message.event === "snapshot") {
          // Events the log has cut come as the state after them.
          const snapshot = JSON.parse(message.data);
          if (snapshot.last_index > this.state.last_index) {
            this.state = snapshot;
            this.notify();
          }
          return;
        }
        if (message.event === "error") {
          // The node cannot serve its log from here on; the stream ends after this.
          streamError = JSON.parse(message.data).error || "the event stream failed";
          return;
        }
        if (message.event !== "event") return;
        const indexed = JSON.parse(message.data);
        if (indexed.index <= this.state.last_index) return;
        const next = applyEvent(this.state, indexed);
        if (next === null) {
          // Unknown event or a gap: start over from a fresh state.
          stale = true;
          controller.abort();
          return;
        }
        this.state = next;
        this.notify();
        for (const fn of this.eventListeners) fn(indexed);
      },
      controller.signal,
    );
    try {
      await reading;
    } catch (error) {
      if (!stale) throw error;
    }
    if (!stale) throw new StreamError(streamError || "the event stream ended");
  }
}

export const store = new ClusterStore();
