"""A data directory lock that could not be taken leaves nothing behind to fail later: the
refused `DataDirLock`'s clean-up on garbage collection raises nothing (it printed an
`AttributeError` traceback after the clear "in use" message)."""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Any

import pytest

from exo_core.datadir import DataDirInUse, DataDirLock


def test_a_refused_lock_is_collected_without_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raised: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", raised.append)
    held = DataDirLock(tmp_path)
    with pytest.raises(DataDirInUse, match="in use by pid"):
        DataDirLock(tmp_path)
    gc.collect()
    assert raised == []
    assert held.held
    held.release()
    assert not held.held
