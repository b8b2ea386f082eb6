"""A model written into the models directory of a running `exo` process is served without a
restart: listed within the issue's 10 s, then answered through the official openai client."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
from msgspec.structs import replace

from exo_core.ids import ModelId
from exo_core.testing.processes import exo_processes, wait_until
from exo_engine_mlx.cards import write_imported_card
from exo_engine_mlx.family_sweep import tiny_card
from exo_engine_mlx.tiny_model import make_tiny_model

LATE = "tiny-late-llama"


def _models(url: str) -> set[str]:
    return {m["id"] for m in httpx.get(f"{url}/v1/models", timeout=5).json()["data"]}


def test_a_model_written_while_the_node_runs_is_served_within_10_s(tmp_path: Path) -> None:
    with exo_processes(tmp_path, 1, extra_args=[["--transport", "memory"]]) as (node,):
        wait_until(lambda: "SmolLM2-135M-Instruct" in _models(node.url), timeout=60)
        assert LATE not in _models(node.url)
        model_dir = make_tiny_model(node.data_dir / "models" / LATE, layers=2)
        card = replace(tiny_card("llama", 2), model_id=ModelId(LATE), source=f"local:{model_dir}")
        write_imported_card(model_dir, card)
        written = time.monotonic()
        wait_until(lambda: LATE in _models(node.url), timeout=10, interval=0.1)
        print(f"listed {time.monotonic() - written:.1f} s after its card was written")
        client = openai.OpenAI(base_url=f"{node.url}/v1", api_key="-", max_retries=0, timeout=120)
        answer = client.chat.completions.create(
            model=LATE, messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
        assert answer.choices[0].finish_reason in ("length", "stop")
        assert answer.usage is not None and answer.usage.completion_tokens > 0
