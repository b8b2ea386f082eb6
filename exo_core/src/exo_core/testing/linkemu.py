"""The link emulator (linkemu.c): built with the C compiler on first use, driven over a pipe.

It is a switch between TAP devices that gives each directional link a delay, jitter, loss,
reordering and rate, and cuts links: what netem would do, done in userspace because this
kernel has no netem. `exo_core.testing.network` wires it into network namespaces."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from platformdirs import user_cache_dir

SOURCE = Path(__file__).with_name("linkemu.c")


@dataclass(frozen=True)
class LinkSpec:
    """One direction of a link. `loss` and `reorder` are fractions (0.05: 5 %); `jitter_ms`
    spreads each frame's delay uniformly over delay ± jitter; `rate_mbit` 0 is unlimited."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0
    rate_mbit: float = 0.0
    reorder: float = 0.0

    def words(self) -> list[str]:
        if not (0 <= self.loss <= 1 and 0 <= self.reorder <= 1):
            raise ValueError("loss and reorder are fractions between 0 and 1")
        if min(self.delay_ms, self.jitter_ms, self.rate_mbit) < 0:
            raise ValueError("delay, jitter and rate cannot be negative")
        return [
            str(round(self.delay_ms * 1000)),
            str(round(self.jitter_ms * 1000)),
            str(round(self.loss * 1_000_000)),
            str(round(self.rate_mbit * 1_000_000)),
            str(round(self.reorder * 1_000_000)),
        ]


def build() -> Path:
    """The emulator's binary, compiled into the user's cache once per version of its source."""
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:16]
    target = Path(user_cache_dir("exo")) / f"linkemu-{digest}"
    if target.exists():
        return target
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("the link emulator needs a C compiler (cc or gcc, or set CC)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / "linkemu"
        subprocess.run(
            [compiler, "-O2", "-Wall", "-o", str(out), str(SOURCE)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        out.replace(target)  # atomic: a concurrent build of the same source is harmless
    return target


class LinkEmulator:
    """A running emulator with one port (TAP device) per name in `taps`, in this namespace
    until the caller moves them. Ports are numbered as `taps` lists them."""

    def __init__(self, taps: list[str], seed: int = 0) -> None:
        self.taps = taps
        self.process = subprocess.Popen(
            [str(build()), str(seed), *taps],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = self._line()
        if ready != "ready":
            self.close()
            raise RuntimeError(f"the link emulator did not start: {ready!r}")

    def _line(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()

    def _ask(self, words: list[str]) -> str:
        assert self.process.stdin is not None
        self.process.stdin.write(" ".join(words) + "\n")
        self.process.stdin.flush()
        answer = self._line()
        if answer.startswith("err") or not answer:
            raise RuntimeError(f"link emulator: {answer or 'it ended'}")
        return answer

    @staticmethod
    def _port(p: int | None) -> str:
        return "*" if p is None else str(p)

    def set(self, spec: LinkSpec, a: int | None = None, b: int | None = None) -> None:
        """Give link a -> b (None: every port) these properties."""
        self._ask(["set", self._port(a), self._port(b), *spec.words()])

    def cut(self, a: int | None, b: int | None) -> None:
        self._ask(["cut", self._port(a), self._port(b)])

    def heal(self, a: int | None, b: int | None) -> None:
        self._ask(["heal", self._port(a), self._port(b)])

    def stats(self) -> dict[str, int]:
        """Frames forwarded and dropped (by loss, by a cut link, by a full queue)."""
        _, *counts = self._ask(["stats"]).split()
        return dict(zip(("forwarded", "lost", "cut", "queue_full"), map(int, counts), strict=True))

    def close(self) -> None:
        """End the emulator; its TAP devices go with it."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()
