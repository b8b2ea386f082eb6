"""Turning a `GenerationParams` into prompt tokens with the model's chat template."""

from __future__ import annotations

import json
from typing import Any

from exo_core.plugin import ChatMessage, GenerationParams
from exo_core.plugin.parsers import thinking_switch
from exo_engine_mlx.harmony_encoding import is_harmony


class PromptError(ValueError):
    """The request cannot be rendered for this model (the message says why)."""


def template_message(message: ChatMessage, multimodal: bool = False) -> dict[str, Any]:
    """The dict shape chat templates expect (OpenAI-like, tool call arguments as objects).
    `multimodal`: a message with images keeps its parts, images as `{"type": "image"}` (where
    a vision model's template puts its image marker)."""
    content: Any = message.text()
    if multimodal and message.has_images() and not isinstance(message.content, str):
        content = [
            {"type": "image"} if p.type == "image" else {"type": "text", "text": p.text}
            for p in message.content
        ]
    out: dict[str, Any] = {"role": message.role, "content": content}
    if message.tool_calls:
        calls = []
        for call in message.tool_calls:
            try:
                arguments: Any = json.loads(call.arguments) if call.arguments else {}
            except ValueError:
                arguments = call.arguments
            calls.append(
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": arguments},
                }
            )
        out["tool_calls"] = calls
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    if message.name:
        out["name"] = message.name
    if message.reasoning:
        out["reasoning_content"] = message.reasoning
    return out


def template_tools(params: GenerationParams) -> list[dict[str, Any]]:
    """The request's tools in the OpenAI shape chat templates and tool parsers expect (none
    when the request turned tools off)."""
    if params.tool_choice == "none":
        return []
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in params.tools
    ]


def render(tokenizer: Any, params: GenerationParams, multimodal: bool = False) -> str:
    if params.prompt is not None and not params.messages:
        return params.prompt
    if is_harmony(tokenizer):  # gpt-oss: the format's own renderer
        from exo_engine_mlx.harmony_prompt import render_harmony  # openai-harmony: ~1 s import

        return render_harmony(params)
    messages = [template_message(m, multimodal) for m in params.messages]
    template = getattr(tokenizer, "chat_template", None)
    if template is None:
        # No template: a plain transcript the model can continue.
        lines = [f"{m['role']}: {m['content']}" for m in messages]
        return "\n".join([*lines, "assistant:"])
    kwargs: dict[str, Any] = {}
    tools = template_tools(params)
    if tools:
        kwargs["tools"] = tools
    if params.enable_thinking is not None:
        # Every dialect's thinking control, under the name this template reads it by.
        switch = thinking_switch(template) if isinstance(template, str) else None
        kwargs[switch or "enable_thinking"] = params.enable_thinking
    if params.reasoning_effort is not None:
        kwargs["reasoning_effort"] = params.reasoning_effort
    try:
        return tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **kwargs
        )
    except Exception as e:  # jinja errors: a role or shape the template refuses
        raise PromptError(f"the model's chat template refused the messages: {e}") from e


def prompt_tokens(tokenizer: Any, params: GenerationParams) -> list[int]:
    return encode(tokenizer, params, render(tokenizer, params))


def encode(tokenizer: Any, params: GenerationParams, text: str) -> list[int]:
    """The tokens of a rendered prompt."""
    raw = params.prompt is not None and not params.messages
    # A rendered template already carries its special tokens (BOS included).
    tokens = list(tokenizer.encode(text, add_special_tokens=raw))
    if not tokens:
        raise PromptError("the prompt is empty")
    return tokens
