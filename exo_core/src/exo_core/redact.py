"""Error text fit for a client or for the replicated state.

Exceptions end up in 5xx bodies and in runner errors every node stores. Those say what failed
in words: no tracebacks, no reprs of internal objects, no file paths of the machine (a path
is shortened to its last part). The full exception goes to the node's log instead.
"""

from __future__ import annotations

import re

MAX_CHARS = 300
# Two or more path components: /home/me/models/x or C:\\Users\\me\\x.
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[\\/][^\s\\/'\",:;()\[\]<>]+){2,}")
# `<object at 0x7f...>` style reprs.
_OBJECT_REPR = re.compile(r"<[^<>]*\bat 0x[0-9a-fA-F]+>")


def clean_text(text: str) -> str:
    """`text` as one short line: paths shortened to their last part, object reprs dropped."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    line = _OBJECT_REPR.sub("an object", line)
    line = _PATH.sub(lambda m: re.split(r"[\\/]", m.group(0))[-1], line)
    return line if len(line) <= MAX_CHARS else line[: MAX_CHARS - 3] + "..."


def public_message(error: BaseException) -> str:
    """What failed, in words: the exception's own message cleaned, or its kind when it has
    none (`an unexpected KeyError`)."""
    text = clean_text(str(error))
    if not text or isinstance(error, KeyError | AttributeError | TypeError | AssertionError):
        # These say which name or key failed, which means nothing to a caller.
        return f"an unexpected {type(error).__name__}"
    return text
