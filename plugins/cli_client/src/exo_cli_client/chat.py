"""`exo run MODEL [PROMPT]`: a chat in the terminal, streamed as it is generated."""

from __future__ import annotations

import argparse
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn

from exo_cli_client.client import EXIT_OK, ClientError, NodeClient, Prefill
from exo_cli_client.commands import ensure_running
from exo_cli_client.output import Output

BYE = "/bye"


class PrefillBar:
    """A bar of the prompt tokens read so far, on a terminal only; it goes away when the
    answer starts."""

    def __init__(self, out: Output) -> None:
        self._out = out
        self._bar: tuple[Progress, TaskID] | None = None

    def show(self, prefill: Prefill) -> None:
        if not self._out.rich:
            return
        if self._bar is None:
            bar = Progress(
                TextColumn("reading the prompt"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("tokens"),
                console=self._out.console,
                transient=True,
            )
            bar.start()
            self._bar = (bar, bar.add_task("prefill", total=prefill.total))
        bar, task = self._bar
        bar.update(task, completed=prefill.done, total=prefill.total)

    def end(self) -> None:
        if self._bar is not None:
            self._bar[0].stop()
            self._bar = None


def reply(client: NodeClient, out: Output, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Stream one answer to the terminal (thinking dimmed, a bar while a long prompt is
    prefilled); returns its text and usage."""
    prefill = PrefillBar(out)
    try:
        return _reply(client, out, body, prefill)
    finally:
        prefill.end()


def _reply(
    client: NodeClient, out: Output, body: dict[str, Any], prefill: PrefillBar
) -> tuple[str, dict[str, Any]]:
    text: list[str] = []
    usage: dict[str, Any] = {}
    thinking = False
    for chunk in client.stream_chat({**body, "stream_options": {"include_usage": True}}):
        if isinstance(chunk, Prefill):
            prefill.show(chunk)
            continue
        prefill.end()
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices", []):
            delta = choice.get("delta", {})
            reasoning = delta.get("reasoning_content")
            if reasoning:
                thinking = True
                _write(out, reasoning, style="dim")
            content = delta.get("content")
            if content:
                if thinking:
                    _write(out, "\n")
                    thinking = False
                text.append(content)
                _write(out, content)
    _write(out, "\n")
    return "".join(text), usage


def _write(out: Output, text: str, style: str | None = None) -> None:
    if out.rich:
        out.console.print(text, end="", style=style, markup=False, soft_wrap=True)
        out.console.file.flush()
    else:
        print(text, end="", flush=True)


def run(args: argparse.Namespace, client: NodeClient, out: Output) -> int:
    ensure_running(client, out, args.model)
    base: dict[str, Any] = {"model": args.model}
    if args.max_tokens:
        base["max_tokens"] = args.max_tokens
    if args.prompt:
        prompt = " ".join(args.prompt)
        _answer, usage = reply(client, out, {**base, "messages": [_user(prompt)]})
        if out.as_json:
            out.json({"content": _answer, "usage": usage})
        return EXIT_OK
    history: list[dict[str, Any]] = []
    out.line(f"chatting with {args.model}; {BYE} or Ctrl-D ends")
    while True:
        try:
            line = out.console.input(">>> ") if out.rich else input(">>> ")
        except EOFError:
            break
        if line.strip() == BYE:
            break
        if not line.strip():
            continue
        history.append(_user(line))
        try:
            answer, _usage = reply(client, out, {**base, "messages": history})
        except ClientError as e:
            history.pop()
            out.error(e.message)
            continue
        history.append({"role": "assistant", "content": answer})
    return EXIT_OK


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}
