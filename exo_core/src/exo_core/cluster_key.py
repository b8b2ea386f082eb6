"""The cluster key: the secret that keeps machines that were not invited out of the cluster.

Every node of a cluster holds the same key. The transport derives its private-network key from
it and the namespace (`network_key`), so a machine without it fails the very first handshake and
never learns a node's identity; runner groups derive their ring token from it (`derive`).

Where the key comes from, first match wins (`resolve`):

1. `--cluster-key` / `EXO_CLUSTER_KEY`; it is then saved in the data directory, so later starts
   need not repeat it;
2. the key file `<data dir>/cluster.key`;
3. nothing, on a node whose transport listens on loopback only (no other machine can reach
   it): the network is keyed by the namespace alone, as before keys existed;
4. otherwise a fresh key, written to the key file and printed once: copy it to the other
   machines. Two fresh machines therefore do not join until the key is copied; that is the
   point (anyone on the same network could join otherwise).

`--no-cluster-key` keeps the network open on purpose: any machine that reaches the port can
join, and the node says so loudly at start-up.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

KEY_FILE = "cluster.key"
ENV_VAR = "EXO_CLUSTER_KEY"


class ClusterKeyError(ValueError):
    """The key given or found cannot be used (empty, or an unreadable key file)."""


@dataclass(frozen=True)
class ClusterKey:
    """The key a node runs with; `secret` None is an open network (namespace only)."""

    secret: str | None
    # Where it came from: "option", "file", "generated", "loopback" or "open".
    source: str


def generate() -> str:
    """A new key: 32 random bytes, URL-safe (it is pasted into shells and env files)."""
    return secrets.token_urlsafe(32)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def network_key(namespace: str, secret: str | None) -> bytes:
    """The 32-byte private-network key. Without a secret it is the namespace's alone (what
    every exo computed before cluster keys; anyone who knows the namespace can compute it)."""
    if secret is None:
        return hashlib.sha256(f"exo-namespace:{namespace}".encode()).digest()
    return derive(secret, f"exo-pnet:{namespace}")


def derive(secret: str | None, label: str) -> bytes:
    """A 32-byte key for one purpose (`label`), from the cluster key; with no cluster key, from
    the label alone (so it separates purposes but keeps nobody out)."""
    return hmac.new((secret or "").encode(), label.encode(), hashlib.sha256).digest()


def _read(path: Path) -> str:
    try:
        secret = path.read_text().strip()
    except OSError as e:
        raise ClusterKeyError(f"cannot read the cluster key file {path}: {e.strerror}") from e
    if not secret:
        raise ClusterKeyError(f"the cluster key file {path} is empty")
    return secret


def _write(path: Path, secret: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def resolve(data_dir: Path, listen_host: str, given: str | None, open_network: bool) -> ClusterKey:
    """The key this node runs with (see the module docstring for the order)."""
    path = data_dir / KEY_FILE
    if open_network:
        return ClusterKey(None, "open")
    if given is not None:
        secret = given.strip()
        if not secret:
            raise ClusterKeyError("the cluster key is empty")
        if not path.exists() or _read(path) != secret:
            _write(path, secret)
        return ClusterKey(secret, "option")
    if path.exists():
        return ClusterKey(_read(path), "file")
    if is_loopback(listen_host):
        return ClusterKey(None, "loopback")
    secret = generate()
    _write(path, secret)
    return ClusterKey(secret, "generated")


def announce(key: ClusterKey, data_dir: Path) -> None:
    """Say at start-up who can join this node's cluster."""
    path = data_dir / KEY_FILE
    match key.source:
        case "generated":
            logger.warning(
                "\n"
                f"  A new cluster key was created in {path}.\n"
                "  Only machines with this key can join this node's cluster. On every other\n"
                "  machine, start exo once with it (it is then saved there too):\n\n"
                f"      EXO_CLUSTER_KEY={key.secret} exo ...\n"
            )
        case "open":
            logger.warning(
                "\n"
                "  !!! NO CLUSTER KEY (--no-cluster-key): ANY MACHINE THAT CAN REACH THIS NODE'S\n"
                "  !!! PORT CAN JOIN THE CLUSTER, READ ITS STATE AND RUN ITS COMMANDS.\n"
                "  Use it only on a network you trust; see `exo --help` for --cluster-key.\n"
            )
        case "loopback":
            logger.info("no cluster key: the transport listens on loopback only")
        case _:
            logger.info(
                f"cluster key from {'the command line' if key.source == 'option' else path}"
            )
