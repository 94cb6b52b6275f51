"""Tool pinning (pure): a server cannot change what a model is told after install (THREATS F5).

A registry manifest lists each tool with the SHA-256 of its canonical definition. At every
listing (at spawn, and again whenever the server announces ``tools/list_changed``) each tool
the server offers is compared with its pin:

- no pin for that name (a tool that appeared after install): withheld, reason ``new``;
- a pin whose hash differs (description, schema, annotations or title changed): withheld,
  reason ``changed``;
- a matching pin marked ``default: false``: not exposed (no event: that is the manifest's
  choice, not an attack);
- a matching pin marked ``default: true``: exposed.

Canonical definition: the tool object as the server sends it, without ``_meta`` (free-form,
often volatile), serialised as JSON with sorted keys, no insignificant whitespace, and UTF-8
(``ensure_ascii=False``). ``svcgate registry pin-tools`` prints the pins of a ``tools/list``
result, so an index author never computes them by hand.

Annotations (the read-only, destructive and similar hints) are hashed like everything else
but never decide anything here or anywhere else in the gateway (THREATS F8).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from svcgate.registry.index import ToolPin

NEW = "new"
CHANGED = "changed"


def canonical(tool: Mapping[str, Any]) -> bytes:
    body = {key: value for key, value in tool.items() if key != "_meta"}
    return json.dumps(
        body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def tool_hash(tool: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical(tool)).hexdigest()


@dataclass(frozen=True)
class Withheld:
    name: str
    reason: str  # NEW or CHANGED
    sha256: str


def check_tools(
    tools: Iterable[dict[str, Any]], pins: Mapping[str, ToolPin]
) -> tuple[list[dict[str, Any]], list[Withheld]]:
    """(tools to expose, tools withheld); see the module docstring."""
    exposed: list[dict[str, Any]] = []
    withheld: list[Withheld] = []
    for tool in tools:
        name = tool.get("name")
        if not isinstance(name, str):
            continue
        try:
            digest = tool_hash(tool)
        except (TypeError, ValueError):  # NaN or an unserialisable value: never exposed
            withheld.append(Withheld(name, CHANGED, ""))
            continue
        pin = pins.get(name)
        if pin is None:
            withheld.append(Withheld(name, NEW, digest))
        elif pin.sha256 != digest:
            withheld.append(Withheld(name, CHANGED, digest))
        elif pin.default:
            exposed.append(tool)
    return exposed, withheld


def pins_for(tools: Iterable[Mapping[str, Any]], default: bool = True) -> list[dict[str, Any]]:
    """Manifest ``tools`` entries for a ``tools/list`` result (``svcgate registry pin-tools``)."""
    return [
        {"name": tool["name"], "default": default, "sha256": tool_hash(tool)}
        for tool in tools
        if isinstance(tool.get("name"), str)
    ]
