"""A gpt-oss prompt rendered by openai-harmony's own renderer, not the model's chat template.

gpt-oss's Hugging Face template loses parts of a conversation: it renders only the first of an
assistant message's tool calls (the second call vanishes and its result is labelled with the
first one's name), and it reads earlier reasoning from a `thinking` field (the request's
`reasoning` is dropped). `render_conversation_for_completion` keeps them all: the reasoning
effort in the system message, the tools as a `functions` namespace in the developer message,
every earlier call and its result, and the analysis before a call (dropped once a final answer
follows, as the format wants).
"""

from __future__ import annotations

import datetime

from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyError,
    Message,
    ReasoningEffort,
    Role,
    SystemContent,
    ToolDescription,
)

from exo_core.plugin import ChatMessage, GenerationParams
from exo_engine_mlx.harmony_encoding import harmony_encoding
from exo_engine_mlx.prompt import PromptError

EFFORTS = {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM,
           "high": ReasoningEffort.HIGH}  # fmt: skip


def _system(params: GenerationParams) -> Message:
    effort = EFFORTS.get((params.reasoning_effort or "medium").lower(), ReasoningEffort.MEDIUM)
    content = (
        SystemContent.new()
        .with_reasoning_effort(effort)
        .with_conversation_start_date(datetime.date.today().isoformat())
    )
    return Message.from_role_and_content(Role.SYSTEM, content)


def _developer(params: GenerationParams, instructions: list[str]) -> Message | None:
    """The request's system messages as instructions and its tools as `functions`."""
    tools = [
        ToolDescription.new(t.name, t.description, t.parameters or None)
        for t in (params.tools if params.tool_choice != "none" else ())
    ]
    if not tools and not instructions:
        return None
    content = DeveloperContent.new()
    if instructions:
        content = content.with_instructions("\n\n".join(instructions))
    if tools:
        content = content.with_function_tools(tools)
    return Message.from_role_and_content(Role.DEVELOPER, content)


def _assistant(message: ChatMessage) -> list[Message]:
    out: list[Message] = []
    if message.reasoning:
        out.append(
            Message.from_role_and_content(Role.ASSISTANT, message.reasoning).with_channel(
                "analysis"
            )
        )
    if message.tool_calls:
        if message.text():  # a preamble before the calls
            text = Message.from_role_and_content(Role.ASSISTANT, message.text())
            out.append(text.with_channel("commentary"))
        for call in message.tool_calls:
            out.append(
                Message.from_role_and_content(Role.ASSISTANT, call.arguments or "{}")
                .with_channel("commentary")
                .with_recipient(f"functions.{call.name}")
                .with_content_type("<|constrain|>json")
            )
    elif message.text() or not out:
        out.append(
            Message.from_role_and_content(Role.ASSISTANT, message.text()).with_channel("final")
        )
    return out


def conversation(params: GenerationParams) -> Conversation:
    """The request as Harmony messages."""
    names: dict[str, str] = {}  # tool call id -> function name, to label the results
    instructions = [m.text() for m in params.messages if m.role == "system"]
    messages = [_system(params)]
    developer = _developer(params, instructions)
    if developer is not None:
        messages.append(developer)
    last_call = ""
    for m in params.messages:
        if m.role == "user":
            messages.append(Message.from_role_and_content(Role.USER, m.text()))
        elif m.role == "assistant":
            for call in m.tool_calls:
                names[call.id], last_call = call.name, call.name
            messages.extend(_assistant(m))
        elif m.role == "tool":
            name = m.name or names.get(m.tool_call_id, last_call)
            author = Author.new(Role.TOOL, f"functions.{name}")
            result = Message.from_author_and_content(author, m.text())
            messages.append(result.with_channel("commentary").with_recipient("assistant"))
    return Conversation.from_messages(messages)


def render_harmony(params: GenerationParams) -> str:
    """The prompt text for gpt-oss, its answer's header left open (`<|start|>assistant`)."""
    encoding = harmony_encoding()  # a failure to load it is the node's, not the request's
    try:
        tokens = encoding.render_conversation_for_completion(conversation(params), Role.ASSISTANT)
    except (ValueError, HarmonyError) as e:  # a shape pydantic or the renderer refuses
        raise PromptError(f"the gpt-oss prompt renderer refused the messages: {e}") from e
    return encoding.decode(tokens)
