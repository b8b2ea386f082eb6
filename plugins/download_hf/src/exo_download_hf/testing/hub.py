"""A stand-in for the Hugging Face hub, for tests: point `HF_ENDPOINT` at `HubStandIn.url`.

It serves what huggingface_hub 2.4 asks for, with the hub's headers:

* `GET /api/models/{repo}[/revision/{rev}]` (`?blobs=true`): model info with `siblings`,
  their sizes, git blob ids and LFS info (`sha256`, `size`, `pointerSize`);
* `GET /api/models?search=&limit=`: a list of models;
* `GET|HEAD /{repo}/resolve/{rev}/{path}`: a git file with `ETag` (its blob id),
  `X-Repo-Commit` and `Content-Length`; for an LFS file a 302 to a CDN path with
  `X-Linked-Etag` (the sha256) and `X-Linked-Size`, as the hub does;
* `GET|HEAD /cdn/{sha256}`: LFS content, honouring `Range` (206, `Content-Range`; 416);
* errors as 404/401 with `X-Error-Code` (`RepoNotFound`, `RevisionNotFound`, `EntryNotFound`).

It records every request (with the bytes of body it sent) so tests can assert what was fetched,
can corrupt a file's bytes while still advertising the true hash, can throttle, and can
require a token for private repos."""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

if TYPE_CHECKING:
    pass

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".npz")
SEND_PIECE = 16 * 1024


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


@dataclass
class StandInRepo:
    repo_id: str
    files: dict[str, bytes]
    private: bool = False
    downloads: int = 0
    likes: int = 0
    tags: list[str] = field(default_factory=list)

    @property
    def commit(self) -> str:
        h = hashlib.sha1(usedforsecurity=False)
        for path in sorted(self.files):
            h.update(path.encode() + b"\0" + hashlib.sha256(self.files[path]).digest())
        return h.hexdigest()

    def is_lfs(self, path: str) -> bool:
        return path.endswith(LFS_SUFFIXES)

    def sibling(self, path: str, blobs: bool) -> dict[str, Any]:
        data = self.files[path]
        entry: dict[str, Any] = {"rfilename": path}
        if not blobs:
            return entry
        if self.is_lfs(path):
            pointer = (
                f"version https://git-lfs.github.com/spec/v1\n"
                f"oid sha256:{hashlib.sha256(data).hexdigest()}\nsize {len(data)}\n"
            ).encode()
            entry |= {
                "size": len(data),
                "blobId": git_blob_sha1(pointer),
                "lfs": {
                    "size": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "pointerSize": len(pointer),
                },
            }
        else:
            entry |= {"size": len(data), "blobId": git_blob_sha1(data)}
        return entry

    def info(self, blobs: bool) -> dict[str, Any]:
        return {
            "_id": hashlib.md5(self.repo_id.encode(), usedforsecurity=False).hexdigest()[:24],
            "id": self.repo_id,
            "modelId": self.repo_id,
            "author": self.repo_id.split("/")[0],
            "sha": self.commit,
            "private": self.private,
            "gated": False,
            "disabled": False,
            "downloads": self.downloads,
            "likes": self.likes,
            "tags": self.tags,
            "pipeline_tag": "text-generation",
            "library_name": "mlx",
            "lastModified": "2026-01-01T00:00:00.000Z",
            "siblings": [self.sibling(p, blobs) for p in sorted(self.files)],
        }


@dataclass(frozen=True)
class Served:
    """One request the stand-in answered."""

    method: str
    path: str
    status: int
    range_start: int | None
    body_bytes: int
    authorization: str | None


