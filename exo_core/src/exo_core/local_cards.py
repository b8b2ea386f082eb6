"""Cards of the models in the models directory, found again while the node runs.

A model written into the models directory (`python -m exo_engine_mflux.tiny_model`,
`exo import-gguf`, a copy) is served without a restart: the node polls the directory and asks
the plugins' card hooks again only when something there changed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import anyio
from loguru import logger

from exo_core.ids import ModelId
from exo_core.model_cards import ModelCard

# Well within the 10 s a user waits for a model written into the directory to appear.
RESCAN_INTERVAL_S = 2.0

Fingerprint = tuple[tuple[str, int, int], ...]


def models_dir_fingerprint(models_dir: Path) -> Fingerprint:
    """What changes when a model or its card is written: each model directory's name and
    mtime, and the size and mtime of every JSON file directly inside it. Cards and configs are
    JSON; weights are not looked at, so a download in progress does not rescan every time."""
    entries: list[tuple[str, int, int]] = []
    try:
        children = list(os.scandir(models_dir))
    except OSError:
        return ()
    for child in children:
        try:
            if not child.is_dir():
                continue
            entries.append((child.name, child.stat().st_mtime_ns, 0))
            for f in os.scandir(child.path):
                if f.name.endswith(".json") and f.is_file():
                    st = f.stat()
                    entries.append((f"{child.name}/{f.name}", st.st_mtime_ns, st.st_size))
        except OSError:
            continue  # removed while we looked: the next poll sees the directory as it is
    return tuple(sorted(entries))


def added_and_removed(
    before: dict[ModelId, ModelCard], after: dict[ModelId, ModelCard]
) -> tuple[list[ModelId], list[ModelId]]:
    return sorted(after.keys() - before.keys()), sorted(before.keys() - after.keys())


async def watch_models_dir(
    models_dir: Path,
    rescan: Callable[[], dict[ModelId, ModelCard]],
    current: Callable[[], dict[ModelId, ModelCard]],
    install: Callable[[dict[ModelId, ModelCard]], None],
    interval: float = RESCAN_INTERVAL_S,
) -> None:
    """Poll `models_dir`; on a change, `rescan` (in a thread: hooks read files) and `install`
    the cards found. Runs until cancelled."""
    seen = await anyio.to_thread.run_sync(models_dir_fingerprint, models_dir)
    while True:
        await anyio.sleep(interval)
        now = await anyio.to_thread.run_sync(models_dir_fingerprint, models_dir)
        if now == seen:
            continue
        seen = now
        try:
            cards = await anyio.to_thread.run_sync(rescan)
        except Exception as e:  # a plugin's bad answer must not end a running node
            logger.warning(f"the model cards were not read again: {e!r}")
            continue
        added, removed = added_and_removed(current(), cards)
        install(cards)
        if added or removed:
            logger.info(
                f"models directory changed: {len(added)} model(s) added "
                f"({', '.join(added) or '-'}), {len(removed)} removed ({', '.join(removed) or '-'})"
            )
