"""Bounds on the API's connections, so that no number of clients can stop the node.

uvicorn holds every connection it accepts for as long as the client likes, and its
`limit_concurrency` is only checked once a request's headers have arrived: idle or slowly
written connections pile up until the process runs out of file descriptors, and then
everything that opens a file fails (and asyncio's accept loop logs a traceback per attempt,
thousands a second). So:

- **A connection cap** below the open-file limit: a connection beyond it is answered with a
  503 and closed as it is accepted, so it holds a descriptor only for that moment.
- **A header-read timeout**: a request's headers must be complete within `HEADER_TIMEOUT_S`
  of the connection opening (or of the first byte of the next request on a kept-alive
  connection); a slower client gets a 408 and is cut off. uvicorn has no such setting.
- **Keep-alive**: an idle kept-alive connection is closed after `KEEP_ALIVE_S` (uvicorn's).
- **Accept failures for lack of descriptors** (EMFILE and its kind) are logged once in a while
  with a count, and accepting is retried a second later, instead of a traceback per attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import resource
import socket
import time
from typing import Any

import h11
import msgspec
from loguru import logger
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 15.0
KEEP_ALIVE_S = 5
DEFAULT_MAX_CONNECTIONS = 1000
# Descriptors kept for everything else a node opens: its logs, runners' pipes, peers' sockets.
FD_RESERVE = 256
# How often a repeated warning (refusals, accept failures) is logged, at most.
WARN_EVERY_S = 30.0
OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# Connections over the cap refused in one go before the loop gets a turn.
REFUSALS_PER_TURN = 64
ASYNCIO_ACCEPT_MESSAGE = "socket.accept() out of system resource"


def raise_open_file_limit() -> int:
    """Raise this process's soft open-file limit to its hard limit (many systems start
    processes at 1024 while allowing far more), and return the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            logger.debug(f"could not raise the open-file limit from {soft}: {e}")
    return soft


def connection_cap(configured: int, open_file_limit: int) -> int:
    """How many API connections a node holds at once: what is configured, but never so many
    that they would leave less than `FD_RESERVE` descriptors (or a quarter) for the rest."""
    reserve = max(FD_RESERVE, open_file_limit // 4)
    return max(16, min(configured, open_file_limit - reserve))


def _raw_response(status: int, reason: str, detail: str, extra: str = "") -> bytes:
    body = msgspec.json.encode({"status_code": status, "detail": detail})
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n{extra}\r\n"
    )
    return head.encode("ascii") + body


class _Throttled:
    """A warning logged at most once per `WARN_EVERY_S`, with how often it happened since."""

    def __init__(self) -> None:
        self.count = 0
        self.last = 0.0

    def warn(self, message: str) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self.last >= WARN_EVERY_S:
            logger.warning(f"{message} ({self.count} times since the last such warning)")
            self.count, self.last = 0, now


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header-read timeout (set on the subclass that
    `bounded_protocol` makes)."""

    header_timeout_s = HEADER_TIMEOUT_S
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing():
            self._disarm_header_timer()
        elif _awaiting_headers(self):
            if self._header_timer is None:  # the first bytes of the next request
                self._arm_header_timer()
        else:
            self._disarm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or not _awaiting_headers(self):
            return
        detail = f"the request's headers did not arrive within {self.header_timeout_s:.0f} s"
        self.transport.write(_raw_response(408, "Request Timeout", detail))
        self.transport.close()


def _awaiting_headers(protocol: H11Protocol) -> bool:
    """Whether the connection waits for (the rest of) a request's headers."""
    return protocol.conn.their_state is h11.IDLE


def bounded_protocol(header_timeout_s: float) -> type[H11Protocol]:
    """The protocol class to give uvicorn (`http=`), with this header-read timeout."""

    class Bounded(BoundedH11Protocol):
        pass

    Bounded.header_timeout_s = header_timeout_s
    return Bounded


class ListeningSocket(socket.socket):
    """The API's listening socket: it holds at most `cap` connections, and calms asyncio's
    accept loop when descriptors run out.

    The cap is kept here, at accept, rather than in the protocol: asyncio accepts up to a whole
    backlog before it makes the first protocol, and a refused connection is closed at once
    (its descriptor freed), not on a later turn of the loop.

    When `accept` fails for lack of descriptors, asyncio logs it, stops listening for a second
    and schedules a retry, and then tries again at once, up to the whole backlog (2048) in one
    go: thousands of tracebacks and pending retries a second. Here only the first failure of a
    burst reaches asyncio (which retries a second later); the rest of the burst reads as
    "nothing to accept", and the failures are logged once in a while with a count."""

    cap = DEFAULT_MAX_CONNECTIONS
    _burst_until = 0.0

    def configure(self, cap: int) -> None:
        self.cap = cap
        self._live: list[socket.socket] = []
        self._refused = _Throttled()
        self._failures = _Throttled()

    def accept(self) -> tuple[socket.socket, Any]:
        if time.monotonic() < self._burst_until:
            raise BlockingIOError(errno.EAGAIN, "accepting paused: out of descriptors")
        for _ in range(REFUSALS_PER_TURN):
            conn, address = self._accept_one()
            if self._has_room():
                self._live.append(conn)
                return conn, address
            self._refused.warn(f"refused API connections beyond the cap of {self.cap}")
            _refuse(conn, self.cap)
        raise BlockingIOError(errno.EAGAIN, "refused enough for this turn of the loop")

    def _has_room(self) -> bool:
        if len(self._live) < self.cap:
            return True
        self._live = [c for c in self._live if c.fileno() != -1]  # closed since
        return len(self._live) < self.cap

    def _accept_one(self) -> tuple[socket.socket, Any]:
        try:
            return super().accept()
        except OSError as e:
            if e.errno not in OUT_OF_DESCRIPTORS:
                raise
            self._burst_until = time.monotonic() + 0.5
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            self._failures.warn(
                f"the API cannot accept connections: {e.strerror} (the open-file limit is "
                f"{soft}); retrying every second"
            )
            raise


def _refuse(conn: socket.socket, cap: int) -> None:
    """A 503 (if the kernel takes it at once) and the connection closed."""
    detail = f"this node is at its limit of {cap} connections; retry shortly"
    with contextlib.suppress(OSError):
        conn.setblocking(False)
        conn.send(_raw_response(503, "Service Unavailable", detail, "retry-after: 1\r\n"))
    conn.close()


def listening_socket(sock: socket.socket, cap: int) -> ListeningSocket:
    """`sock` (bound, as uvicorn makes it) as a `ListeningSocket` holding at most `cap`."""
    listener = ListeningSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
    listener.configure(cap)
    return listener


class _QuietAcceptFailures(logging.Filter):
    """asyncio's own traceback for each failed accept: `ListeningSocket` logs them instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(ASYNCIO_ACCEPT_MESSAGE)


_QUIET = _QuietAcceptFailures()


def quiet_asyncio_accept_failures() -> None:
    logging.getLogger("asyncio").addFilter(_QUIET)  # adding it twice keeps one


__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "HEADER_TIMEOUT_S",
    "KEEP_ALIVE_S",
    "BoundedH11Protocol",
    "ListeningSocket",
    "bounded_protocol",
    "connection_cap",
    "listening_socket",
    "quiet_asyncio_accept_failures",
    "raise_open_file_limit",
]
