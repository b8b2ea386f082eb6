"""A test network: N hosts, each in its own network namespace, joined by the link emulator.

    with emulated_network(3, LinkSpec(delay_ms=1)) as net:
        with exo_on_network(net, tmp_path) as nodes:   # exo nodes that meet by mDNS alone
            net.partition([0], [1, 2])
            ...
            net.heal_all()

Host i has a TAP device on the emulated switch with 198.18.0.<i+1>/16 (the benchmarking
range); every link between two hosts is a pair of directional links with their own delay,
jitter, loss, reordering and rate (`LinkSpec`), and any of them can be cut and healed. The
test reaches host i's HTTP API over a separate veth pair (a /30 in 198.19.0.0/16, one block
of addresses per network, picked under a lock), which no rule of the emulator touches.

Needs root (network namespaces, TAP devices), iproute2 and a C compiler; `network_problem()`
says why not when they are missing. Everything is removed on exit, and a network left by a
process that died (kill -9) is removed by the next one. Limits and measured speed: see
docs/testing-network.md."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import ipaddress
import itertools
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from exo_core.testing.linkemu import LinkEmulator, LinkSpec, build
from exo_core.testing.processes import ExoProcess

DATA_NET = ipaddress.ip_network("198.18.0.0/16")
MGMT_NET = ipaddress.ip_network("198.19.0.0/16")
MGMT_BLOCK = 22  # one /22 of 198.19/16 per network: 256 hosts of a /30 each
MAX_HOSTS = 250
PREFIX = "exn"  # every namespace and link we make: exn<pid><letter>...
_NAME = re.compile(rf"^{PREFIX}(\d+)[a-z]")
_LOCK = Path("/tmp/exo-test-network.lock")
_counter = itertools.count()

API_PORT = 52415
LIBP2P_PORT = 4001


def _ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def network_problem() -> str | None:
    """Why this machine cannot run a test network, or None when it can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and TAP devices)"
    if shutil.which("ip") is None:
        return "needs iproute2's ip"
    if not os.path.exists("/dev/net/tun"):
        return "needs /dev/net/tun"
    try:
        build()
    except (RuntimeError, subprocess.CalledProcessError) as e:
        return f"cannot build the link emulator: {e}"
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> None:
    """Remove the namespaces and links of networks whose process is gone (killed mid-test)."""
    for line in _ip("netns", "list").splitlines():
        name = line.split()[0] if line.split() else ""
        match = _NAME.match(name)
        if match and not _alive(int(match.group(1))):
            _delete_namespace(name)
    for line in _ip("-o", "link", "show").splitlines():
        dev = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        match = _NAME.match(dev)
        if match and not _alive(int(match.group(1))):
            _ip("link", "del", dev, check=False)


def _delete_namespace(name: str) -> None:
    """Kill what runs inside, then remove the namespace (its links go with it)."""
    for pid in _ip("netns", "pids", name, check=False).split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    _ip("netns", "del", name, check=False)


def _free_mgmt_block() -> ipaddress.IPv4Network:
    """A /22 of 198.19/16 that no link of this machine has an address in (call under _LOCK)."""
    used = set()
    for line in _ip("-4", "-o", "addr", "show").splitlines():
        addr = ipaddress.ip_interface(line.split()[3]).ip
        if addr in MGMT_NET:
            used.add(int(addr) >> (32 - MGMT_BLOCK))
    for block in MGMT_NET.subnets(new_prefix=MGMT_BLOCK):
        if int(block.network_address) >> (32 - MGMT_BLOCK) not in used:
            return block  # type: ignore[return-value]
    raise RuntimeError("every management block of 198.19.0.0/16 is in use")


@dataclass(frozen=True)
class Host:
    index: int
    namespace: str
    address: str  # on the emulated network (198.18/16)
    api_address: str  # the host's end of its management veth (198.19/16)
    # CPUs the host's processes may run on (empty: any). Emulating machines on one box, a
    # host pinned to its own core computes as a machine of that many cores would.
    cpus: tuple[int, ...] = ()

    def exec_prefix(self) -> list[str]:
        prefix = ["ip", "netns", "exec", self.namespace]
        if self.cpus:
            prefix += ["taskset", "--cpu-list", ",".join(map(str, self.cpus))]
        return prefix


