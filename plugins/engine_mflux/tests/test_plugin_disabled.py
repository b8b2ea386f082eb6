"""With the image plugin disabled, a real `exo` process serves text as before and knows no
image model (the models directory holds one all the same)."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from exo_core.testing.processes import exo_processes, wait_until
from exo_engine_mflux.cards import local_flux_card, write_card

from .conftest import MODEL_ID, models

pytestmark = pytest.mark.slow


@pytest.mark.smollm
def test_disabling_the_plugin_leaves_text_generation_working(tmp_path: Path) -> None:
    # The image model's card is on disk; its weights are never read here.
    model_dir = tmp_path / "node0" / "models" / MODEL_ID
    model_dir.mkdir(parents=True)
    write_card(model_dir, local_flux_card(model_dir, MODEL_ID, {"transformer": 1}, blocks=1))
    args = [["--transport", "memory", "--disable-plugin", "engine_mflux"]]
    with exo_processes(tmp_path, 1, extra_args=args) as (node,):
        wait_until(lambda: "SmolLM2-135M-Instruct" in models(node.url), timeout=60)
        assert MODEL_ID not in models(node.url)
        me = node.get("/node_id")["node_id"]
        wait_until(lambda: node.get(f"/state/nodes/{me}")["resources"]["engines"], timeout=30)
        assert node.get(f"/state/nodes/{me}")["resources"]["engines"] == ["mlx"]
        client = openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=4,
            timeout=300,
        )
        assert reply.choices[0].message.content
        with pytest.raises(openai.NotFoundError):
            client.images.generate(model=MODEL_ID, prompt="x", size="64x64")
        # A built-in image card is still listed, and placement says why it cannot run.
        with pytest.raises(openai.APIStatusError, match="no image engine plugin"):
            client.images.generate(
                model="black-forest-labs/FLUX.1-schnell", prompt="x", size="64x64"
            )
