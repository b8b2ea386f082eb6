"""Who may use the HTTP API (exo_core.api.security), against real nodes on real ports: the API
key with the official clients, CORS, the Host allow-list, 415 for bodies that are not JSON,
and an OpenAPI schema that documents every request body."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest

from exo_core.testing.harness import RunningNode, running_node
from exo_core.testing.scripted_engine import ScriptedEnginePlugin

from .support import DIALECTS

KEY = "s3cret-key"
MODEL = "scripted-echo"
HELLO = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    engine = ScriptedEnginePlugin()
    with running_node(
        tmp_path_factory.mktemp("keyed"),
        [engine, *DIALECTS],
        api_key=KEY,
        cors_origins=["http://dashboard.example"],
    ) as node:
        yield node


@pytest.fixture(scope="module")
def open_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    with running_node(tmp_path_factory.mktemp("open"), [ScriptedEnginePlugin(), *DIALECTS]) as node:
        yield node


# -- API key -----------------------------------------------------------------------------------


def test_openai_client_works_with_the_key_and_gets_401_without(keyed: RunningNode) -> None:
    good = openai.OpenAI(base_url=f"{keyed.url}/v1", api_key=KEY, max_retries=0)
    reply = good.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8)  # type: ignore[arg-type]
    assert reply.choices[0].message.content == "echo: hello there"
    bad = openai.OpenAI(base_url=f"{keyed.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        bad.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8)  # type: ignore[arg-type]
    assert refused.value.status_code == 401
    assert refused.value.body["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_anthropic_client_works_with_the_key_and_gets_401_without(keyed: RunningNode) -> None:
    good = anthropic.Anthropic(base_url=keyed.url, api_key=KEY, max_retries=0)
    reply = good.messages.create(model=MODEL, max_tokens=8, messages=HELLO)  # type: ignore[arg-type]
    assert reply.content[0].text == "echo: hello there"  # type: ignore[union-attr]
    bad = anthropic.Anthropic(base_url=keyed.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as refused:
        bad.messages.create(model=MODEL, max_tokens=8, messages=HELLO)  # type: ignore[arg-type]
    assert refused.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


def test_ollama_client_works_with_the_key_and_gets_401_without(keyed: RunningNode) -> None:
    good = ollama.Client(host=keyed.url, headers={"Authorization": f"Bearer {KEY}"})
    reply = good.chat(model=MODEL, messages=HELLO, stream=False)
    assert reply.message.content == "echo: hello there"
    with pytest.raises(ollama.ResponseError) as refused:
        ollama.Client(host=keyed.url).chat(model=MODEL, messages=HELLO, stream=False)
    assert refused.value.status_code == 401
    assert "API key" in refused.value.error


def test_every_route_but_healthz_needs_the_key(keyed: RunningNode) -> None:
    assert httpx.get(f"{keyed.url}/healthz").status_code == 200
    for path in ("/state", "/models", "/v1/models", "/api/tags", "/schema/openapi.json"):
        assert httpx.get(f"{keyed.url}{path}").status_code == 401, path
        r = httpx.get(f"{keyed.url}{path}", headers={"x-api-key": KEY})
        assert r.status_code == 200, path
    # Unknown paths under a dialect are refused in its shape too, before saying they are unknown.
    r = httpx.delete(f"{keyed.url}/instance/whatever")
    assert r.status_code == 401 and r.json()["status_code"] == 401


# -- browsers ----------------------------------------------------------------------------------


def test_a_preflight_from_another_site_gets_no_allow_origin(open_node: RunningNode) -> None:
    r = httpx.options(
        f"{open_node.url}/v1/chat/completions",
        headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in r.headers
    # A "simple" request (no preflight) from that page is refused outright.
    r = httpx.post(
        f"{open_node.url}/instance",
        content=b'{"model_id": "scripted-echo"}',
        headers={"Origin": "http://evil.example"},
    )
    assert r.status_code == 403


def test_an_allowed_origin_gets_cors(keyed: RunningNode) -> None:
    r = httpx.options(
        f"{keyed.url}/v1/chat/completions",
        headers={
            "Origin": "http://dashboard.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        },
    )
    assert r.headers.get("access-control-allow-origin") == "http://dashboard.example"


def test_a_foreign_host_is_refused(open_node: RunningNode) -> None:
    r = httpx.get(f"{open_node.url}/state", headers={"Host": "evil.example"})
    assert r.status_code == 421
    port = open_node.url.rsplit(":", 1)[1]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        assert httpx.get(f"{open_node.url}/state", headers={"Host": host}).status_code == 200


# -- bodies ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "shape"),
    [
        ("/v1/chat/completions", lambda b: b["error"]["message"]),
        ("/v1/responses", lambda b: b["error"]["message"]),
        ("/v1/messages", lambda b: b["error"]["message"]),
        ("/api/chat", lambda b: b["error"]),
        ("/api/generate", lambda b: b["error"]),
    ],
)
def test_a_body_that_is_not_json_is_a_415_in_the_dialect_shape(
    open_node: RunningNode, path: str, shape: object
) -> None:
    for media in ("text/plain", "application/x-www-form-urlencoded"):
        r = httpx.post(
            f"{open_node.url}{path}",
            content=b'{"model": "scripted-echo"}',
            headers={"Content-Type": media},
        )
        assert r.status_code == 415
        assert "JSON" in shape(r.json())  # type: ignore[operator]


def test_the_schema_documents_every_request_body(open_node: RunningNode) -> None:
    paths = httpx.get(f"{open_node.url}/schema/openapi.json").json()["paths"]
    for path in ("/v1/chat/completions", "/v1/responses", "/v1/messages", "/api/chat"):
        body = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body, path
    posts = [p for p, ops in paths.items() if "post" in ops]
    undocumented = [p for p in posts if "requestBody" not in paths[p]["post"]]
    assert undocumented == []


def test_the_data_dir_is_not_in_an_error(open_node: RunningNode, tmp_path: Path) -> None:
    r = httpx.post(f"{open_node.url}/v1/chat/completions", json={"model": 5})
    assert r.status_code == 400
    assert "Traceback" not in r.text and str(open_node.node.config.data_dir) not in r.text
