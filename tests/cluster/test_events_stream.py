"""`/events` never spins: over a log that reads back empty, the stream ends with an error event,
the node keeps answering other requests, and SIGTERM still stops it.

A real `exo` process, so that a node that spins (as it did) can still be killed afterwards.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from exo_core.testing.processes import exo_processes, wait_until


@pytest.mark.slow
def test_events_over_a_log_that_reads_back_empty_ends_and_the_node_answers(
    tmp_path: Path,
) -> None:
    with exo_processes(tmp_path, 1, extra_args=[["--transport", "memory"]]) as (node,):
        try:
            wait_until(lambda: node.get("/healthz")["last_index"] > 0, timeout=60)
            # Someone empties the file behind the node's back: its index still promises events.
            (node.data_dir / "events.log").write_bytes(b"")
            received: list[tuple[str, str]] = []

            def read_events() -> None:
                url = f"{node.url}/events"
                with httpx.stream("GET", url, params={"since": 0}, timeout=30) as r:
                    kind = ""
                    for line in r.iter_lines():
                        if line.startswith("event:"):
                            kind = line.split(":", 1)[1].strip()
                        elif line.startswith("data:"):
                            received.append((kind, line.split(":", 1)[1].strip()))

            reader = threading.Thread(target=read_events, daemon=True)
            reader.start()
            for _ in range(5):
                started = time.monotonic()
                assert httpx.get(f"{node.url}/healthz", timeout=1.0).status_code == 200
                assert time.monotonic() - started < 1.0
                time.sleep(0.1)
            reader.join(timeout=10)
            assert not reader.is_alive(), "the stream did not end"
            assert [kind for kind, _ in received] == ["error"]
            error = json.loads(received[0][1])
            assert error["index"] == 0 and "no readable event" in error["error"]

            assert node.process is not None
            node.process.send_signal(signal.SIGTERM)
            assert node.process.wait(timeout=30) == 0
        finally:
            if node.process is not None and node.process.poll() is None:
                node.process.kill()  # a node that ignored SIGTERM (as before the fix)
                node.process.wait(timeout=30)
