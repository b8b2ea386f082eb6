"""Where the cluster key comes from, and what it keys (`exo_core.cluster_key`)."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest
from loguru import logger

from exo_core.cli import with_cluster_key
from exo_core.cluster_key import (
    KEY_FILE,
    ClusterKeyError,
    derive,
    network_key,
    resolve,
)
from exo_core.config import NodeConfig


def test_a_networked_node_without_a_key_creates_one_and_keeps_it(tmp_path: Path) -> None:
    first = resolve(tmp_path, "0.0.0.0", given=None, open_network=False)
    assert first.source == "generated" and first.secret and len(first.secret) >= 40
    path = tmp_path / KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = resolve(tmp_path, "0.0.0.0", given=None, open_network=False)
    assert (again.source, again.secret) == ("file", first.secret)


def test_a_given_key_wins_and_is_saved_for_later_starts(tmp_path: Path) -> None:
    resolve(tmp_path, "0.0.0.0", given=None, open_network=False)  # a generated one first
    given = resolve(tmp_path, "0.0.0.0", given=" copied-key \n", open_network=False)
    assert (given.source, given.secret) == ("option", "copied-key")
    assert resolve(tmp_path, "0.0.0.0", given=None, open_network=False).secret == "copied-key"


def test_loopback_only_and_open_networks_have_no_key(tmp_path: Path) -> None:
    for host in ("127.0.0.1", "::1", "localhost"):
        key = resolve(tmp_path, host, given=None, open_network=False)
        assert (key.source, key.secret) == ("loopback", None)
    assert not (tmp_path / KEY_FILE).exists()
    assert resolve(tmp_path, "0.0.0.0", given="k", open_network=True).secret is None


def test_an_empty_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ClusterKeyError):
        resolve(tmp_path, "0.0.0.0", given="  ", open_network=False)
    (tmp_path / KEY_FILE).write_text("\n")
    with pytest.raises(ClusterKeyError, match="empty"):
        resolve(tmp_path, "0.0.0.0", given=None, open_network=False)


def test_the_network_key_depends_on_key_and_namespace() -> None:
    # Without a key it is what every exo computed before keys existed.
    assert network_key("default", None) == hashlib.sha256(b"exo-namespace:default").digest()
    keys = {
        network_key(ns, secret) for ns in ("default", "other") for secret in (None, "one", "two")
    }
    assert len(keys) == 6 and all(len(k) == 32 for k in keys)
    assert derive("one", "a") != derive("one", "b") != derive("two", "a")


def test_the_cli_resolves_the_key_for_networked_nodes_and_says_who_can_join(
    tmp_path: Path,
) -> None:
    messages: list[str] = []
    sink = logger.add(lambda m: messages.append(str(m)), level="INFO")
    try:
        networked = NodeConfig(data_dir=str(tmp_path / "a"), listen_host="0.0.0.0")
        keyed = with_cluster_key(networked, None, False)
        saved = (tmp_path / "a" / KEY_FILE).read_text().strip()
        assert keyed.cluster_key == saved
        assert any(f"EXO_CLUSTER_KEY={saved}" in m for m in messages)
        opened = with_cluster_key(networked, None, True)
        assert opened.cluster_key is None
        assert any("ANY MACHINE" in m for m in messages)
        memory = NodeConfig(data_dir=str(tmp_path / "m"), transport="memory")
        assert with_cluster_key(memory, None, False) == memory
        assert not (tmp_path / "m" / KEY_FILE).exists()
    finally:
        logger.remove(sink)
