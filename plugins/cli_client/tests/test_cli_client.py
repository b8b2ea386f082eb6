"""The client subcommands against a real `exo` process (SmolLM2 on the MLX engine, models
from the download tests' stand-in hub): piped for plain output and exit codes, through a
pseudo-terminal for the interactive chat and the progress bar."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pexpect
import pytest

from exo_core.testing.processes import ExoProcess, exo_processes, wait_until
from exo_download_hf.testing import HubStandIn

pytestmark = [pytest.mark.slow, pytest.mark.smollm]

MODEL = "SmolLM2-135M-Instruct"
TINY = "org/tiny-cli"
TINY_CONFIG = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
WEIGHTS = 2_000_000
# Runners prefill this many prompt tokens a step (EXO_PREFILL_CHUNK, 256 by default): a prompt
# of a few hundred tokens then reports its progress, quickly.
PREFILL_STEP = 64


@pytest.fixture(scope="module")
def hub() -> Iterator[HubStandIn]:
    with HubStandIn() as stand_in:
        files = {
            "config.json": json.dumps(TINY_CONFIG).encode(),
            "tokenizer.json": b'{"model": {"type": "BPE"}}',
            "model.safetensors": os.urandom(WEIGHTS),
        }
        stand_in.add_repo(TINY, files)
        stand_in.throttle_bytes_per_s = 1_000_000  # about two seconds: the bar moves
        yield stand_in


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, hub: HubStandIn) -> Iterator[ExoProcess]:
    env = {"HF_ENDPOINT": hub.url, "EXO_PREFILL_CHUNK": str(PREFILL_STEP)}
    with exo_processes(tmp_path_factory.mktemp("cli"), 1, env=env) as (started,):
        wait_until(lambda: started.get("/healthz")["master"] is not None, timeout=120)
        yield started


def exo(*args: str, node: ExoProcess | None = None) -> subprocess.CompletedProcess[str]:
    """`exo ARGS --node URL`, piped."""
    where = ["--node", node.url] if node is not None else []
    return subprocess.run(
        [sys.executable, "-m", "exo_core.cli", *args, *where],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_COLOR": "1"},
    )


def spawn(*args: str, node: ExoProcess) -> pexpect.spawn:
    """`exo ARGS --node URL` on a pseudo-terminal."""
    child = pexpect.spawn(
        sys.executable,
        ["-m", "exo_core.cli", *args, "--node", node.url],
        encoding="utf-8",
        timeout=240,
        dimensions=(40, 160),
    )
    return child


def test_listing_commands_piped_and_json(node: ExoProcess) -> None:
    nodes = exo("nodes", node=node)
    assert nodes.returncode == 0, nodes.stderr
    header, *rows = nodes.stdout.splitlines()
    assert header.split("\t")[:3] == ["NODE", "HOST", "ROLE"]
    assert "\x1b[" not in nodes.stdout  # piped: no terminal codes
    assert len(rows) == 1 and "master" in rows[0]
    models = exo("models", "--json", node=node)
    assert models.returncode == 0
    ids = {m["model_id"] for m in json.loads(models.stdout)["models"]}
    assert MODEL in ids
    unreachable = exo("ps", "--node", "http://127.0.0.1:9")
    assert unreachable.returncode == 3 and "no exo node answers" in unreachable.stderr
    assert exo("pull", "no/such-model", node=node).returncode == 4


def test_pull_shows_a_progress_bar_to_100_percent_then_rm(node: ExoProcess) -> None:
    added = httpx.post(f"{node.url}/models/add", json={"model_id": TINY}, timeout=60)
    assert added.status_code == 201, added.text
    child = spawn("pull", TINY, node=node)
    child.expect("pulling")
    child.expect("100%")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    listed = exo("models", "--downloaded", node=node)
    assert TINY in listed.stdout
    assert exo("rm", TINY, node=node).returncode == 0
    assert TINY not in exo("models", "--downloaded", node=node).stdout
    piped = exo("pull", TINY, node=node)  # piped: plain progress lines
    assert piped.returncode == 0 and f"pulling {TINY}: 100%" in piped.stdout


def test_run_places_the_model_then_chats(node: ExoProcess) -> None:
    once = exo("run", MODEL, "Say", "hello", "--max-tokens", "8", node=node)
    assert once.returncode == 0, once.stderr
    assert "runners: ready" in once.stdout and once.stdout.strip().splitlines()[-1]
    ps = exo("ps", node=node)
    header, row = ps.stdout.splitlines()[:2]
    assert header.split("\t")[4:6] == ["RUNNERS", "STARTUP"]
    assert MODEL in row and "ready" in row and float(row.split("\t")[5].rstrip("s")) > 0
    # The runner's resident memory, once the node's telemetry (every 5 s) reported it.
    memory = lambda: exo("ps", node=node).stdout.splitlines()[1].split("\t")[7]  # noqa: E731
    wait_until(lambda: memory() != "-", timeout=60)
    assert memory().endswith(("MB", "GB")), memory()
    child = spawn("run", MODEL, "--max-tokens", "8", node=node)
    child.expect(">>> ")
    child.sendline("What is the capital of France?")
    child.expect(">>> ")
    answer = child.before or ""
    assert len(answer.strip()) > len("What is the capital of France?")
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_place_shows_previews(node: ExoProcess) -> None:
    placed = exo("place", MODEL, "--sharding", "pipeline", "--no-wait", "--json", node=node)
    assert placed.returncode == 0, placed.stderr
    answer = json.loads(placed.stdout)
    assert answer["previews"]["previews"] and answer["instance"]["model_id"] == MODEL
    too_many = exo("place", MODEL, "--min-nodes", "5", node=node)
    assert too_many.returncode == 1 and too_many.stderr


def _long_prompt(topic: str) -> str:
    sentence = f"Here is one more sentence about {topic} and the weather in the hills. "
    return sentence * 40 + "Summarise it in a word."


def test_a_long_prompt_shows_prefill_progress_before_the_first_token(node: ExoProcess) -> None:
    child = spawn("run", MODEL, _long_prompt("apples"), "--max-tokens", "4", node=node)
    child.expect("reading the prompt")  # the bar, on the terminal
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    # On the wire: SSE comments with growing counts, all before the first token.
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": _long_prompt("pears")}],
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    progress: list[tuple[int, int]] = []
    first_token_after = None
    usage = None
    with httpx.stream("POST", f"{node.url}/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith(": prefill "):
                done, total = line.removeprefix(": prefill ").split("/")
                progress.append((int(done), int(total)))
            elif line.startswith("data: {"):
                chunk = json.loads(line.removeprefix("data: "))
                usage = chunk.get("usage") or usage
                deltas = [c["delta"].get("content") for c in chunk["choices"]]
                if any(deltas) and first_token_after is None:
                    first_token_after = len(progress)
    assert usage is not None and usage["prompt_tokens"] > 4 * PREFILL_STEP
    assert len(progress) >= 3 and first_token_after == len(progress), progress
    assert {total for _, total in progress} == {usage["prompt_tokens"]}
    done = [d for d, _ in progress]
    assert done == sorted(done) and done[0] >= PREFILL_STEP and done[-1] < usage["prompt_tokens"]
