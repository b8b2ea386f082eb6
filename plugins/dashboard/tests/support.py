"""Stand-ins the dashboard tests share: an image route speaking OpenAI's streaming shape (the
image engine is its own plugin) and cards for an image model and a model that fits nowhere."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
from litestar import Request, post
from litestar.datastructures import UploadFile
from litestar.response import Stream

from exo_api_openai.routes import chat_completions, create_response, get_model, list_models
from exo_api_openai.translate import api_error
from exo_core.plugin import Capability, ModelCard, ModelId, ModelTask, State, hookimpl
from exo_core.plugin.dialect import ACCEPTS_OPT, dialect_router
from exo_core.plugin.placement import PlacementOption, PlacementRequest, place

IMAGE_MODEL = "scripted-painter"
HUGE_MODEL = "scripted-huge"
VISION_MODEL = "scripted-seer"  # reads images (answers as scripted-echo does)


def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A valid one-colour PNG, written by hand (no imaging library needed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def _event(kind: str, **fields: object) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n".encode()


RECEIVED: list[dict[str, object]] = []


def _frames(kind: str, prompt: str) -> AsyncIterator[bytes]:
    """A progress event, two partial images, then the final one; a prompt with "slow" never
    finishes."""

    async def frames() -> AsyncIterator[bytes]:
        yield _event(f"{kind}.progress", step=1, total=4, index=0)
        await anyio.sleep(0.3)
        for index, colour in enumerate([(60, 60, 90), (120, 120, 160)]):
            b64 = base64.b64encode(png(32, 32, colour)).decode()
            yield _event(f"{kind}.partial_image", b64_json=b64, partial_image_index=index)
            await anyio.sleep(0.4)
        if "slow" in prompt:
            await anyio.sleep(120)
        final = base64.b64encode(png(64, 64, (250, 204, 21))).decode()
        yield _event(f"{kind}.completed", b64_json=final)

    return frames()


@post("/images/generations")
async def images_stand_in(data: dict[str, object]) -> Stream:
    """Each request body is kept in RECEIVED."""
    RECEIVED.append(data)
    return Stream(
        _frames("image_generation", str(data.get("prompt"))), media_type="text/event-stream"
    )


@post("/images/edits", opt={ACCEPTS_OPT: ("multipart/form-data",)})
async def edits_stand_in(request: Request[Any, Any, Any]) -> Stream:
    """The form's fields are kept in RECEIVED, the uploaded image as its bytes."""
    form = await request.form()
    fields: dict[str, object] = {}
    for key, value in form.multi_items():
        fields[key] = await value.read() if isinstance(value, UploadFile) else value
    RECEIVED.append(fields)
    return Stream(_frames("image_edit", str(fields.get("prompt"))), media_type="text/event-stream")


class StandIns:
    """The OpenAI dialect without its real image routes (the scripted engine makes no images),
    and the stand-in image route in their place."""

    @hookimpl
    def exo_routes(self) -> list[object]:
        handlers = [chat_completions, create_response, list_models, get_model]
        stand_ins = [images_stand_in, edits_stand_in]
        return [dialect_router("/v1", [*handlers, *stand_ins], error_body=api_error)]

    @hookimpl
    def exo_place_instance(
        self, card: ModelCard, request: PlacementRequest, state: State
    ) -> list[PlacementOption] | None:
        # Image models are placed by an image engine plugin; this one stands in for it.
        return place(card, request, state) if card.model_id == IMAGE_MODEL else None

    @hookimpl
    def exo_model_cards(self) -> list[ModelCard]:
        common = {"family": "scripted", "n_layers": 4, "hidden_size": 64}
        return [
            ModelCard(
                model_id=ModelId(IMAGE_MODEL),
                storage_size_bytes=1_000_000,
                tasks=(ModelTask.IMAGE_GENERATION, ModelTask.IMAGE_EDIT),
                source="scripted:painter",
                **common,  # type: ignore[arg-type]
            ),
            ModelCard(
                model_id=ModelId(VISION_MODEL),
                storage_size_bytes=1_000_000,
                capabilities=(Capability.TEXT, Capability.VISION),
                source="scripted:echo",
                **common,  # type: ignore[arg-type]
            ),
            ModelCard(
                model_id=ModelId(HUGE_MODEL),
                storage_size_bytes=1 << 50,
                source="scripted:huge",
                **common,  # type: ignore[arg-type]
            ),
        ]
