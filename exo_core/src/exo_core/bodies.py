"""The data plane for requests: a task's body never enters the replicated log.

The API node that holds a caller's request keeps its body (messages, images, prompt, tools,
stop strings; an image request's prompts and uploaded image) while the caller waits. The
replicated task carries only what the cluster needs to schedule and cancel it (`redacted`
params, `redacted_image`). Rank 0 of the task's instance fetches the body
from the API node by request, point to point, just as its chunks travel back; the API node
hands it to that node only. A body that cannot be fetched fails the task with an error that
says so.
"""

from __future__ import annotations

import msgspec

from exo_core.generation import GenerationParams
from exo_core.ids import InstanceId, NodeId, TaskId
from exo_core.images import ImageRequest
from exo_core.state import State, Task


class BodyUnavailable(RuntimeError):
    """Rank 0 could not get a task's body from the node that holds the request."""


def redacted(params: GenerationParams) -> GenerationParams:
    """What the replicated task keeps of a request: sampling and limits, none of its text."""
    return msgspec.structs.replace(params, messages=(), prompt=None, tools=(), stop=())


def redacted_image(image: ImageRequest) -> ImageRequest:
    """What the replicated task keeps of an image request: size, steps, seed and formats; not
    its prompts or uploaded image."""
    return msgspec.structs.replace(image, prompt="", negative_prompt=None, input_image=None)


class Body(msgspec.Struct, frozen=True, kw_only=True):
    """What the log does not hold of a task: its params, and its image request if any."""

    params: GenerationParams
    image: ImageRequest | None = None


def without_body(task: Task) -> Task:
    image = redacted_image(task.image) if task.image is not None else None
    return msgspec.structs.replace(task, params=redacted(task.params), image=image)


def with_body(task: Task, body: Body) -> Task:
    """`task` as its caller asked for it (rank 0 runs this)."""
    return msgspec.structs.replace(task, params=body.params, image=body.image)


class BodyStore:
    """Bodies of the requests this node's API holds, by task, while their callers wait."""

    def __init__(self) -> None:
        self._held: dict[TaskId, tuple[InstanceId, Body]] = {}

    def hold(self, task: Task) -> None:
        self._held[task.task_id] = (task.instance_id, Body(params=task.params, image=task.image))

    def release(self, task_id: TaskId) -> None:
        self._held.pop(task_id, None)

    def __len__(self) -> int:
        return len(self._held)

    def lend(self, task_id: TaskId, asker: NodeId, state: State) -> Body:
        """The body of `task_id` for `asker`, which must run rank 0 of the task's instance."""
        held = self._held.get(task_id)
        if held is None:
            raise BodyUnavailable(f"no request is waiting for task {task_id} (its caller left?)")
        instance_id, body = held
        instance = state.instances.get(instance_id)
        if instance is None:
            raise BodyUnavailable(f"the instance {instance_id} of task {task_id} is gone")
        if instance.leader.node_id != asker:
            raise BodyUnavailable(f"node {asker} does not run rank 0 of instance {instance_id}")
        return body
