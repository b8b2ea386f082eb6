"""Hub look-ups never hold up the rest of the API, nor shutdown.

A hub that accepts connections and never answers (what a dead proxy or a black-holed network
looks like) took every worker thread of the node before: 45 searches against it each waited
with no timeout, and an unrelated `DELETE /download`, which deletes on a worker thread, waited
for them (21 s measured; with a hub that never answers, for ever), and so did shutdown.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

import exo_download_hf.plugin as download_plugin
from exo_core.testing.harness import running_node
from exo_core.testing.waiting import wait_until
from exo_download_hf.downloader import HfDownloader
from exo_download_hf.hub import HubClient
from exo_download_hf.lookups import LOOKUP_WORKERS, HubLookups
from exo_download_hf.testing import TINY, HubEnginePlugin, HubStandIn

from .test_routes import download_locally

SEARCHES = 45


@pytest.fixture
def silent_hub() -> Iterator[tuple[str, list[socket.socket]]]:
    """An endpoint that accepts connections and never answers; the accepted ones are listed."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}", held
    stop.set()
    thread.join()
    for s in [*held, server]:
        s.close()


def test_searches_hanging_on_the_hub_do_not_delay_a_delete_nor_shutdown(
    hub: HubStandIn, tmp_path: Path, silent_hub: tuple[str, list[socket.socket]]
) -> None:
    endpoint, held = silent_hub
    pool = ThreadPoolExecutor(SEARCHES)
    with running_node(tmp_path / "node", [download_plugin, HubEnginePlugin()]) as node:
        path = download_locally(node)
        downloader = node.node.downloader
        assert isinstance(downloader, HfDownloader)
        downloader.hub = HubClient(endpoint=endpoint)  # the hub goes silent
        downloader.lookups = HubLookups(wait_s=3.0)  # a route waits 3 s for one, not 20

        def search(i: int) -> int:
            try:
                url = f"{node.url}/models/search"
                return httpx.get(url, params={"query": f"q{i}"}, timeout=60).status_code
            except httpx.HTTPError:
                return 0  # the node stopped while it waited

        searches = [pool.submit(search, i) for i in range(SEARCHES)]
        wait_until(lambda: len(held) >= LOOKUP_WORKERS)  # look-ups are hanging on the hub
        time.sleep(0.5)

        started = time.monotonic()
        deleted = httpx.delete(f"{node.url}/download/{node.node_id}/{TINY}", timeout=30)
        took = time.monotonic() - started
        assert deleted.status_code == 200, deleted.text
        assert took < 1.0, f"DELETE /download waited {took:.1f} s behind hub look-ups"
        assert not path.exists()
        # Beyond the look-up pool, searches are refused at once rather than queued; those in
        # it give up waiting for the silent hub with a 504.
        statuses = sorted(f.result(timeout=30) for f in searches)
        assert statuses == [503] * (SEARCHES - LOOKUP_WORKERS) + [504] * LOOKUP_WORKERS
        assert len(held) == LOOKUP_WORKERS
        assert httpx.get(f"{node.url}/healthz").status_code == 200
        stopping = time.monotonic()  # the look-ups' threads still hang on the hub
    stopped_in = time.monotonic() - stopping
    assert stopped_in < 8, f"stopping the node waited {stopped_in:.0f} s for hub look-ups"
    pool.shutdown()
