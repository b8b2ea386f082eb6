"""Tool-call arguments coerced to the tool's JSON schema, as the request declared it.

Models write `"5"` for an integer, `"true"` for a boolean, or a whole object as a string of
JSON; clients that validate against the schema they sent then refuse the call. Every value is
converted only where the schema names a type that the value is not and the conversion is
exact (`"5"` -> 5, `"2.5"` -> 2.5, `"TRUE"` -> true, `"null"` -> null, `'{"a": 1}'` -> an
object, 5 -> `"5"` for a string); anything else is left as the model wrote it. A value already
of an allowed type stays as it is, so `["string", "integer"]` keeps `"5"` a string.

Schemas come from clients: nothing here raises on an odd one (a `$ref` loop, a `type` that is
not a string, a schema that is not an object); what cannot be read is not coerced.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

Schema = Mapping[str, Any]

_DEPTH = 48  # deeper schemas or values are left as they are
_STEPS = 10_000  # a walk longer than this (~50 ms) leaves the value as it is
_INTEGER = re.compile(r"[+-]?\d{1,300}(?:\.0*)?")
_NUMBER = re.compile(r"[+-]?(?:\d{1,300}\.?\d{0,300}|\.\d{1,300})(?:[eE][+-]?\d{1,4})?")
_NULLS = ("null", "none")
_FAIL = object()


def coerce_value(value: Any, schema: Any, root: Any = None) -> Any:
    """`value` converted to what `schema` declares where that is exact; never raises. `root`
    is the document that local `$ref`s point into (the schema itself when not given)."""
    try:
        return _coerce(value, schema, _Doc(schema if root is None else root), 0)
    except (_TooMuch, RecursionError, ValueError, TypeError, OverflowError):
        return value


def keeps_strings(schema: Any, root: Any = None) -> bool:
    """Whether every string stays exactly as it is under `schema` (so a string value can be
    streamed as the model writes it, before it is complete)."""
    try:
        return _keeps_strings(schema, _Doc(schema if root is None else root), 0)
    except (_TooMuch, RecursionError, ValueError, TypeError):
        return False


def member_schema(schema: Any, key: str, root: Any = None) -> Any:
    """The schema of an object's member `key`: its property, else `additionalProperties`, else
    none ({}: not coerced)."""
    try:
        return _member(schema, key, _Doc(schema if root is None else root))
    except _TooMuch:
        return {}


def _member(schema: Any, key: str, doc: _Doc) -> Any:
    resolved = _resolve(schema, doc, 0)
    if not isinstance(resolved, Mapping):
        return {}
    properties = resolved.get("properties")
    if isinstance(properties, Mapping) and isinstance(properties.get(key), Mapping):
        return properties[key]
    extra = resolved.get("additionalProperties")
    return extra if isinstance(extra, Mapping) else {}


def plain_object(schema: Any, root: Any = None) -> bool:
    """Whether `schema` is an object schema whose members can be coerced one by one (no
    `anyOf`/`oneOf`/`allOf` at its top), or no schema at all."""
    try:
        resolved = _resolve(schema, _Doc(schema if root is None else root), 0)
    except _TooMuch:
        return False
    if not isinstance(resolved, Mapping):
        return True
    if any(k in resolved for k in ("anyOf", "oneOf", "allOf")):
        return False
    return _types(resolved) in ([], ["object"])


class _TooMuch(Exception):
    """A schema that would take too long to walk (a `$ref` to a union of itself, say)."""


class _Doc:
    """The schema document a walk reads `$ref`s in, and how many more steps it may take."""

    __slots__ = ("left", "root")

    def __init__(self, root: Any) -> None:
        self.root = root
        self.left = _STEPS

    def spend(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise _TooMuch


def _resolve(schema: Any, doc: _Doc, depth: int) -> Any:
    """A local `$ref` (`#/$defs/X`) followed to its target; anything else as it is."""
    doc.spend()
    while isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str):
        depth += 1
        ref: str = schema["$ref"]
        if depth > _DEPTH or not ref.startswith("#"):
            return {}
        target: Any = doc.root
        for part in ref[1:].split("/")[1:] if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(target, Mapping) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                return {}
        schema = target
    return schema


def _types(schema: Schema) -> list[str]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [t for t in kind if isinstance(t, str)]
    if isinstance(schema.get("properties"), Mapping):
        return ["object"]
    if isinstance(schema.get("items"), Mapping):
        return ["array"]
    return []


def _branches(schema: Schema) -> list[Schema]:
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            return [b for b in branches if isinstance(b, Mapping)]
    return []


def _is(value: Any, kind: str) -> bool:
    """Whether `value` already is of JSON type `kind` (a float is not an integer here, so that
    2.0 becomes 2)."""
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "null":
        return value is None
    return False


def _accepts(value: Any, schema: Any, doc: _Doc, depth: int) -> bool:
    """Whether `value`'s type is one `schema` allows as it is (no schema: any)."""
    doc.spend()  # every step of a walk pays, so no schema walks forever
    schema = _resolve(schema, doc, depth)
    if not isinstance(schema, Mapping):
        return True
    branches = _branches(schema)
    if branches:
        return any(_accepts(value, b, doc, depth + 1) for b in branches)
    types = _types(schema)
    return not types or any(_is(value, t) for t in types)


