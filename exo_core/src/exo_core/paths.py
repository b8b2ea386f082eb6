"""Where a model id may lead on disk: the one check between a name and a path.

Model ids arrive from HTTP routes, peers' commands, the event log and the command line, and
become directory names below a models directory, some of which are later deleted. So every
such path is made here, and only here: `model_path(root, name)` answers a path that is a
strict child of `root` once every symlink is followed, or raises `UnsafeModelPath`. Names
with `.`, `..` or empty parts, absolute names, backslashes, control characters and
percent-encoded forms (a route may hand over `%2E%2E` undecoded, or decode it twice) are
refused before the disk is consulted.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import unquote

# Longer than any hub repo id (96 characters for org/name), short enough for every filesystem.
MAX_MODEL_ID = 200


class UnsafeModelPath(ValueError):
    """A model id or path that could leave its models directory; the message says why."""


def model_id_problem(model_id: str) -> str | None:
    """Why `model_id` may not name a directory below a models directory, or None."""
    if not model_id:
        return "it is empty"
    if len(model_id) > MAX_MODEL_ID:
        return f"it is longer than {MAX_MODEL_ID} characters"
    if any(ord(c) < 32 or c == "\x7f" for c in model_id):
        return "it contains a control character"
    if "\\" in model_id:
        return "it contains a backslash"
    if unquote(model_id) != model_id:
        return "it contains a percent-encoded character"
    if model_id.startswith("/"):
        return "it is an absolute path"
    parts = model_id.split("/")
    if any(p == "" for p in parts):
        return "it has an empty path part"
    if any(p in (".", "..") for p in parts):
        return "it has a '.' or '..' path part"
    return None


def is_safe_model_id(model_id: str) -> bool:
    """True when a model id is safe to use as a directory name (see `model_id_problem`)."""
    return model_id_problem(model_id) is None


def check_model_id(model_id: str) -> str:
    """`model_id` itself, when it is safe as a path below a models directory."""
    problem = model_id_problem(model_id)
    if problem is not None:
        raise UnsafeModelPath(f"'{model_id}' is not a valid model id: {problem}")
    return model_id


def model_path(root: Path, name: str) -> Path:
    """`root / name`, when that is a strict child of `root` with every symlink followed.

    `name` is a model id or a directory name made from one (`org--name`, `org/name`)."""
    check_model_id(name)
    candidate = root / name
    real_root = root.resolve()
    real = candidate.resolve()
    if real == real_root or not real.is_relative_to(real_root):
        raise UnsafeModelPath(f"{candidate} leads to {real}, outside the models directory {root}")
    return candidate


def remove_model_dir(root: Path, path: Path) -> None:
    """Delete the model directory `path`, which must be a strict child of `root` (checked
    again here, just before the deletion, and never through a symlink)."""
    if path.parent != root:
        raise UnsafeModelPath(f"{path} is not directly inside the models directory {root}")
    checked = model_path(root, path.name)
    if checked.is_symlink():
        raise UnsafeModelPath(f"{checked} is a symlink: exo deletes only its own directories")
    shutil.rmtree(checked)


__all__ = [
    "MAX_MODEL_ID",
    "UnsafeModelPath",
    "check_model_id",
    "is_safe_model_id",
    "model_id_problem",
    "model_path",
    "remove_model_dir",
]
