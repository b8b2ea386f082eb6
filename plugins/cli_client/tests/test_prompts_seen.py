"""`exo nodes` shows, for each node, the models whose prompts it sees (issue 25)."""

from __future__ import annotations

import argparse
from typing import Any

from exo_cli_client.commands import nodes, prompts_seen
from exo_cli_client.output import Output


def shard(node_id: str, rank: int) -> dict[str, Any]:
    return {"node_id": node_id, "rank": rank, "runner_id": f"r{rank}"}


STATE: dict[str, Any] = {
    "master": {"node_id": "a"},
    "nodes": {n: {"hostname": n, "resources": {}} for n in ("a", "b", "c")},
    "topology": {},
    "instances": {
        "i1": {"model_id": "big", "shards": [shard("a", 0), shard("b", 1)]},
        "i2": {"model_id": "small", "shards": [shard("b", 0)]},
    },
}


class FakeClient:
    def get(self, path: str, **params: Any) -> Any:
        assert path == "/state"
        return STATE


def test_every_node_of_an_instance_sees_its_prompts() -> None:
    assert prompts_seen(STATE) == {"a": ["big"], "b": ["big", "small"]}


def test_exo_nodes_has_a_column_for_them(capsys: Any) -> None:
    out = Output(as_json=False)
    assert nodes(argparse.Namespace(), FakeClient(), out) == 0  # type: ignore[arg-type]
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split("\t")[-1] == "SEES PROMPTS OF"
    by_node = {r.split("\t")[0]: r.split("\t")[-1] for r in rows}
    assert by_node == {"a": "big", "b": "big, small", "c": "-"}
