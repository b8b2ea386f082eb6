"""Settings shared by every test in the workspace."""

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
