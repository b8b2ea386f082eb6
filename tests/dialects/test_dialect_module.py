"""`exo_core.api.dialect` on its own: a third party's dialect, and how the three dialects answer a
generation that fails, with a stand-in generation service (no node, no engine)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import msgspec
import pytest
from litestar import Litestar, Response, post
from litestar.di import Provide
from litestar.testing import TestClient

import exo_api_claude.routes
import exo_api_ollama.routes
import exo_api_openai.routes
from exo_core.api.dialect import (
    INTERNAL_ERROR,
    AnyRequest,
    answer,
    answered,
    decode_body,
    dialect_router,
    sse,
)
from exo_core.generation import (
    Chunk,
    ErrorChunk,
    FinishChunk,
    FinishReason,
    GenerationParams,
    TextChunk,
)
from exo_core.ids import TaskId
from exo_core.model_cards import ModelCard
from exo_core.service import GenerationService, InvalidRequest
from exo_core.testing.scripted_engine import ECHO

T = TaskId("task-1")
USER = [{"role": "user", "content": "hi"}]


class StandInService(GenerationService):
    """Answers every request with `script`; raises `bug` from generate when set."""

    def __init__(self, script: list[Chunk], bug: Exception | None = None) -> None:
        self.script = script
        self.bug = bug

    def resolve(self, model_id: str) -> ModelCard:
        return ECHO

    async def generate(
        self,
        model_id: str,
        params: GenerationParams,
        names: Any = None,
        *,
        request_id: str | None = None,
    ) -> AsyncIterator[Chunk]:
        if self.bug is not None:
            raise self.bug

        async def chunks() -> AsyncIterator[Chunk]:
            for chunk in self.script:
                yield chunk

        return chunks()


def client(router: Any, service: GenerationService) -> TestClient[Litestar]:
    app = Litestar(
        route_handlers=[router],
        # Routes declare `node` explicitly (Litestar 3 style), so it must be provided; the
        # ones these tests call use only `generation`.
        dependencies={
            "generation": Provide(lambda: service, sync_to_thread=False),
            "node": Provide(lambda: None, sync_to_thread=False),
        },
    )
    return TestClient(app)


# -- a third party's dialect -------------------------------------------------------------------


class EchoRequest(msgspec.Struct):
    model: str
    stream: bool = False


class Lines:
    def start(self) -> list[str]:
        return ["begin\n"]

    def feed(self, chunk: Chunk) -> list[str]:
        return [f"{chunk.text}\n"] if isinstance(chunk, TextChunk) else []

    def fail(self, message: str) -> list[str]:
        return [f"failed: {message}\n"]


def _text(chunks: list[Chunk]) -> dict[str, Any]:
    finish = answered(next((c for c in chunks if isinstance(c, FinishChunk)), None))
    for chunk in chunks:
        if isinstance(chunk, ErrorChunk):
            raise InvalidRequest(chunk.message)  # any GenerationError keeps its status
    text = "".join(c.text for c in chunks if isinstance(c, TextChunk))
    return {"text": text, "finish": finish.finish_reason.value}


@post("/echo", status_code=200)
async def echo(request: AnyRequest, generation: GenerationService) -> Response[Any]:
    req = decode_body(await request.body(), EchoRequest)
    chunks = await generation.generate(req.model, GenerationParams())
    if req.stream:
        return sse(Lines(), chunks)
    return await answer(request, chunks, _text)


def shaped(status: int, message: str, exc: Exception) -> dict[str, Any]:
    return {"oops": message, "status": status, "kind": type(exc).__name__}


@pytest.fixture
def third() -> Iterator[TestClient[Litestar]]:
    script: list[Chunk] = [
        TextChunk(task_id=T, text="a"),
        TextChunk(task_id=T, text="b"),
        FinishChunk(task_id=T, finish_reason=FinishReason.STOP),
    ]
    router = dialect_router("/mine", [echo], error_body=shaped, tags=["mine"])
    with client(router, StandInService(script)) as c:
        yield c


def test_a_third_party_dialect_answers(third: TestClient[Litestar]) -> None:
    r = third.post("/mine/echo", json={"model": "m"})
    assert r.status_code == 200 and r.json() == {"text": "ab", "finish": "stop"}
    streamed = third.post("/mine/echo", json={"model": "m", "stream": True})
    assert streamed.status_code == 200
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert streamed.headers["cache-control"] == "no-cache"
    assert streamed.text == "begin\na\nb\n"


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "kind", "words"),
    [
        ("GET", "/mine/echo", None, 405, "MethodNotAllowedException", "GET is not allowed"),
        ("DELETE", "/mine/echo", None, 405, "MethodNotAllowedException", "DELETE is not"),
        ("POST", "/mine/nope", {}, 404, "NotFoundException", "no route POST /mine/nope"),
        ("GET", "/mine/a/b", None, 404, "NotFoundException", "no route GET /mine/a/b"),
        ("POST", "/mine/echo", "{", 400, "InvalidRequest", "not valid JSON"),
        ("POST", "/mine/echo", [], 400, "InvalidRequest", "invalid request body"),
        ("POST", "/mine/echo", {"stream": True}, 400, "InvalidRequest", "`model`"),
    ],
)
def test_a_third_party_dialects_errors_have_its_shape(
    third: TestClient[Litestar],
    method: str,
    path: str,
    body: Any,
    status: int,
    kind: str,
    words: str,
) -> None:
    content = body if isinstance(body, str) else None if body is None else msgspec.json.encode(body)
    r = third.request(method, path, content=content)
    assert r.status_code == status, r.text
    error = r.json()
    assert set(error) == {"oops", "status", "kind"}
    assert (error["status"], error["kind"]) == (status, kind) and words in error["oops"]


@pytest.mark.parametrize(
    ("script", "status", "words"),
    [
        ([TextChunk(task_id=T, text="a")], 500, "ended without finishing"),
        ([FinishChunk(task_id=T, finish_reason=FinishReason.CANCELLED)], 500, "cancelled"),
        ([FinishChunk(task_id=T, finish_reason=FinishReason.ERROR)], 500, "generation failed"),
        (
            [
                ErrorChunk(task_id=T, message="bad"),
                FinishChunk(task_id=T, finish_reason=FinishReason.STOP),
            ],
            400,
            "bad",
        ),
    ],
)
def test_a_generation_without_an_answer(script: list[Chunk], status: int, words: str) -> None:
    router = dialect_router("/mine", [echo], error_body=shaped)
    with client(router, StandInService(script)) as c:
        r = c.post("/mine/echo", json={"model": "m"})
    assert r.status_code == status and words in r.json()["oops"]


def test_a_bug_is_a_500_in_the_shape() -> None:
    router = dialect_router("/mine", [echo], error_body=shaped)
    with client(router, StandInService([], bug=RuntimeError("oh no"))) as c:
        r = c.post("/mine/echo", json={"model": "m"})
    assert r.status_code == 500
    body = r.json()
    # The log has the traceback under the id the body names.
    assert re.fullmatch(r"req_[0-9a-f]{16}", body.pop("request_id"))
    assert body == {"oops": INTERNAL_ERROR, "status": 500, "kind": "RuntimeError"}


def test_a_failure_mid_stream_is_reported_in_band() -> None:
    class Broken(StandInService):
        async def generate(
            self, model_id: str, params: GenerationParams, names: Any = None
        ) -> AsyncIterator[Chunk]:
            async def chunks() -> AsyncIterator[Chunk]:
                yield TextChunk(task_id=T, text="a")
                raise RuntimeError("lost the runner")

            return chunks()

    router = dialect_router("/mine", [echo], error_body=shaped)
    with client(router, Broken([])) as c:
        r = c.post("/mine/echo", json={"model": "m", "stream": True})
    assert r.status_code == 200
    assert r.text == "begin\na\nfailed: generation failed: lost the runner\n"


# -- the three dialects, when the generation fails ---------------------------------------------

FAILING: list[Chunk] = [TextChunk(task_id=T, text="a"), ErrorChunk(task_id=T, message="it broke")]

CASES: dict[str, tuple[Any, str, dict[str, Any], Any]] = {
    "openai-chat": (
        exo_api_openai.routes.router,
        "/v1/chat/completions",
        {"model": "scripted-echo", "messages": USER},
        {"error": {"message": "it broke", "type": "server_error", "param": None, "code": None}},
    ),
    "openai-responses": (
        exo_api_openai.routes.router,
        "/v1/responses",
        {"model": "scripted-echo", "input": "hi"},
        {"error": {"message": "it broke", "type": "server_error", "param": None, "code": None}},
    ),
    "claude": (
        exo_api_claude.routes.router,
        "/v1/messages",
        {"model": "scripted-echo", "max_tokens": 10, "messages": USER},
        {"type": "error", "error": {"type": "api_error", "message": "it broke"}},
    ),
    "ollama-chat": (
        exo_api_ollama.routes.router,
        "/api/chat",
        {"model": "scripted-echo", "messages": USER, "stream": False},
        {"error": "it broke"},
    ),
    "ollama-generate": (
        exo_api_ollama.routes.router,
        "/ollama/api/generate",
        {"model": "scripted-echo", "prompt": "hi", "stream": False},
        {"error": "it broke"},
    ),
}


@pytest.mark.parametrize("dialect", list(CASES))
def test_a_failed_generation_is_a_500_in_the_dialects_shape(dialect: str) -> None:
    router, path, body, expected = CASES[dialect]
    with client(router(), StandInService(FAILING)) as c:
        r = c.post(path, json=body)
    body = r.json()
    assert r.status_code == 500 and body == {**expected, "request_id": body["request_id"]}
