"""Identifier types. Plain strings on the wire; distinct names in signatures."""

import uuid
from typing import NewType

NodeId = NewType("NodeId", str)
"""A node's id (stable across restarts)."""
ModelId = NewType("ModelId", str)
"""A model's id, as its card names it (e.g. `mlx-community/Llama-3.2-1B-Instruct-4bit`)."""
InstanceId = NewType("InstanceId", str)
"""An instance's id."""
RunnerId = NewType("RunnerId", str)
"""A runner's id."""
TaskId = NewType("TaskId", str)
"""A task's id."""
CommandId = NewType("CommandId", str)


def new_id(prefix: str, *, sep: str = "-", size: int = 12) -> str:
    """A random id with a readable prefix, e.g. `inst-3f9c1a2b7d4e`; `sep` and `size` (hex digits,
    at most 32) give the shapes other APIs use, e.g. Anthropic's `msg_` and 24 digits."""
    return f"{prefix}{sep}{uuid.uuid4().hex[:size]}"
