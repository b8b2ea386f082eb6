"""The models directory watch (exo_core.local_cards): what counts as a change, and that a
change rescans while a failing rescan leaves the node's cards as they were."""

from __future__ import annotations

from pathlib import Path

import anyio

from exo_core.ids import ModelId
from exo_core.local_cards import models_dir_fingerprint, watch_models_dir
from exo_core.model_cards import ModelCard


def _card(model_id: str) -> ModelCard:
    return ModelCard(
        model_id=ModelId(model_id), family="x", n_layers=1, hidden_size=1, storage_size_bytes=1
    )


def test_a_card_or_a_new_model_dir_changes_the_fingerprint_but_weights_do_not(
    tmp_path: Path,
) -> None:
    assert models_dir_fingerprint(tmp_path / "missing") == ()
    model = tmp_path / "m"
    model.mkdir()
    before = models_dir_fingerprint(tmp_path)
    (model / "exo-card.json").write_text("{}")
    with_card = models_dir_fingerprint(tmp_path)
    assert with_card != before
    (model / "exo-card.json").write_text('{"changed": 1}')
    assert models_dir_fingerprint(tmp_path) != with_card
    (model / "model.safetensors").touch()  # a new file changes the directory's mtime once
    settled = models_dir_fingerprint(tmp_path)
    with (model / "model.safetensors").open("ab") as f:  # a download growing does not
        f.write(b"\0" * 1000)
    assert models_dir_fingerprint(tmp_path) == settled


def test_a_change_installs_the_rescanned_cards_and_a_failing_rescan_is_skipped(
    tmp_path: Path,
) -> None:
    installed: list[set[str]] = []
    answers: list[object] = [RuntimeError("a plugin broke"), {ModelId("a"): _card("a")}]

    def rescan() -> dict[ModelId, ModelCard]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, dict)
        return answer

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: watch_models_dir(
                    tmp_path, rescan, dict, lambda c: installed.append(set(c)), interval=0.05
                )
            )
            await anyio.sleep(0.2)
            (tmp_path / "one").mkdir()
            await anyio.sleep(0.3)
            (tmp_path / "two").mkdir()
            with anyio.fail_after(5):
                while not installed:
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()

    anyio.run(main)
    assert installed == [{"a"}]
