"""Reports that only replace an earlier value enter the log when they say something new.

Every node reports its telemetry and topology every few seconds, and downloads report as they
progress. Each such report replaces the previous one in state, so logging them all would grow
the log by the same facts over and over. The master logs one only when it changes what the
cluster decides with (membership, addresses, resources, a step of progress), or when the one
in state is older than `REFRESH_S`, so `last_seen` stays fresh. An unlogged report still tells
the master that its node is alive. Snapshots (`exo_core.replica`) drop the superseded ones
that were logged.
"""

from __future__ import annotations

from exo_core.events import DownloadProgressed, Event, NodeTelemetry, TopologyReported
from exo_core.ids import RunnerId
from exo_core.state import DownloadProgress, NodeInfo, State

REFRESH_S = 60.0
# Free memory or disk must move by this share of the total to be news.
RESOURCE_STEP = 0.02
# A download must advance by this share of its size to be news.
DOWNLOAD_STEP = 0.01


def worth_logging(state: State, event: Event) -> bool:
    """Whether `event` tells the cluster something its state does not hold yet."""
    match event:
        case TopologyReported(node_id=node_id, peers=peers):
            return state.topology.get(node_id) != tuple(sorted(peers))
        case NodeTelemetry():
            return _telemetry_is_news(state.nodes.get(event.node_id), event)
        case DownloadProgressed(progress=progress):
            known = state.downloads.get(progress.node_id, {}).get(progress.model_id)
            return _progress_is_news(known, progress)
        case _:
            return True


def _moved(old: int, new: int, total: int) -> bool:
    return abs(new - old) >= max(1, int(total * RESOURCE_STEP))


def _telemetry_is_news(known: NodeInfo | None, e: NodeTelemetry) -> bool:
    if known is None or e.timestamp - known.last_seen >= REFRESH_S:
        return True
    old, new = known.resources, e.resources
    fixed = ("memory_total", "cpu_count", "disk_total", "os", "engines", "serves")
    return (
        (known.hostname, known.addresses) != (e.hostname, e.addresses)
        or any(getattr(old, f) != getattr(new, f) for f in fixed)
        or _moved(old.memory_available, new.memory_available, new.memory_total)
        or _moved(old.disk_available, new.disk_available, new.disk_total)
        or _runner_memory_is_news(old.runner_memory, new.runner_memory, new.memory_total)
    )


def _runner_memory_is_news(old: dict[RunnerId, int], new: dict[RunnerId, int], total: int) -> bool:
    """A runner process came or went, or one's memory moved by a step (`exo ps` shows it)."""
    if old.keys() != new.keys():
        return True
    return any(_moved(old[r], new[r], total) for r in new)


def _progress_is_news(known: DownloadProgress | None, p: DownloadProgress) -> bool:
    if known is None:
        return True
    fixed = ("status", "total_bytes", "error", "path", "read_only")
    if any(getattr(known, f) != getattr(p, f) for f in fixed):
        return True
    step = max(1, int(p.total_bytes * DOWNLOAD_STEP))
    return abs(p.downloaded_bytes - known.downloaded_bytes) >= step
