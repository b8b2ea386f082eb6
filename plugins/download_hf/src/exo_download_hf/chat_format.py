"""What a custom card learns from a hub repo's tokenizer files: its tool-call format, its
thinking markers and whether its chat template switches thinking on and off.

The detection is mlx-lm's own (`mlx_lm.tokenizer_utils`), the same the MLX engine's runner
applies when it loads the model, run here on the repo's `tokenizer_config.json` (its chat
template and added tokens) before anything is downloaded. Without mlx-lm installed (a node
with no MLX engine) only what the template itself says is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exo_core.plugin import Capability
from exo_core.plugin.parsers import V4_BLOCK, V32_BLOCK, speaks_harmony, thinking_switch

# mlx-lm's tool parser whose format one of the core's output parsers reads: the card names
# the core's parser, so the node parses it too (as the built-in cards do).
_CORE_PARSERS = {"json_tools": "hermes"}
_DSML = (("deepseek_v4", V4_BLOCK), ("deepseek_v32", V32_BLOCK))


@dataclass(frozen=True)
class ChatFormat:
    # A core parser's name, else mlx-lm's tool parser module (or "harmony" for gpt-oss).
    tool_parser: str | None = None
    reasoning_parser: str | None = None  # "think" for <think> ... </think>
    capabilities: tuple[Capability, ...] = ()


def chat_template(tokenizer_config: dict[str, Any], template_file: str | None = None) -> str:
    """The chat template a repo ships: `chat_template.jinja`, else tokenizer_config.json's
    (a string, or named templates of which "default" or the first is used)."""
    if template_file:
        return template_file
    value = tokenizer_config.get("chat_template")
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = [t for t in value if isinstance(t, dict) and isinstance(t.get("template"), str)]
        default = [t for t in named if t.get("name") == "default"]
        return str((default or named or [{"template": ""}])[0]["template"])
    return ""


class _TokenizerFiles:
    """The part of a tokenizer mlx-lm's detection reads (`chat_template`, `get_vocab`,
    `encode`), from the repo's tokenizer_config.json: its added tokens are the markers."""

    def __init__(self, tokenizer_config: dict[str, Any], template: str) -> None:
        self.chat_template = template
        added = tokenizer_config.get("added_tokens_decoder")
        self._vocab = {
            str(token["content"]): int(token_id)
            for token_id, token in (added.items() if isinstance(added, dict) else [])
            if isinstance(token, dict) and "content" in token and str(token_id).isdigit()
        }

    def get_vocab(self) -> dict[str, int]:
        return self._vocab

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        # Only markers spread over several tokens are encoded; whether they exist is all
        # a card needs, not their ids.
        return []


def detect(tokenizer_config: dict[str, Any], template_file: str | None = None) -> ChatFormat:
    template = chat_template(tokenizer_config, template_file)
    tokens = _TokenizerFiles(tokenizer_config, template)
    try:
        # Private in mlx-lm, yet the one place its detection lives (pinned in uv.lock).
        from mlx_lm.tokenizer_utils import _infer_thinking, _infer_tool_parser
    except ImportError:
        tool, think_start = None, None
    else:
        tool = _infer_tool_parser(tokens)
        think_start = _infer_thinking(tokens)[0]
    if tool is None:  # DeepSeek's DSML (V4's block, V3.2's), which the core reads
        tool = next((name for name, (start, _) in _DSML if start in template), None)
    if tool is None and speaks_harmony(tokens.get_vocab()):
        # gpt-oss: its channels carry both thinking and calls; the runner parses them.
        tool, think_start = "harmony", "<|channel|>analysis"
    capabilities: list[Capability] = []
    if think_start is not None:
        capabilities.append(Capability.THINKING)
    if thinking_switch(template) is not None:  # `enable_thinking`, or DeepSeek V3.1's `thinking`
        capabilities.append(Capability.THINKING_TOGGLE)
    if tool is not None or "tools" in template:
        capabilities.append(Capability.TOOLS)
    return ChatFormat(
        tool_parser=_CORE_PARSERS.get(tool, tool) if tool is not None else None,
        reasoning_parser="think" if think_start == "<think>" else None,
        capabilities=tuple(capabilities),
    )
