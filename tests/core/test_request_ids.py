"""Every response carries a request id, and every 5xx is logged with its traceback under the id
the client gets (the `x-request-id` header and the body's `request_id`). Before, a handler's bug
was a bare 500 with nothing in the log."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from litestar import get
from loguru import logger

from exo_core.hookspecs import hookimpl
from exo_core.testing.harness import RunningNode, running_node

ID = re.compile(r"req_[0-9a-f]{16}")


class BuggyRoutes:
    """A plugin with a route that fails: a bug in its handler."""

    @hookimpl
    def exo_routes(self, ctx: Any) -> list[Any]:
        @get("/buggy", sync_to_thread=False)
        def buggy() -> dict[str, str]:
            raise RuntimeError("the handler's own bug")

        return [buggy]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    with running_node(tmp_path_factory.mktemp("ids"), [BuggyRoutes()]) as running:
        yield running


def test_a_5xx_names_a_request_id_that_the_log_has_with_the_traceback(node: RunningNode) -> None:
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="ERROR")
    try:
        r = httpx.get(f"{node.url}/buggy", timeout=10)
    finally:
        logger.remove(sink)
    assert r.status_code == 500
    rid = r.headers["x-request-id"]
    assert ID.fullmatch(rid) and r.headers["request-id"] == rid
    body = r.json()
    assert body["request_id"] == rid
    assert "the handler's own bug" not in body["detail"]  # the detail stays in the log
    logged = "\n".join(m for m in lines if rid in m)
    assert "GET /buggy answered 500" in logged
    assert "Traceback" in logged and "RuntimeError: the handler's own bug" in logged


def test_every_response_has_its_own_request_id(node: RunningNode) -> None:
    ids = {httpx.get(f"{node.url}/healthz", timeout=5).headers["x-request-id"] for _ in range(3)}
    missing = httpx.get(f"{node.url}/no/such/route", timeout=5)
    assert missing.status_code == 404
    ids.add(missing.headers["x-request-id"])
    assert len(ids) == 4 and all(ID.fullmatch(i) for i in ids)
