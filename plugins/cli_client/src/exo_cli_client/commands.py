"""The client commands. Each takes the parsed arguments, a client and an output, and returns
the exit status (see `client.EXIT_*`)."""

from __future__ import annotations

import argparse
from typing import Any

from exo_cli_client.client import EXIT_OK, NodeClient
from exo_cli_client.output import Output, size
from exo_cli_client.progress import wait_download, wait_ready

PULL_TIMEOUT_S = 24 * 3600
READY_TIMEOUT_S = 3600


def _short(node_id: str) -> str:
    return node_id.removeprefix("node-")[:12]


def _hostnames(state: dict[str, Any]) -> dict[str, str]:
    return {nid: n.get("hostname") or _short(nid) for nid, n in state["nodes"].items()}


def _progress_by_instance(tasks: list[dict[str, Any]]) -> dict[str, str]:
    """`step/total` of each generation under way (image i of n shown as `#i`), by instance."""
    shown: dict[str, list[str]] = {}
    for t in sorted(tasks, key=lambda t: (t["instance_id"], t["task_id"], t["index"])):
        image = f"#{t['index']} " if t["index"] else ""
        shown.setdefault(t["instance_id"], []).append(f"{image}{t['step']}/{t['total']}")
    return {instance: ", ".join(steps) for instance, steps in shown.items()}


def ps(args: argparse.Namespace, client: NodeClient, out: Output) -> int:
    state = client.get("/state")
    # Step progress of the generations this node's API streams (kept in its memory, not in
    # the replicated state).
    tasks: list[dict[str, Any]] = client.get("/progress")["tasks"]
    if out.as_json:
        out.json({"instances": state["instances"], "runners": state["runners"], "progress": tasks})
        return EXIT_OK
    progress = _progress_by_instance(tasks)
    cards = {m["model_id"]: m for m in client.get("/models")["models"]}
    hosts = _hostnames(state)
    rows = []
    for instance_id, instance in sorted(state["instances"].items()):
        shards = sorted(instance["shards"], key=lambda s: s["rank"])
        where = ", ".join(
            f"{hosts.get(s['node_id'], _short(s['node_id']))}[{s['start_layer']}:{s['end_layer']}]"
            for s in shards
        )
        runners = [state["runners"].get(s["runner_id"], {}) for s in shards]
        statuses = [r.get("status", "?") for r in runners]
        # The slowest rank's startup: its stages (download, load, warm-up) added up.
        startup = max((sum(r.get("stage_seconds", {}).values()) for r in runners), default=0.0)
        card = cards.get(instance["model_id"], {})
        memory = _runner_memory(state, shards)
        rows.append(
            [
                instance_id,
                instance["model_id"],
                instance["sharding"],
                where,
                ", ".join(statuses),
                f"{startup:.1f}s",
                size(card.get("storage_size_bytes", 0)),
                size(memory) if memory is not None else "-",
                progress.get(instance_id, "-"),
            ]
        )
    columns = [
        "INSTANCE", "MODEL", "SHARDING", "NODES", "RUNNERS", "STARTUP", "SIZE", "MEMORY", "STEPS",
    ]  # fmt: skip
    out.table(columns, rows)
    return EXIT_OK


def _runner_memory(state: dict[str, Any], shards: list[dict[str, Any]]) -> int | None:
    """The resident memory of an instance's runners, added up over its nodes (telemetry);
    None when no node reports it (runners in the node's own process, or no report yet)."""
    found = [
        state["nodes"].get(s["node_id"], {}).get("resources", {}).get("runner_memory", {})
        for s in shards
    ]
    sizes = [
        per_node[s["runner_id"]]
        for s, per_node in zip(shards, found, strict=True)
        if s["runner_id"] in per_node
    ]
    return sum(sizes) if sizes else None


def models(args: argparse.Namespace, client: NodeClient, out: Output) -> int:
    listing = client.get("/models", **({"status": "downloaded"} if args.downloaded else {}))
    if out.as_json:
        out.json(listing)
        return EXIT_OK
    state = client.get("/state")
    hosts = _hostnames(state)
    rows = []
    for m in sorted(listing["models"], key=lambda m: m["model_id"]):
        where = [
            hosts.get(nid, _short(nid))
            for nid, d in sorted(m.get("downloads", {}).items())
            if d["status"] == "completed"
        ]
        rows.append([m["model_id"], size(m.get("storage_size_bytes", 0)), ", ".join(where) or "-"])
    out.table(["MODEL", "SIZE", "DOWNLOADED ON"], rows)
    return EXIT_OK


