"""One real `exo` process with the MLX engine: the first chat just works, Ctrl-C ends it all."""

from __future__ import annotations

import signal
from pathlib import Path

import psutil
import pytest
from openai import OpenAI

from exo_core.testing.processes import exo_processes, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.smollm]


def test_first_chat_works_and_ctrl_c_ends_every_runner(tmp_path: Path) -> None:
    with exo_processes(tmp_path, 1) as (node,):
        wait_until(lambda: node.get("/healthz")["master"] is not None, timeout=60)
        client = OpenAI(base_url=f"{node.url}/v1", api_key="none", timeout=180)
        reply = client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            messages=[{"role": "user", "content": "Say hello"}],
            max_tokens=6,
            temperature=0,
        )
        assert reply.choices[0].message.content and reply.usage is not None
        assert node.process is not None
        children = psutil.Process(node.process.pid).children(recursive=True)
        assert children, "the runner is a subprocess"
        node.kill(signal.SIGINT)
        assert node.process.returncode == 0
        _gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"left running: {alive}"
        log = node.log()
        assert "starting exo (pid" in log and "stopped" in log
