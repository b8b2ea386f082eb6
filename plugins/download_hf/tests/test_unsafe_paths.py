"""No request, command or CLI call may delete or write outside a models directory.

Each unsafe id is sent as an attacker would: raw HTTP (no client normalises `..` away), in every
route that takes a model id, for this node and for another one. Each must answer a 4xx, and
the data directories (and what lies beside them) must hold the same files with the same bytes.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import exo_download_hf.plugin as download_plugin
from exo_core.plugin import IndexedEvent, ModelId, NodeId
from exo_core.plugin.download import (
    AddModelCard,
    DeleteDownload,
    DownloadDeleted,
    RemoveModelCard,
    ReportEvents,
)
from exo_core.testing.harness import RunningCluster, running_cluster
from exo_download_hf.testing import HubStandIn, card

# (how the id is written in a URL path, the id itself); `evil` is a symlink out of models/.
UNSAFE = [
    pytest.param(".", ".", id="dot"),
    pytest.param("..", "..", id="dotdot"),
    pytest.param("%2E%2E", "..", id="encoded-dotdot"),
    pytest.param("a/..", "a/..", id="a-dotdot"),
    pytest.param("/etc", "/etc", id="absolute"),
    pytest.param("evil", "evil", id="symlink-out"),
]


NODE_OWNED = {"events.log", "snapshot.bin", "vote.json"}


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` with its hash, but the files a node rewrites on its own: the
    event logs (telemetry keeps appending: `logs_keep_prefix` checks that nothing there
    changes), the state snapshot and the election's vote."""
    out: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        owned = p.name in NODE_OWNED or p.name.lstrip(".").partition(".tmp-")[0] in NODE_OWNED
        if p.is_file() and not owned and "logs" not in rel.parts:
            out[str(rel)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def unchanged(before: dict[str, str], root: Path) -> None:
    after = snapshot(root)
    assert after == before
    assert (root / "outside" / "precious.txt").read_text() == "keep me"


def logs_keep_prefix(logs: dict[Path, bytes]) -> None:
    for path, old in logs.items():
        assert path.read_bytes().startswith(old), f"{path} lost events"


def raw(url: str, method: str, path: str, body: object | None = None) -> tuple[int, str]:
    """Send `path` exactly as written (httpx would resolve `..` segments before sending)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, path, body=data, headers=headers)
        answer = conn.getresponse()
        return answer.status, answer.read().decode()
    finally:
        conn.close()


def fill(data_dir: Path, outside: Path) -> None:
    """A node's models: one downloaded model, and `evil`, a symlink to a directory outside."""
    model = data_dir / "models" / "org--tiny"
    (model / ".exo").mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    (model / ".exo" / "manifest.json").write_text("{}")
    (data_dir / "models" / "evil").symlink_to(outside, target_is_directory=True)


@pytest.fixture
def cluster(hub: HubStandIn, tmp_path: Path) -> Iterator[tuple[RunningCluster, Path]]:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    for i in range(2):
        (tmp_path / f"node{i}").mkdir()
        fill(tmp_path / f"node{i}", outside)
    with running_cluster(tmp_path, 2, lambda i: [download_plugin]) as c:
        c.wait(lambda: all(len(n.node.state.nodes) == 2 for n in c.nodes))
        yield c, tmp_path


def deletes(node_ids: list[str], written: str) -> list[tuple[str, str]]:
    return [("DELETE", f"/download/{n}/{written}") for n in node_ids]


@pytest.mark.parametrize(("written", "model_id"), UNSAFE)
def test_unsafe_ids_are_refused_by_every_route(
    cluster: tuple[RunningCluster, Path], written: str, model_id: str
) -> None:
    c, root = cluster
    before = snapshot(root)
    logs = {p: p.read_bytes() for p in root.glob("node*/events.log")}
    me, other = c.nodes[0].node_id, c.nodes[1].node_id
    calls = [
        *deletes([me, other], written),
        ("DELETE", f"/models/custom/{written}"),
        ("POST", "/models/add", {"model_id": model_id}),
    ]
    for call in calls:
        status, text = raw(c.nodes[0].url, *call)  # type: ignore[arg-type]
        if model_id == "evil" and call[0] == "DELETE" and other in call[1]:
            # A safe id: only the other node knows its own symlinks. It is asked, through the
            # log, and refuses there (the hashes below say it deleted nothing).
            assert status in (202, 404), (call, status, text)
            continue
        if model_id == "evil" and call[1].startswith("/models/"):
            # A safe id, not a path there: no such custom card, and no such repo on the hub.
            assert 400 <= status < 500 or status == 502, (call, status, text)
            continue
        assert 400 <= status < 500, (call, status, text)
        assert "status_code" in json.loads(text), text
    logs_keep_prefix(logs)
    unchanged(before, root)


@pytest.mark.parametrize(("written", "model_id"), UNSAFE[:5])
def test_the_master_refuses_commands_with_unsafe_ids(
    cluster: tuple[RunningCluster, Path], written: str, model_id: str
) -> None:
    """A peer may send commands without going through any route."""
    c, root = cluster
    before = snapshot(root)
    node = c.nodes[1]
    other = NodeId(c.nodes[0].node_id)
    commands = [
        DeleteDownload(node_id=other, model_id=ModelId(model_id)),
        RemoveModelCard(model_id=ModelId(model_id)),
        AddModelCard(card=card(model_id)),
        AddModelCard(card=card("org/fine", source=f"hf:{model_id}")),
        # A node may report only its own deletions (else a 403 from peer auth when the
        # sender is not the master, before the id is looked at).
        ReportEvents(
            events=(DownloadDeleted(node_id=NodeId(node.node_id), model_id=ModelId(model_id)),)
        ),
    ]
    for command in commands:
        result = c.call(node.node.send_command, command)
        assert result.status == 422, (command, result)
        assert "not a valid model id" in result.message
    unchanged(before, root)


@pytest.mark.parametrize(("written", "model_id"), UNSAFE)
def test_a_node_checks_again_before_deleting(
    cluster: tuple[RunningCluster, Path], written: str, model_id: str
) -> None:
    """A deletion event that reached the log anyway (an older master) deletes nothing."""
    c, root = cluster
    before = snapshot(root)
    node = c.nodes[0]
    event = IndexedEvent(
        index=10**9,
        term=0,
        event=DownloadDeleted(node_id=NodeId(node.node_id), model_id=ModelId(model_id)),
    )

    async def apply() -> None:
        download_plugin.exo_event_applied(event=event, state=node.node.state, ctx=node.node)

    c.call(apply)
    time.sleep(0.5)  # the deletion would run in the background
    unchanged(before, root)


def test_a_symlink_inside_the_models_dir_is_refused_before_anything_is_written(
    cluster: tuple[RunningCluster, Path],
) -> None:
    """`models/a--b -> models/org--tiny` stays inside the models directory, so the path check
    passed it: deleting `a/b` took the lock file through the link (writing `.exo/lock` into
    the other model) and then failed with a 500. Now it is a 4xx, and nothing is written."""
    c, root = cluster
    models = root / "node0" / "models"
    (models / "a--b").symlink_to(models / "org--tiny", target_is_directory=True)
    before = snapshot(root)
    node = c.nodes[0]
    status, text = raw(node.url, "DELETE", f"/download/{node.node_id}/a/b")
    assert 400 <= status < 500, (status, text)
    assert "symlink" in json.loads(text)["detail"]
    unchanged(before, root)
    assert not (models / "org--tiny" / ".exo" / "lock").exists()
    assert (models / "a--b").is_symlink() and (models / "org--tiny" / "config.json").exists()