def prompts_seen(state: dict[str, Any]) -> dict[str, list[str]]:
    """The models whose prompts each node sees: every node of an instance computes on them
    (rank 0 gets the text, the others its tokens or activations). See docs/security.md."""
    seen: dict[str, list[str]] = {}
    for instance in state["instances"].values():
        for node_id in dict.fromkeys(s["node_id"] for s in instance["shards"]):
            models = seen.setdefault(node_id, [])
            if instance["model_id"] not in models:
                models.append(instance["model_id"])
    return seen


def nodes(args: argparse.Namespace, client: NodeClient, out: Output) -> int:
    state = client.get("/state")
    if out.as_json:
        out.json(
            {"master": state["master"], "nodes": state["nodes"], "topology": state["topology"]}
        )
        return EXIT_OK
    master = (state.get("master") or {}).get("node_id")
    hosts = _hostnames(state)
    prompts = prompts_seen(state)
    rows = []
    for node_id, node in sorted(state["nodes"].items()):
        res = node.get("resources", {})
        peers = state["topology"].get(node_id, [])
        rows.append(
            [
                node_id,
                node.get("hostname", ""),
                "master" if node_id == master else "",
                f"{size(res.get('memory_available', 0))} / {size(res.get('memory_total', 0))}",
                f"{res.get('cpu_count', 0)} ({res.get('cpu_percent', 0):.0f}%)",
                ", ".join(hosts.get(p, _short(p)) for p in peers) or "-",
                ", ".join(prompts.get(node_id, [])) or "-",
            ]
        )
    columns = ["NODE", "HOST", "ROLE", "MEMORY FREE / TOTAL", "CPUS", "LINKS", "SEES PROMPTS OF"]
    out.table(columns, rows)
    return EXIT_OK


def pull(args: argparse.Namespace, client: NodeClient, out: Output) -> int:
    node_id = client.get("/node_id")["node_id"]
    started = client.post(f"/download/{node_id}/{args.model}")
    progress = wait_download(client, out, started["node_id"], args.model, PULL_TIMEOUT_S)
    if out.as_json:
        out.json(progress)
    else:
        out.line(f"{args.model}: downloaded to {progress.get('path') or started['node_id']}")
    return EXIT_OK


def rm(args: argparse.Namespace, client: NodeClient, out: Output) -> int:
    node_id = client.get("/node_id")["node_id"]
    answer = client.delete(f"/download/{node_id}/{args.model}")
    if out.as_json:
        out.json(answer)
    else:
        out.line(f"deleted {args.model} from {node_id}")
    return EXIT_OK


def place(args: argparse.Namespace, client: NodeClient, out: Output) -> int:
    query: dict[str, Any] = {"model_id": args.model, "min_nodes": args.min_nodes}
    if args.sharding:
        query["sharding"] = args.sharding
    previews = client.get("/instance/previews", **query)
    if not out.as_json:
        rows = [
            [
                str(i),
                p["sharding"],
                ", ".join(
                    f"{_short(n['node_id'])}[{n['start_layer']}:{n['end_layer']}]"
                    for n in p["nodes"]
                ),
            ]
            for i, p in enumerate(previews["previews"])
        ]
        out.table(["#", "SHARDING", "NODES [LAYERS]"], rows)
        if previews.get("refused"):
            out.line(f"refused: {previews['refused']}")
    body = {"model_id": args.model, "min_nodes": args.min_nodes}
    if args.sharding:
        body["sharding"] = args.sharding
    created = client.post("/instance", body)
    if not args.no_wait:
        wait_ready(client, out, created["instance_id"], READY_TIMEOUT_S)
    if out.as_json:
        out.json({"previews": previews, "instance": created})
    else:
        out.line(f"placed {args.model} as {created['instance_id']}")
    return EXIT_OK


def ensure_running(client: NodeClient, out: Output, model_id: str) -> str:
    """The id of a ready instance of the model; places one (with progress) when none runs."""
    state = client.get("/state")
    mine = [i for i, x in sorted(state["instances"].items()) if x["model_id"] == model_id]
    if mine:
        instance_id = mine[0]
    else:
        out.line(f"placing {model_id}...")
        instance_id = client.post("/instance", {"model_id": model_id})["instance_id"]
    wait_ready(client, out, instance_id, READY_TIMEOUT_S)
    return instance_id
