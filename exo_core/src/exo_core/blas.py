"""A fast BLAS for MLX's CPU backend, for any engine whose runners are subprocesses.

The `mlx-cpu` wheel links a reference BLAS (fp32 GEMM ~4 GFLOP/s). libmlx imports
`cblas_sgemm`/`cblas_dgemm`/`cblas_cgemm` dynamically, so an optimized library loaded with
LD_PRELOAD in a runner subprocess replaces them transparently (~30-50x faster). Engines call
`runner_env()` for their runners' environment (the MLX text engine and the mflux image engine
both do); nothing here imports MLX.

Candidates, in order of measured speed (bench/bench_blas.py, 2 cores x86_64):
1. `scipy-openblas32` from PyPI (~26 MB, no libgfortran needed): its symbols carry a
   `scipy_` prefix, so we generate, in pure Python (no compiler), a tiny ELF shim that exports
   the plain names and jumps to the prefixed ones. ~160-200 GFLOP/s.
2. Intel MKL from the `mkl` PyPI wheel, if installed (~1 GB): plain names. ~180-190 GFLOP/s.
3. A system OpenBLAS (Debian's `libopenblas0`): plain names. ~130-167 GFLOP/s.

EXO_BLAS=off|auto|<path> overrides the choice, EXO_BLAS_THREADS its thread count.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import platform
import struct
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Mapping
from pathlib import Path

from exo_core.config import cache_dir

# The only BLAS symbols libmlx imports (checked with `nm -D --undefined-only libmlx.so`);
# LAPACK routines stay on the bundled reference library, they are not on the hot path.
GEMM_SYMBOLS = ("cblas_sgemm", "cblas_dgemm", "cblas_cgemm")
SHIM_VERSION = 1

_SYSTEM_OPENBLAS = (
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
)


# ---------------------------------------------------------------- ELF shim (x86_64 only)


def _elf_hash(name: bytes) -> int:
    h = 0
    for c in name:
        h = ((h << 4) + c) & 0xFFFFFFFF
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
        h &= ~g & 0xFFFFFFFF
    return h


def build_prefix_shim(target: str, prefix: str, names: tuple[str, ...] = GEMM_SYMBOLS) -> bytes:
    """An x86_64 ELF shared object exporting `names`, each jumping to `prefix+name` in `target`.

    Layout: one R+X segment (headers, hash, dynsym, dynstr, rela, stubs) and one RW segment
    (dynamic, GOT) a page further on. Each stub is `jmp *GOT[i](%rip)`; GOT[i] is filled by
    an R_X86_64_GLOB_DAT relocation against the prefixed symbol. `target` goes into DT_NEEDED
    as an absolute path, so no RPATH is needed.
    """
    page = 0x10000
    n = len(names)
    # dynstr
    strtab = bytearray(b"\0")

    def add_str(s: str) -> int:
        off = len(strtab)
        strtab.extend(s.encode() + b"\0")
        return off

    needed_off = add_str(target)
    soname_off = add_str("libexo_blas_shim.so")
    undef_off = [add_str(prefix + nm) for nm in names]
    def_off = [add_str(nm) for nm in names]
    # dynsym: 0 null, 1..n undefined prefixed, n+1..2n defined plain
    nsyms = 1 + 2 * n
    ehdr_size, phdr_size, nph = 64, 56, 4
    hash_off = ehdr_size + nph * phdr_size
    nbucket = 7
    hash_size = 4 * (2 + nbucket + nsyms)
    dynsym_off = (hash_off + hash_size + 7) & ~7
    dynstr_off = dynsym_off + 24 * nsyms
    rela_off = (dynstr_off + len(strtab) + 7) & ~7
    text_off = (rela_off + 24 * n + 15) & ~15
    stub_size = 8
    text_end = text_off + stub_size * n
    data_off = page
    dyn_entries = 11
    got_off = data_off + 16 * dyn_entries
    file_size = got_off + 8 * n

    def stub_addr(i: int) -> int:
        return text_off + stub_size * i

    # symbols (STB_GLOBAL<<4 | STT_FUNC) = 0x12; any non-zero section index marks "defined"
    syms = bytearray(24)
    for off in undef_off:
        syms += struct.pack("<IBBHQQ", off, 0x12, 0, 0, 0, 0)
    for i, off in enumerate(def_off):
        syms += struct.pack("<IBBHQQ", off, 0x12, 0, 1, stub_addr(i), stub_size)
    sym_names = [b""] + [(prefix + nm).encode() for nm in names] + [nm.encode() for nm in names]
    buckets = [0] * nbucket
    chains = [0] * nsyms
    for idx in range(1, nsyms):
        b = _elf_hash(sym_names[idx]) % nbucket
        chains[idx] = buckets[b]
        buckets[b] = idx
    hash_tab = struct.pack(f"<{2 + nbucket + nsyms}I", nbucket, nsyms, *buckets, *chains)
    rela = b"".join(
        struct.pack("<QQq", got_off + 8 * i, ((1 + i) << 32) | 6, 0)  # R_X86_64_GLOB_DAT
        for i in range(n)
    )
    text = bytearray()
    for i in range(n):
        disp = (got_off + 8 * i) - (stub_addr(i) + 6)
        text += b"\xff\x25" + struct.pack("<i", disp) + b"\xcc\xcc"
    dyn = [
        (1, needed_off),  # DT_NEEDED
        (14, soname_off),  # DT_SONAME
        (4, hash_off),  # DT_HASH
        (5, dynstr_off),  # DT_STRTAB
        (6, dynsym_off),  # DT_SYMTAB
        (10, len(strtab)),  # DT_STRSZ
        (11, 24),  # DT_SYMENT
        (7, rela_off),  # DT_RELA
        (8, 24 * n),  # DT_RELASZ
        (9, 24),  # DT_RELAENT
        (0, 0),  # DT_NULL
    ]
    assert len(dyn) == dyn_entries
    dynamic = b"".join(struct.pack("<qQ", t, v) for t, v in dyn)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    ehdr = ident + struct.pack(
        "<HHIQQQIHHHHHH", 3, 62, 1, 0, ehdr_size, 0, 0, ehdr_size, phdr_size, nph, 64, 0, 0
    )
    data_size = file_size - data_off
    phdrs = b"".join(
        [
            struct.pack("<IIQQQQQQ", 1, 5, 0, 0, 0, text_end, text_end, page),  # PT_LOAD r-x
            struct.pack(
                "<IIQQQQQQ", 1, 6, data_off, data_off, data_off, data_size, data_size, page
            ),  # PT_LOAD rw-
            struct.pack(
                "<IIQQQQQQ", 2, 6, data_off, data_off, data_off, len(dynamic), len(dynamic), 8
            ),  # PT_DYNAMIC
            struct.pack("<IIQQQQQQ", 0x6474E551, 6, 0, 0, 0, 0, 0, 16),  # PT_GNU_STACK rw-
        ]
    )
    out = bytearray(file_size)
    for off, blob in (
        (0, ehdr + phdrs),
        (hash_off, hash_tab),
        (dynsym_off, bytes(syms)),
        (dynstr_off, bytes(strtab)),
        (rela_off, rela),
        (text_off, bytes(text)),
        (data_off, dynamic),
    ):
        out[off : off + len(blob)] = blob
    return bytes(out)


# ---------------------------------------------------------------- finding a fast BLAS


def _cache_dir(env: Mapping[str, str]) -> Path:
    return cache_dir(env) / "blas"


def _scipy_openblas() -> Path | None:
    # find_spec locates the package without importing it (importing is harmless, but slower).
    spec = importlib.util.find_spec("scipy_openblas32")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        lib = Path(loc) / "lib" / "libscipy_openblas.so"
        if lib.is_file():
            return lib
    return None


def _mkl() -> Path | None:
    # The `mkl` wheel puts libmkl_rt.so.<N> into <prefix>/lib.
    libdir = Path(sysconfig.get_config_var("LIBDIR") or Path(sys.prefix) / "lib")
    for d in dict.fromkeys([Path(sys.prefix) / "lib", libdir]):
        found = sorted(d.glob("libmkl_rt.so.*"))
        if found:
            return found[-1]
    return None


def shim_for(target: Path, env: Mapping[str, str]) -> Path:
    """The prefix shim for `target` in the cache directory, generated once (atomically)."""
    st = target.stat()
    key = hashlib.sha256(f"{SHIM_VERSION}:{target}:{st.st_size}:{st.st_mtime_ns}".encode())
    out = _cache_dir(env) / f"libexo_blas_shim-{key.hexdigest()[:16]}.so"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(build_prefix_shim(str(target), "scipy_"))
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
    return out


@functools.lru_cache(maxsize=16)
def preload_works(lib: str) -> bool:
    """True if a process started with LD_PRELOAD=lib runs and sees an exported cblas_sgemm.

    A preloaded library whose dependencies are missing aborts every process that loads it
    (e.g. an OpenBLAS needing a system libgfortran), so we test it in a throwaway child.
    """
    env = {**os.environ, "LD_PRELOAD": lib}
    code = "import ctypes; ctypes.CDLL(None).cblas_sgemm"
    try:
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and b"cannot be preloaded" not in r.stderr


def candidates(env: Mapping[str, str] | None = None) -> list[tuple[str, Path]]:
    """(label, library) of the fast BLAS libraries present, in order of measured speed."""
    env = os.environ if env is None else env
    found: list[tuple[str, Path]] = []
    if platform.machine() in ("x86_64", "AMD64") and (lib := _scipy_openblas()) is not None:
        with contextlib.suppress(OSError):  # unwritable cache: fall through to the others
            found.append(("scipy-openblas32+shim", shim_for(lib, env)))
    if (mkl := _mkl()) is not None:
        found.append(("MKL (mkl wheel)", mkl))
    seen: set[str] = set()
    for p in _SYSTEM_OPENBLAS:
        real = os.path.realpath(p)  # Debian's alternatives symlink several names to one file
        if os.path.isfile(real) and real not in seen:
            seen.add(real)
            found.append(("system OpenBLAS", Path(p)))
    return found


def find_fast_blas(env: Mapping[str, str] | None = None) -> Path | None:
    """The library to LD_PRELOAD into a runner, or None (off, not Linux, or nothing usable).

    EXO_BLAS: `off` disables; `auto` (default) picks the fastest working candidate; any other
    value is a path used as given (it must exist).
    """
    env = os.environ if env is None else env
    mode = env.get("EXO_BLAS", "auto").strip()
    if mode.lower() in ("off", "0", "no", "false", "none"):
        return None
    if mode and mode.lower() != "auto":
        path = Path(mode).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"EXO_BLAS={mode}: no such file")
        return path
    if sys.platform != "linux":
        return None  # macOS MLX uses Accelerate; Windows has no LD_PRELOAD
    for _, lib in candidates(env):
        if preload_works(str(lib)):
            return lib
    return None


def blas_threads(env: Mapping[str, str] | None = None) -> int:
    """BLAS threads for a runner: EXO_BLAS_THREADS, else all usable cores but one.

    OpenBLAS threads busy-wait between calls; when they compete for cores (with MLX's own
    threads, the node, anything else) decode collapses: measured on 2 busy cores, decode fell
    from 9 tok/s with 1 thread to 2 tok/s with 2. Leaving a core free avoids that.
    """
    env = os.environ if env is None else env
    if value := env.get("EXO_BLAS_THREADS", "").strip():
        return max(1, int(value))
    return max(1, usable_cores() - 1)


def usable_cores() -> int:
    """Cores this process may run on: its affinity mask (a container or taskset may allow
    fewer than the machine has), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def runner_env(base_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a runner subprocess: `base_env` plus LD_PRELOAD of a fast BLAS.

    Thread counts already set in `base_env` (OPENBLAS_NUM_THREADS, MKL_NUM_THREADS) win.
    """
    env = dict(os.environ if base_env is None else base_env)
    lib = find_fast_blas(env)
    if lib is None:
        return env
    preload = [p for p in env.get("LD_PRELOAD", "").split(":") if p and p != str(lib)]
    env["LD_PRELOAD"] = ":".join([str(lib), *preload])
    env["EXO_BLAS_ACTIVE"] = str(lib)
    threads = str(blas_threads(env))
    for var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, threads)
    return env


def loaded_blas() -> str | None:
    """Path of a fast BLAS mapped into this process, if any (Linux, for logs and checks)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        name = os.path.basename(path)
        if name.startswith(("libexo_blas_shim", "libmkl_rt", "libopenblas")):
            return path
    return None
