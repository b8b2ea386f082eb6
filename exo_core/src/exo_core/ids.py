"""Identifier types. Plain strings on the wire; distinct names in signatures."""

import uuid
from typing import NewType

NodeId = NewType("NodeId", str)
ModelId = NewType("ModelId", str)
InstanceId = NewType("InstanceId", str)
RunnerId = NewType("RunnerId", str)
TaskId = NewType("TaskId", str)
CommandId = NewType("CommandId", str)


def new_id(prefix: str, *, sep: str = "-", size: int = 12) -> str:
    """A random id with a readable prefix, e.g. `inst-3f9c1a2b7d4e`; `sep` and `size` (hex digits,
    at most 32) give the shapes other APIs use, e.g. Anthropic's `msg_` and 24 digits."""
    return f"{prefix}{sep}{uuid.uuid4().hex[:size]}"
