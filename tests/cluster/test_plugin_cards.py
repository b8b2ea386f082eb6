"""A model card from a plugin only some nodes have, in a real two-node cluster: placed by a
master that lacks the plugin, the card is replicated so every node serves the model; a model
nobody placed yet is refused by a node without the plugin, naming the nodes and engine that
serve it."""

from __future__ import annotations

from pathlib import Path

import openai

from exo_core.plugin import ModelId, NodeConfig, hookimpl
from exo_core.testing import ScriptedEnginePlugin, running_cluster


class _Preferred:
    """Wins the first election: the master is the node without the engine plugin."""

    @hookimpl
    def exo_election_priority(self, config: NodeConfig) -> int:
        return 100


def _plugins(i: int) -> list[object]:
    return [_Preferred()] if i == 0 else [ScriptedEnginePlugin()]


def _chat(url: str, model: str, text: str) -> str | None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0, timeout=60)
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}]
    )
    return answer.choices[0].message.content


def test_a_card_only_some_nodes_know_is_replicated_or_refused_by_name(tmp_path: Path) -> None:
    with running_cluster(tmp_path, 2, _plugins, dialects=True) as cluster:
        bare, plugged = cluster.nodes
        cluster.wait(lambda: [m.node_id for m in cluster.masters()] == [bare.node_id])
        thinker = ModelId("scripted-thinker")

        def reported() -> bool:
            info = bare.node.state.nodes.get(plugged.node.node_id)
            return info is not None and thinker in (info.resources.serves or ())

        cluster.wait(reported, timeout=30)
        # Not placed yet: the bare node cannot know the card, and says who serves it.
        try:
            _chat(bare.url, thinker, "hi")
            raise AssertionError("a node without the plugin answered an unknown model")
        except openai.NotFoundError as e:
            assert f"node(s) {plugged.node_id} serve it (engine scripted)" in e.message, e.message
        # The plugged node places it through the bare master, which replicates the card...
        assert _chat(plugged.url, "scripted-echo", "hello there") == "echo: hello there"
        cluster.wait(cluster.converged)
        assert ModelId("scripted-echo") in bare.node.state.model_cards
        # ...so the bare node now serves it too (the task runs on the plugged node).
        assert _chat(bare.url, "scripted-echo", "from the bare node") == "echo: from the bare node"
