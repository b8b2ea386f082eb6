"""Identifier types. Plain strings on the wire; distinct names in signatures."""

import uuid
from typing import NewType

NodeId = NewType("NodeId", str)
ModelId = NewType("ModelId", str)
InstanceId = NewType("InstanceId", str)
RunnerId = NewType("RunnerId", str)
TaskId = NewType("TaskId", str)
CommandId = NewType("CommandId", str)


def new_id(prefix: str) -> str:
    """A short random id with a readable prefix, e.g. `inst-3f9c1a2b7d4e`."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"
