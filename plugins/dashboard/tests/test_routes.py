"""The dashboard's routes on a real node: the page, its files, and what they refuse."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

import exo_dashboard.plugin as dashboard_plugin
from exo_core.testing.harness import RunningNode


def test_the_page_is_served_at_the_root_with_a_strict_content_policy(node: RunningNode) -> None:
    answer = httpx.get(f"{node.url}/")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/static/js/main.js">' in answer.text
    policy = answer.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "connect-src 'self'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/static/js/main.js", "javascript"),
        ("/static/app.css", "text/css"),
        ("/static/icon.svg", "svg"),
    ],
)
def test_static_files_carry_their_types(node: RunningNode, path: str, kind: str) -> None:
    answer = httpx.get(f"{node.url}{path}")
    assert answer.status_code == 200, path
    assert kind in answer.headers["content-type"]


def test_every_module_the_page_imports_is_served(node: RunningNode) -> None:
    static = Path(dashboard_plugin.__file__).parent / "static" / "js"
    for module in static.glob("*.js"):
        assert httpx.get(f"{node.url}/static/js/{module.name}").status_code == 200, module.name


@pytest.mark.parametrize(
    "path", ["/static/../plugin.py", "/static/%2e%2e/routes.py", "/static/nope.js"]
)
def test_nothing_outside_the_static_folder_is_served(node: RunningNode, path: str) -> None:
    answer = httpx.get(f"{node.url}{path}")
    assert answer.status_code == 404, (path, answer.text[:200])
    assert "CONTENT_SECURITY_POLICY" not in answer.text


def test_the_page_stays_out_of_the_api_schema(node: RunningNode) -> None:
    paths = httpx.get(f"{node.url}/schema/openapi.json").json()["paths"]
    assert "/" not in paths and not any(p.startswith("/static") for p in paths)
