// What the views share about the state: node names, model kinds, which instances are ready.

import { shortId } from "./dom.js";

const READY = new Set(["ready", "running"]);

/** A node's name for people: its hostname, with a short id when two nodes share one. */
export function nodeName(state, nodeId) {
  const node = state.nodes[nodeId];
  if (!node) return shortId(nodeId);
  const sameHost = Object.values(state.nodes).filter((n) => n.hostname === node.hostname).length > 1;
  if (!node.hostname) return shortId(nodeId);
  return sameHost ? `${node.hostname} ·${nodeId.slice(-4)}` : node.hostname;
}

/** "image" for cards whose tasks make images, else "text". */
export function modelKind(card) {
  return (card.tasks || []).some((task) => String(task).includes("image")) ? "image" : "text";
}

/** Every runner of the instance is up. */
export function isReady(state, instance) {
  return instance.shards.every((s) => READY.has(state.runners[s.runner_id]?.status));
}

/** Model ids with a ready instance. */
export function readyModels(state) {
  return new Set(Object.values(state.instances).filter((i) => isReady(state, i)).map((i) => i.model_id));
}