class EmulatedNetwork:
    """The hosts and the emulator of one test network; build it with `emulated_network`."""

    def __init__(self, hosts: list[Host], emulator: LinkEmulator) -> None:
        self.hosts = hosts
        self.emulator = emulator

    def __len__(self) -> int:
        return len(self.hosts)

    def pin(self, index: int, cpus: Sequence[int]) -> None:
        """Run host `index`'s processes started from now on (exo, runners, popen) on `cpus`."""
        self.hosts[index] = dataclasses.replace(self.hosts[index], cpus=tuple(cpus))

    def set_link(self, spec: LinkSpec, a: int | None = None, b: int | None = None) -> None:
        """Set the link between a and b (None: every host), both directions."""
        self.emulator.set(spec, a, b)
        if a != b:
            self.emulator.set(spec, b, a)

    def cut(self, a: int, b: int) -> None:
        self.emulator.cut(a, b)
        self.emulator.cut(b, a)

    def heal(self, a: int, b: int) -> None:
        self.emulator.heal(a, b)
        self.emulator.heal(b, a)

    def isolate(self, a: int) -> None:
        """Cut every link of host a."""
        self.emulator.cut(a, None)
        self.emulator.cut(None, a)

    def partition(self, *groups: Iterable[int]) -> None:
        """Cut every link between hosts of different groups; hosts in no group are isolated."""
        group_of = {h: g for g, members in enumerate(groups) for h in members}
        for a, b in itertools.permutations(range(len(self.hosts)), 2):
            if group_of.get(a, -1 - a) != group_of.get(b, -1 - b):
                self.emulator.cut(a, b)

    def heal_all(self) -> None:
        self.emulator.heal(None, None)

    def stats(self) -> dict[str, int]:
        return self.emulator.stats()

    def popen(self, index: int, argv: Sequence[str], **kwargs: object) -> subprocess.Popen[bytes]:
        """Run argv inside host `index`'s namespace."""
        return subprocess.Popen([*self.hosts[index].exec_prefix(), *argv], **kwargs)  # type: ignore[call-overload]


@contextlib.contextmanager
def emulated_network(
    size: int, link: LinkSpec = LinkSpec(), seed: int = 0
) -> Iterator[EmulatedNetwork]:
    """`size` hosts on one emulated switch, every link set to `link`; all removed on exit."""
    if not 1 <= size <= MAX_HOSTS:
        raise ValueError(f"a test network has 1 to {MAX_HOSTS} hosts")
    if (problem := network_problem()) is not None:
        raise RuntimeError(f"no test network here: {problem}")
    sweep_stale()
    tag = f"{PREFIX}{os.getpid()}{chr(97 + next(_counter) % 26)}"
    namespaces: list[str] = []
    emulator: LinkEmulator | None = None
    try:
        taps = [f"{tag}t{i}" for i in range(size)]
        emulator = LinkEmulator(taps, seed=seed)
        hosts: list[Host] = []
        with _LOCK.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two networks made at once pick different blocks
            block = _free_mgmt_block()
            for i in range(size):
                ns = f"{tag}-{i}"
                _ip("netns", "add", ns)
                namespaces.append(ns)
                hosts.append(_wire_host(i, ns, taps[i], tag, block))
        net = EmulatedNetwork(hosts, emulator)
        net.set_link(link)
        yield net
    finally:
        for ns in namespaces:
            _delete_namespace(ns)
        if emulator is not None:
            emulator.close()


def _wire_host(i: int, ns: str, tap: str, tag: str, block: ipaddress.IPv4Network) -> Host:
    address = str(DATA_NET.network_address + i + 1)
    _ip("link", "set", tap, "netns", ns)
    _ip("-n", ns, "addr", "add", f"{address}/{DATA_NET.prefixlen}", "dev", tap)
    _ip("-n", ns, "link", "set", tap, "up")
    _ip("-n", ns, "link", "set", "lo", "up")
    # No default route: mDNS's multicast leaves through the emulated switch, the only way out.
    _ip("-n", ns, "route", "add", "224.0.0.0/4", "dev", tap)
    outer, inner = f"{tag}m{i}", f"{tag}v{i}"
    root_side = block.network_address + 4 * i + 1
    _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
    _ip("link", "set", inner, "netns", ns)
    _ip("addr", "add", f"{root_side}/30", "dev", outer)
    _ip("link", "set", outer, "up")
    _ip("-n", ns, "addr", "add", f"{root_side + 1}/30", "dev", inner)
    _ip("-n", ns, "link", "set", inner, "up")
    return Host(index=i, namespace=ns, address=address, api_address=str(root_side + 1))


@contextlib.contextmanager
def exo_on_network(
    net: EmulatedNetwork,
    root: Path,
    extra_args: Sequence[Sequence[str]] = (),
    env: dict[str, str] | None = None,
    cluster_key: str = "exo-test-network-key",
    namespace: str = "test-network",
) -> Iterator[list[ExoProcess]]:
    """One exo process per host, started together: no bootstrap peers, so they find each
    other by mDNS alone; the transport listens on the emulated network only, the API on the
    management link only. `extra_args[i]` is added to node i's command line."""
    nodes: list[ExoProcess] = []
    try:
        for host in net.hosts:
            data = root / f"node{host.index}"
            data.mkdir(parents=True, exist_ok=True)
            args = [
                "--api-host", host.api_address, "--api-port", str(API_PORT),
                "--data-dir", str(data), "--namespace", namespace,
                "--listen-host", host.address, "--libp2p-port", str(LIBP2P_PORT),
                "--cluster-key", cluster_key,
            ]  # fmt: skip
            if host.index < len(extra_args):
                args += list(extra_args[host.index])
            node = ExoProcess(
                host.index, API_PORT, LIBP2P_PORT, data, args, root / f"node{host.index}.log",
                host=host.api_address, launcher=tuple(host.exec_prefix()),
            )  # fmt: skip
            node.start(env)
            nodes.append(node)
        yield nodes
    finally:
        for node in nodes:
            node.resume()  # a paused node cannot stop
            node.kill(signal.SIGINT)
