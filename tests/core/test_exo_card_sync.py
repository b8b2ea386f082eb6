"""scripts/sync_exo_cards.py: what changed in exo's card files, field by field, and --write."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "scripts" / "sync_exo_cards.py"
EXO_COPY = ROOT / "resources" / "model_cards" / "exo"
QWEN = "inference_model_cards/mlx-community--Qwen3.5-9B-4bit.toml"
GONE = "inference_model_cards/mlx-community--Llama-3.2-1B-Instruct-4bit.toml"
NEW_CARD = """model_id = "mlx-community/Brand-New-4bit"
n_layers = 10
hidden_size = 512
num_key_value_heads = 2
supports_tensor = true
tasks = ["TextGeneration"]
family = "brand"
quantization = "4bit"
base_model = "Brand New"
capabilities = ["text"]
backends = ["MlxCpu"]

[storage_size]
in_bytes = 1000
"""


def run(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60
    )


def test_the_copies_are_exos_and_a_changed_checkout_is_reported_then_taken(
    tmp_path: Path,
) -> None:
    cards = tmp_path / "model_cards"
    shutil.copytree(EXO_COPY, cards / "exo")
    exo = tmp_path / "exo-checkout" / "resources"
    shutil.copytree(EXO_COPY, exo, ignore=shutil.ignore_patterns("additions.toml"))
    same = run(exo.parent, "--cards", cards, "--check")
    assert same.returncode == 0 and "are the same" in same.stdout

    qwen = exo / QWEN
    qwen.write_text(
        qwen.read_text()
        .replace("in_bytes = 5950062560", "in_bytes = 5950062561")
        .replace("presence_penalty = 1.5\n", "", 1)
    )
    (exo / GONE).unlink()
    (exo / "inference_model_cards" / "mlx-community--Brand-New-4bit.toml").write_text(NEW_CARD)

    changed = run(exo.parent, "--cards", cards, "--check")
    assert changed.returncode == 1, changed.stderr
    out = changed.stdout
    assert "added in exo (1):\n  mlx-community/Brand-New-4bit" in out
    assert "removed from exo (1):\n  mlx-community/Llama-3.2-1B-Instruct-4bit" in out
    assert "storage_size.in_bytes: 5950062560 -> 5950062561" in out
    assert "sampling_defaults.presence_penalty: 1.5 -> None" in out
    assert "additions.toml does not name yet" in out and "  Brand New" in out

    written = run(exo, "--cards", cards, "--write")  # exo's resources/ itself works too
    assert written.returncode == 0 and "wrote exo's card files" in written.stdout
    assert (cards / "exo" / QWEN).read_text() == qwen.read_text()
    assert not (cards / "exo" / GONE).exists()
    after = run(exo.parent, "--cards", cards).stdout
    assert "added in exo" not in after and "changed in exo" not in after
    assert "Brand New" in after  # its architecture is still ours to add


def test_not_an_exo_checkout_is_refused(tmp_path: Path) -> None:
    refused = run(tmp_path)
    assert refused.returncode == 2 and "not an exo checkout" in refused.stderr
