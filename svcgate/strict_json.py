"""Strict JSON decoding for request bodies (pure, no I/O).

The standard library's decoder is lenient in ways that matter for an API (THREATS.md B8):
duplicate keys (the last wins, e.g. a smuggled ``role``), ``NaN``/``Infinity``, lone
surrogates, a byte-order mark, huge integers (``ValueError`` from the int-digits limit) and
deep nesting (``RecursionError``, which is not a ``ValueError``). Every one of these becomes
:class:`StrictJSONError`, which the API answers with 400 ``invalid``.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 32
MAX_INT_DIGITS = 40


class StrictJSONError(ValueError):
    """The body is not strict JSON. The message is safe to show to the client."""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise StrictJSONError(f"duplicate key {key[:64]!r}")
        result[key] = value
    return result


def _constant(name: str) -> Any:
    raise StrictJSONError(f"{name} is not valid JSON")


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise StrictJSONError("integer too large")
    return int(text)


def _check(value: Any, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise StrictJSONError(f"nesting deeper than {MAX_DEPTH}")
    if isinstance(value, str):
        _check_text(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key)
            _check(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check(item, depth + 1)


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise StrictJSONError("string contains a lone surrogate") from exc


def _nesting_exceeds(raw: str, limit: int) -> bool:
    """Cheap pre-scan so a 100k-deep body never reaches the recursive decoder."""
    depth = 0
    in_string = False
    escaped = False
    for char in raw:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
    return False


def loads_strict(body: bytes) -> Any:
    """Decode a UTF-8 JSON document strictly. Raises :class:`StrictJSONError`."""
    if body.startswith(b"\xef\xbb\xbf"):
        raise StrictJSONError("byte-order mark is not allowed")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StrictJSONError("body is not UTF-8") from exc
    if _nesting_exceeds(text, MAX_DEPTH):
        raise StrictJSONError(f"nesting deeper than {MAX_DEPTH}")
    try:
        value = json.loads(
            text,
            object_pairs_hook=_pairs,
            parse_constant=_constant,
            parse_int=_parse_int,
        )
    except StrictJSONError:
        raise
    except (ValueError, RecursionError) as exc:
        raise StrictJSONError("body is not valid JSON") from exc
    _check(value, 0)
    return value
