"""Download one model into a directory, as a process of its own (killed by a test).

Usage: python fetch_model.py <models_dir> <repo>   (HF_ENDPOINT names the hub)
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio

from exo_core.plugin import ModelCard, ModelId
from exo_download_hf.dirs import ModelDirs
from exo_download_hf.downloader import HfDownloader


def main() -> None:
    models, repo = Path(sys.argv[1]), sys.argv[2]
    card = ModelCard(
        model_id=ModelId(repo),
        family="llama",
        n_layers=1,
        hidden_size=1,
        storage_size_bytes=1,
        source=f"hf:{repo}",
    )
    downloader = HfDownloader(ModelDirs(writable=(models,)))
    path = anyio.run(downloader.ensure, card, lambda p: print(p.status, p.downloaded_bytes))
    print(f"done {path}", flush=True)


if __name__ == "__main__":
    main()
