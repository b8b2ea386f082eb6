"""docs/plugins.md's reference of what plugins are handed: every field of `State`,
`IndexedEvent` and `NodeConfig` and every event type is there, and what it says of observers
(they do not see the events a node replays as it starts) holds."""

from __future__ import annotations

import re
import time
from pathlib import Path

import msgspec

from exo_core.config import NodeConfig
from exo_core.events import EVENT_TYPES, IndexedEvent
from exo_core.plugin import State, hookimpl
from exo_core.testing.harness import running_node

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def _reference() -> str:
    text = DOC.read_text()
    start = text.index("## Reference: State, events, IndexedEvent, NodeConfig")
    return text[start : text.index("\n## ", start + 1)]


def _named(struct: type[msgspec.Struct], table: str) -> list[str]:
    """The fields of `struct` that the table does not name in backticks."""
    return [f for f in struct.__struct_fields__ if not re.search(rf"`{f}`", table)]


def test_the_reference_names_every_field_and_event() -> None:
    ref = _reference()
    state = ref[ref.index("**`State`**") : ref.index("**`IndexedEvent`**")]
    events = ref[ref.index("**`IndexedEvent`**") : ref.index("**`NodeConfig`**")]
    config = ref[ref.index("**`NodeConfig`**") :]
    assert _named(State, state) == []
    assert _named(IndexedEvent, events) == []
    assert [e.__name__ for e in EVENT_TYPES if f"`{e.__name__}`" not in events] == []
    for event in EVENT_TYPES:
        row = next(line for line in events.splitlines() if f"`{event.__name__}`" in line)
        assert _named(event, row) == [], event.__name__
    assert _named(NodeConfig, config) == []


class _Observer:
    def __init__(self) -> None:
        self.seen: list[int] = []

    @hookimpl
    def exo_event_applied(self, event: IndexedEvent) -> None:
        self.seen.append(event.index)


def test_observers_do_not_see_the_events_a_node_replays_as_it_starts(tmp_path: Path) -> None:
    first = _Observer()
    with running_node(tmp_path, [first]) as running:
        deadline = time.monotonic() + 15
        while running.node.state.last_index < 1:
            assert time.monotonic() < deadline, "no events"
            time.sleep(0.05)
    before = max(first.seen)  # the last event the first run applied: all of it is in the log
    assert first.seen[0] == 0
    second = _Observer()
    with running_node(tmp_path, [second]) as running:
        assert running.node.state.last_index >= before  # replayed from the log
    assert second.seen and all(index > before for index in second.seen)
