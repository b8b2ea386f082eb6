"""Waiting on the cluster with a progress display: a download to 100 %, an instance's runners
to ready. State is polled from `GET /state` (every node holds the replicated state)."""

from __future__ import annotations

import time
from typing import Any

from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from exo_cli_client.client import EXIT_FAILED, ClientError, NodeClient
from exo_cli_client.output import Output, size

POLL_S = 0.25
READY = "ready"
RUNNING = "running"


def _bar(out: Output) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=out.console,
        transient=False,
    )


def _download(state: dict[str, Any], node_id: str, model_id: str) -> dict[str, Any] | None:
    return state.get("downloads", {}).get(node_id, {}).get(model_id)


def wait_download(
    client: NodeClient, out: Output, node_id: str, model_id: str, timeout: float
) -> dict[str, Any]:
    """Show a download on `node_id` until it completes; raises `ClientError` when it fails."""
    deadline = time.monotonic() + timeout
    shown = -1
    with _bar(out) if out.rich else _Nothing() as bar:
        task: TaskID | None = None
        while True:
            progress = _download(client.get("/state"), node_id, model_id)
            if progress is not None:
                done, total = progress["downloaded_bytes"], progress["total_bytes"]
                if progress["status"] == "completed":
                    done = total = max(done, total, 1)
                if isinstance(bar, Progress):
                    if task is None:
                        task = bar.add_task(f"pulling {model_id}", total=total or None)
                    bar.update(task, completed=done, total=total or None)
                else:
                    percent = int(100 * done / total) if total else 0
                    if percent // 10 > shown // 10 or progress["status"] == "completed":
                        shown = percent
                        out.line(f"pulling {model_id}: {percent}% of {size(total)}")
                if progress["status"] == "completed":
                    return progress
                if progress["status"] == "failed":
                    raise ClientError(f"download failed: {progress.get('error')}", EXIT_FAILED)
            if time.monotonic() > deadline:
                raise ClientError(f"{model_id} did not finish downloading in {timeout:.0f} s")
            time.sleep(POLL_S)


def wait_ready(client: NodeClient, out: Output, instance_id: str, timeout: float) -> None:
    """Show an instance's runners (downloading, loading, warming up) until all are ready."""
    deadline = time.monotonic() + timeout
    last = ""
    with _bar(out) if out.rich else _Nothing() as bar:
        tasks: dict[str, TaskID] = {}
        while True:
            state = client.get("/state")
            instance = state["instances"].get(instance_id)
            if instance is None:
                raise ClientError(f"the instance {instance_id} was deleted while starting")
            statuses = []
            for shard in instance["shards"]:
                runner = state["runners"].get(shard["runner_id"], {})
                status = runner.get("status", "pending")
                if status == "failed":
                    raise ClientError(f"a runner failed: {runner.get('error')}")
                statuses.append(status)
                progress = _download(state, shard["node_id"], instance["model_id"])
                if isinstance(bar, Progress) and progress is not None:
                    key = shard["node_id"]
                    total = progress["total_bytes"] or None
                    done = progress["downloaded_bytes"]
                    if progress["status"] == "completed":
                        done = total = max(done, progress["total_bytes"], 1)
                    if key not in tasks:
                        tasks[key] = bar.add_task(f"{key[:12]} {instance['model_id']}", total=total)
                    bar.update(tasks[key], completed=done, total=total)
            summary = ", ".join(statuses)
            if summary != last:
                last = summary
                if isinstance(bar, Progress):
                    bar.console.print(f"[dim]runners: {summary}[/dim]")
                else:
                    out.line(f"runners: {summary}")
            if all(s in (READY, RUNNING) for s in statuses):
                return
            if time.monotonic() > deadline:
                raise ClientError(f"the instance was not ready in {timeout:.0f} s ({summary})")
            time.sleep(POLL_S)


class _Nothing:
    """Stands in for a progress bar when output is piped."""

    def __enter__(self) -> _Nothing:
        return self

    def __exit__(self, *exc: object) -> None:
        return None
