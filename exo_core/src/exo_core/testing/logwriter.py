"""A child process for the crash test: appends events forever, printing each acknowledged index.

Events are a pure function of their index, so the parent can rebuild what should be on disk."""

from __future__ import annotations

import sys
from pathlib import Path

from exo_core.eventlog import EventLog
from exo_core.events import IndexedEvent, NodeTelemetry, TopologyReported
from exo_core.ids import NodeId
from exo_core.state import NodeResources


def event_at(index: int) -> IndexedEvent:
    node = NodeId(f"node-{index % 7}")
    if index % 3:
        event = NodeTelemetry(
            node_id=node,
            hostname="h" * (index % 50),  # frames of varied length tear in varied places
            resources=NodeResources(memory_total=index, memory_available=index // 2),
            timestamp=float(index),
        )
    else:
        event = TopologyReported(node_id=node, peers=(NodeId(f"node-{index % 5}"),))
    return IndexedEvent(index=index, term=1, event=event)


def main(path: str, batch: int) -> None:
    log = EventLog(Path(path))
    index = log.next_index
    while True:
        log.append(event_at(i) for i in range(index, index + batch))
        index += batch
        print(index - 1, flush=True)  # acknowledged: durable up to here


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
