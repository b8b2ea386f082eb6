"""The few hub calls this plugin makes, through huggingface_hub's own client.

huggingface_hub supplies the session, URLs, auth headers (`HF_TOKEN`, or the token file) and
error types; this module adds what it lacks for resumable, verified downloads: file hashes from
the repo metadata and ranged GETs into files we keep ourselves. The endpoint is read from
`HF_ENDPOINT` when a client is made (huggingface_hub reads it only once, at import).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import httpx2
import msgspec
from huggingface_hub import constants, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import (
    build_hf_headers,
    get_session,
    hf_raise_for_status,
    validate_repo_id,
)

from exo_core.plugin import public_message
from exo_download_hf.verify import ExpectedHash

# huggingface_hub's API client (hf_api, ~12 MB resident) is imported when a node first asks the
# hub for a model's files or a search, not by every node at start-up.
if TYPE_CHECKING:
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import ModelInfo

# Seconds to wait for the first byte, and between bytes, before a ranged GET is retried.
READ_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 10.0
# A look-up for the API (search, a repo's files): connect, and between bytes.
LOOKUP_TIMEOUT_S = 10.0


class HubError(Exception):
    """A hub call failed; `status` is the HTTP status the API answers with."""

    status = 502


class HubNotFound(HubError):
    status = 404


class HubDenied(HubError):
    status = 403


class HubInvalid(HubError):
    """A repo id the hub does not allow: refused before any request."""

    status = 422


def check_repo_id(repo_id: str) -> str:
    """`repo_id`, when the hub allows it: ASCII (checked first: huggingface_hub's own check
    takes any Unicode letter, and its requests then fail), `name` or `org/name`, no `--` or
    `..`. Raises `HubInvalid`."""
    if not repo_id.isascii():
        raise HubInvalid(f"'{repo_id}' is not a hub repo id: it has non-ASCII characters")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise HubInvalid(f"'{repo_id}' is not a hub repo id: {e}") from e
    return repo_id


class HubUnreachable(HubError):
    """The network failed (connection, timeout): worth retrying."""

    status = 502


class RangeNotSatisfiable(HubError):
    """The requested start lies at or past the end of the file (HTTP 416)."""


@dataclass
class RangeBody:
    offset: int  # where the body starts in the file: the requested start, or 0
    chunks: Iterator[bytes]


class RemoteFile(msgspec.Struct, frozen=True):
    path: str
    size: int
    expected: ExpectedHash


class RepoSnapshot(msgspec.Struct, frozen=True):
    repo_id: str
    commit: str
    files: tuple[RemoteFile, ...]


def _remote_file(sibling: Any) -> RemoteFile | None:
    if sibling.lfs is not None:
        return RemoteFile(
            path=sibling.rfilename,
            size=int(sibling.lfs.size),
            expected=ExpectedHash("sha256", str(sibling.lfs.sha256)),
        )
    if sibling.blob_id is not None and sibling.size is not None:
        return RemoteFile(
            path=sibling.rfilename,
            size=int(sibling.size),
            expected=ExpectedHash("git-sha1", str(sibling.blob_id)),
        )
    return None


class HubClient:
    def __init__(self, endpoint: str | None = None, token: str | None = None) -> None:
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip(
            "/"
        )
        # None lets huggingface_hub find the token (HF_TOKEN, then the token file) per request.
        self._token = token

    @cached_property
    def api(self) -> HfApi:
        from huggingface_hub import HfApi

        return HfApi(endpoint=self.endpoint, token=self._token)

    @contextlib.contextmanager
    def _translated(self, what: str) -> Iterator[None]:
        """Turn huggingface_hub's and httpx's errors into HubErrors with a reason a user can act on."""
        try:
            yield
        except GatedRepoError as e:
            raise HubDenied(
                f"{what}: the repo is gated; accept its terms on the hub and set HF_TOKEN"
            ) from e
        except RepositoryNotFoundError as e:
            raise HubNotFound(
                f"{what}: no such repo on {self.endpoint} "
                "(check the id; a private repo needs HF_TOKEN)"
            ) from e
        except RevisionNotFoundError as e:
            raise HubNotFound(f"{what}: no such revision") from e
        except RemoteEntryNotFoundError as e:
            raise HubNotFound(f"{what}: no such file in the repo") from e
        except OfflineModeIsEnabled as e:
            raise HubUnreachable(f"{what}: HF_HUB_OFFLINE is set, so the hub is not called") from e
        except HfHubHTTPError as e:
            status = e.response.status_code if e.response is not None else 0
            error = HubDenied if status in (401, 403) else HubError
            raise error(f"{what}: the hub answered {status}: {e}") from e
        except (httpx2.TransportError, OSError) as e:
            raise HubUnreachable(
                f"{what}: cannot reach the hub at {self.endpoint}: {public_message(e)}"
            ) from e

    def snapshot(
        self, repo_id: str, revision: str = "main", timeout: float = READ_TIMEOUT_S
    ) -> RepoSnapshot:
        """The repo's files with sizes and hashes, at the commit `revision` resolves to now."""
        check_repo_id(repo_id)
        with self._translated(repo_id):
            info = self.api.model_info(
                repo_id, revision=revision, files_metadata=True, timeout=timeout
            )
        files = [f for s in info.siblings or [] if (f := _remote_file(s)) is not None]
        if not info.sha:
            raise HubError(f"{repo_id}: the hub gave no commit for revision {revision}")
        return RepoSnapshot(repo_id=repo_id, commit=info.sha, files=tuple(files))

    def read_text(self, repo_id: str, path: str, revision: str = "main") -> str:
        """A small text file of the repo (such as config.json), without caching it anywhere."""
        check_repo_id(repo_id)
        url = hf_hub_url(repo_id, path, revision=revision, endpoint=self.endpoint)
        with self._translated(f"{repo_id}/{path}"):
            response = get_session().get(
                url, headers=build_hf_headers(token=self._token), timeout=CONNECT_TIMEOUT_S
            )
            hf_raise_for_status(response)
        return response.text

    def read_json(self, repo_id: str, path: str, revision: str = "main") -> Any:
        """A small JSON file of the repo (such as config.json), without caching it anywhere."""
        text = self.read_text(repo_id, path, revision)
        try:
            return json.loads(text)
        except ValueError as e:
            raise HubError(f"{repo_id}/{path} is not valid JSON: {e}") from e

    def search(self, query: str, limit: int, timeout: float = LOOKUP_TIMEOUT_S) -> list[ModelInfo]:
        """Models whose id contains `query`, most downloaded first. One GET with a timeout
        (huggingface_hub's `list_models` takes none, and retries for a minute)."""
        params: dict[str, Any] = {"limit": limit}
        if query:
            params["search"] = query
        what = f"search '{query}'"
        with self._translated(what):
            response = get_session().get(
                f"{self.endpoint}/api/models",
                params=params,
                headers=build_hf_headers(token=self._token),
                timeout=timeout,
            )
            hf_raise_for_status(response)
        try:
            items = response.json()
        except ValueError as e:
            raise HubError(f"{what}: the hub's answer is not JSON: {e}") from e
        if not isinstance(items, list):
            raise HubError(f"{what}: the hub's answer is not a list")
        from huggingface_hub import hf_api  # the API client, only when asked (a node's memory)

        return [hf_api.ModelInfo(**item) for item in items if isinstance(item, dict)]  # pyright: ignore[reportUnknownArgumentType]

    @contextlib.contextmanager
    def open_range(self, repo_id: str, path: str, revision: str, start: int) -> Iterator[RangeBody]:
        """A streaming GET of the file from byte `start`.

        Only network and hub errors are translated: what the caller raises while consuming the
        body (a full disk, a cancellation) reaches it unchanged."""
        what = f"{repo_id}/{path}"
        check_repo_id(repo_id)
        url = hf_hub_url(repo_id, path, revision=revision, endpoint=self.endpoint)
        headers = build_hf_headers(token=self._token)
        # Ranges count raw bytes: a compressed body would make offsets meaningless.
        headers["Accept-Encoding"] = "identity"
        if start > 0:
            headers["Range"] = f"bytes={start}-"
        timeout = httpx2.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        with contextlib.ExitStack() as stack:
            with self._translated(what):
                response = stack.enter_context(
                    get_session().stream("GET", url, headers=headers, timeout=timeout)
                )
                if response.status_code == 416:
                    raise RangeNotSatisfiable(f"{what}: the hub has no bytes from {start} on")
                if response.status_code >= 400:
                    response.read()
                    hf_raise_for_status(response)
            # 206: the range was honoured; 200: the server sent the whole file again.
            offset = start if response.status_code == 206 else 0
            yield RangeBody(offset=offset, chunks=self._chunks(response, what))

    def _chunks(self, response: httpx2.Response, what: str) -> Iterator[bytes]:
        # A generator: the consumer's own exceptions never pass through this translation.
        with self._translated(what):
            yield from response.iter_bytes()