class HubStandIn:
    def __init__(self) -> None:
        self.repos: dict[str, StandInRepo] = {}
        # (repo, path) whose bytes are served altered (same length): a corrupted transfer.
        self.corrupt: set[tuple[str, str]] = set()
        self.throttle_bytes_per_s: float | None = None
        # False: answer ranged requests with the whole file (200), as some proxies do.
        self.honour_ranges = True
        # (repo, path, n): cut the next transfer of that file after n bytes, once (a dropped
        # connection).
        self.drop: tuple[str, str, int] | None = None
        # The token a private repo requires (as `Authorization: Bearer <token>`).
        self.token = "hf_stand_in_token"
        self._served: list[Served] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        # LFS content comes from another origin, as the hub's CDN does: huggingface_hub then
        # reads a file's metadata from the redirect itself and sends no token to the CDN.
        self._cdn: ThreadingHTTPServer | None = None

    # -- set-up ---------------------------------------------------------------------------------

    def add_repo(self, repo_id: str, files: dict[str, bytes], **kw: Any) -> StandInRepo:
        repo = StandInRepo(repo_id=repo_id, files=dict(files), **kw)
        self.repos[repo_id] = repo
        return repo

    @property
    def url(self) -> str:
        return _address(self._server)

    @property
    def cdn_url(self) -> str:
        return _address(self._cdn)

    def start(self) -> HubStandIn:
        stand_in = self

        class Handler(_Handler):
            hub = stand_in

        self._server = _serve(Handler)
        self._cdn = _serve(Handler)
        return self

    def stop(self) -> None:
        for server in (self._server, self._cdn):
            if server is not None:
                server.shutdown()
                server.server_close()
        self._server = self._cdn = None

    def __enter__(self) -> HubStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what was served ------------------------------------------------------------------------

    def served(self) -> list[Served]:
        with self._lock:
            return list(self._served)

    def clear(self) -> None:
        with self._lock:
            self._served.clear()

    def take_drop(self, repo_id: str, path: str) -> int | None:
        with self._lock:
            if self.drop is None or self.drop[:2] != (repo_id, path):
                return None
            cut, self.drop = self.drop[2], None
            return cut

    def record(self, served: Served) -> None:
        with self._lock:
            self._served.append(served)

    def content_requests(self) -> list[Served]:
        """GETs that sent file content (resolve of git files, and CDN fetches), not redirects."""
        return [
            s
            for s in self.served()
            if s.method == "GET"
            and s.status in (200, 206)
            and ("/resolve/" in s.path or s.path.startswith("/cdn/"))
        ]

    def lfs_by_hash(self) -> dict[str, tuple[StandInRepo, str]]:
        return {
            hashlib.sha256(data).hexdigest(): (repo, path)
            for repo in self.repos.values()
            for path, data in repo.files.items()
            if repo.is_lfs(path)
        }


def _serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server


def _address(server: ThreadingHTTPServer | None) -> str:
    assert server is not None, "start() the stand-in first"
    host, port = server.server_address[:2]
    return f"http://{host!s}:{port}"


