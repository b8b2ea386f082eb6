"""A fast BLAS for MLX's CPU backend, and a dense fp32 fast path.

The `mlx-cpu` wheel links a reference BLAS (fp32 GEMM ~4 GFLOP/s). libmlx imports
`cblas_sgemm`/`cblas_dgemm`/`cblas_cgemm` dynamically, so an optimized library loaded with
LD_PRELOAD in the runner subprocess replaces them transparently (~30-50x faster).

Candidates, best first:
1. Intel MKL from the `mkl` PyPI wheel (`libmkl_rt.so.*` under sys.prefix/lib): plain names.
2. A system OpenBLAS (Debian's `libopenblas0`): plain names.
3. `scipy-openblas32` from PyPI: its symbols carry a `scipy_` prefix, so we generate (in pure
   Python, no compiler) a tiny ELF shim that exports the three plain names and jumps to the
   prefixed ones. That keeps the install within `uv sync` at ~26 MB.

EXO_BLAS=off|auto|<path> overrides the choice; EXO_DENSE=auto|on|off the dense fast path.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

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