def _coerce(value: Any, schema: Any, doc: _Doc, depth: int) -> Any:
    doc.spend()  # every step of a walk pays, so no schema walks forever
    if depth > _DEPTH:
        return value
    schema = _resolve(schema, doc, depth)
    if not isinstance(schema, Mapping):
        return value
    for part in schema.get("allOf") or []:
        value = _coerce(value, part, doc, depth + 1)
    branches = _branches(schema)
    if branches:
        for branch in branches:  # the first branch that takes the value as it is
            if _accepts(value, branch, doc, depth + 1):
                return _coerce(value, branch, doc, depth + 1)
        for branch in branches:  # else the first that takes it converted
            converted = _coerce(value, branch, doc, depth + 1)
            if _accepts(converted, branch, doc, depth + 1):
                return converted
        return value
    types = _types(schema)
    for kind in types:
        if _is(value, kind):
            return _inside(value, schema, doc, depth)
    for kind in types:
        converted = _convert(value, kind)
        if converted is not _FAIL:
            return _inside(converted, schema, doc, depth)
    return _inside(value, schema, doc, depth) if not types else value


def _inside(value: Any, schema: Schema, doc: _Doc, depth: int) -> Any:
    """An object's members or an array's items coerced to their own schemas."""
    if isinstance(value, dict):
        return {k: _coerce(v, _member(schema, k, doc), doc, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        prefix = schema.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        items = schema.get("items")
        if isinstance(items, list):  # the older tuple form
            prefix, items = items, schema.get("additionalItems")
        return [
            _coerce(v, prefix[i] if i < len(prefix) else (items or {}), doc, depth + 1)
            for i, v in enumerate(value)
        ]
    return value


def _convert(value: Any, kind: str) -> Any:
    """`value` as JSON type `kind` when the conversion is exact, else `_FAIL`."""
    if kind in ("object", "array") and isinstance(value, str):
        try:
            parsed = json.loads(value, strict=False)
        except ValueError:
            return _FAIL
        return parsed if _is(parsed, kind) else _FAIL
    if kind == "integer":
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and _INTEGER.fullmatch(value.strip()):
            return int(value.strip().split(".")[0])
        return _FAIL
    if kind == "number" and isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        text = value.strip()
        if _INTEGER.fullmatch(text) and "." not in text:
            return int(text)
        number = float(text)
        return number if math.isfinite(number) else _FAIL
    if kind == "boolean" and isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if kind == "null" and isinstance(value, str) and value.strip().lower() in _NULLS:
        return None
    if kind == "string" and isinstance(value, int | float) and not isinstance(value, bool):
        return json.dumps(value)
    if kind == "string" and isinstance(value, bool):
        return "true" if value else "false"
    return _FAIL


def _keeps_strings(schema: Any, doc: _Doc, depth: int) -> bool:
    """Mirrors `_coerce` for a string value: true when it returns any string unchanged."""
    doc.spend()  # every step of a walk pays, so no schema walks forever
    if depth > _DEPTH:
        return True
    schema = _resolve(schema, doc, depth)
    if not isinstance(schema, Mapping):
        return True
    if not all(_keeps_strings(p, doc, depth + 1) for p in schema.get("allOf") or []):
        return False
    branches = _branches(schema)
    if branches:
        taking = [b for b in branches if _accepts("", b, doc, depth + 1)]
        return bool(taking) and _keeps_strings(taking[0], doc, depth + 1)
    types = _types(schema)
    return not types or "string" in types