_RESOLVE = re.compile(r"^/(?P<repo>[^/]+(?:/[^/]+)?)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+(?:/[^/]+)?)(?:/revision/(?P<rev>[^/]+))?$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


class _Handler(BaseHTTPRequestHandler):
    hub: HubStandIn
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._dispatch(head=False)

    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    # -- routing --------------------------------------------------------------------------------

    def _dispatch(self, head: bool) -> None:
        split = urlsplit(self.path)
        path = unquote(split.path)
        query = parse_qs(split.query)
        self._range_start: int | None = None
        if path == "/api/models":
            self._search(query)
        elif path.startswith("/cdn/"):
            self._cdn(path.removeprefix("/cdn/"), head)
        elif m := _INFO.match(path):
            self._info(m["repo"], m["rev"] or "main", query)
        elif m := _RESOLVE.match(path):
            self._resolve(m["repo"], m["rev"], m["path"], head)
        else:
            self._error(404, "RepoNotFound", "no such route")

    def _repo(self, repo_id: str, rev: str) -> StandInRepo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None or (
            repo.private and self.headers.get("Authorization") != f"Bearer {self.hub.token}"
        ):
            # The hub answers 401 for both, so as not to reveal that a private repo exists.
            self._error(401, "RepoNotFound", "Repository not found")
            return None
        if rev not in ("main", repo.commit):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return None
        return repo

    def _search(self, query: dict[str, list[str]]) -> None:
        text = (query.get("search") or [""])[0].lower()
        limit = int((query.get("limit") or ["1000"])[0])
        found = []
        for repo in sorted(self.hub.repos.values(), key=lambda r: -r.downloads):
            if not repo.private and text in repo.repo_id.lower():
                item = repo.info(blobs=False)
                del item["siblings"]  # listings carry no files
                found.append(item)
        self._json(found[:limit])

    def _info(self, repo_id: str, rev: str, query: dict[str, list[str]]) -> None:
        repo = self._repo(repo_id, rev)
        if repo is not None:
            self._json(repo.info(blobs=(query.get("blobs") or [""])[0].lower() == "true"))

    def _resolve(self, repo_id: str, rev: str, path: str, head: bool) -> None:
        repo = self._repo(repo_id, rev)
        if repo is None:
            return
        if path not in repo.files:
            self._error(404, "EntryNotFound", f"{path} does not exist on {rev}")
            return
        data = repo.files[path]
        common = {"X-Repo-Commit": repo.commit, "Accept-Ranges": "bytes"}
        if repo.is_lfs(path):
            sha = hashlib.sha256(data).hexdigest()
            pointer_etag = repo.sibling(path, blobs=True)["blobId"]
            self._send(
                302,
                b"",
                {
                    **common,
                    "Location": f"{self.hub.cdn_url}/cdn/{sha}",
                    "ETag": f'"{pointer_etag}"',
                    "X-Linked-Etag": f'"{sha}"',
                    "X-Linked-Size": str(len(data)),
                },
                head,
            )
            return
        self._content(repo_id, path, data, {**common, "ETag": f'"{git_blob_sha1(data)}"'}, head)

    def _cdn(self, sha: str, head: bool) -> None:
        found = self.hub.lfs_by_hash().get(sha)
        if found is None:
            self._send(404, b"no such object", {}, head)
            return
        repo, path = found
        self._content(repo.repo_id, path, repo.files[path], {"ETag": f'"{sha}"'}, head)

    # -- answering ------------------------------------------------------------------------------

    def _content(
        self, repo_id: str, path: str, data: bytes, headers: dict[str, str], head: bool
    ) -> None:
        if (repo_id, path) in self.hub.corrupt:
            data = bytes(b ^ 0xFF for b in data[:64]) + data[64:]
        headers = {**headers, "Accept-Ranges": "bytes"}
        status = 200
        requested = self.headers.get("Range")
        if requested and self.hub.honour_ranges and (m := _RANGE.match(requested.strip())):
            start = int(m[1])
            end = int(m[2]) if m[2] else len(data) - 1
            self._range_start = start
            if start >= len(data):
                self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"}, head)
                return
            end = min(end, len(data) - 1)
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            data = data[start : end + 1]
            status = 206
        cut = None if head else self.hub.take_drop(repo_id, path)
        self._send(status, data, headers, head, cut=cut)

    def _json(self, value: Any) -> None:
        body = json.dumps(value).encode()
        self._send(200, body, {"Content-Type": "application/json"}, head=False)

    def _error(self, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        headers = {
            "Content-Type": "application/json",
            "X-Error-Code": code,
            "X-Error-Message": message,
        }
        self._send(status, body, headers, head=False)

    def _send(
        self,
        status: int,
        body: bytes,
        headers: dict[str, str],
        head: bool,
        cut: int | None = None,
    ) -> None:
        """Send a response; with `cut`, only that many bytes of the body, then hang up."""
        sent = 0
        try:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                for piece in _pieces(body if cut is None else body[:cut]):
                    self.wfile.write(piece)
                    sent += len(piece)
                    if self.hub.throttle_bytes_per_s:
                        time.sleep(len(piece) / self.hub.throttle_bytes_per_s)
            if cut is not None:
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            self.hub.record(
                Served(
                    method=self.command,
                    path=urlsplit(self.path).path,
                    status=status,
                    range_start=self._range_start,
                    body_bytes=sent,
                    authorization=self.headers.get("Authorization"),
                )
            )


def _pieces(body: bytes) -> Iterator[bytes]:
    for i in range(0, len(body), SEND_PIECE):
        yield body[i : i + SEND_PIECE]
