"""The command blocks of docs/operations.md, found by their markers (pure).

A block is a fenced code block whose opening fence names the language ``sh`` and that follows
a ``<!-- walkthrough: NAME -->`` line (blank lines between them are allowed). Every ``sh``
block must have a marker and every marker a block, so no command of the document escapes the
walkthrough's plan unnoticed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MARKER = re.compile(r"^<!-- walkthrough: ([a-z0-9-]+) -->$")
FENCE = re.compile(r"^(```+|~~~+)\s*([A-Za-z0-9_-]*)\s*$")


class DocError(Exception):
    """The document breaks the marker rules; the message names the line."""


@dataclass(frozen=True)
class Block:
    name: str
    text: str
    line: int  # 1-based line of the opening fence


def parse_blocks(markdown: str) -> dict[str, Block]:
    """Every marked ``sh`` block, in document order, by name."""
    blocks: dict[str, Block] = {}
    lines = markdown.splitlines()
    pending: tuple[str, int] | None = None
    index = 0
    while index < len(lines):
        line = lines[index]
        marker = MARKER.match(line.strip())
        fence = FENCE.match(line)
        if marker is not None:
            if pending is not None:
                raise DocError(f"line {pending[1]}: marker {pending[0]!r} has no block")
            pending = (marker.group(1), index + 1)
        elif fence is not None:
            closing, language = fence.group(1), fence.group(2)
            end = index + 1
            while end < len(lines) and lines[end].strip() != closing:
                end += 1
            if end == len(lines):
                raise DocError(f"line {index + 1}: unclosed code block")
            if language == "sh":
                if pending is None:
                    raise DocError(f"line {index + 1}: sh block without a walkthrough marker")
                name = pending[0]
                if name in blocks:
                    raise DocError(f"line {pending[1]}: marker {name!r} used twice")
                blocks[name] = Block(name, "\n".join(lines[index + 1 : end]) + "\n", index + 1)
            elif pending is not None:
                raise DocError(f"line {pending[1]}: marker {pending[0]!r} precedes a non-sh block")
            pending = None
            index = end
        elif line.strip() and pending is not None:
            raise DocError(f"line {pending[1]}: marker {pending[0]!r} is not followed by a block")
        index += 1
    if pending is not None:
        raise DocError(f"line {pending[1]}: marker {pending[0]!r} has no block")
    return blocks


def env_assignments(block: Block) -> dict[str, str]:
    """``KEY=VALUE`` lines of a block (comments and blank lines skipped)."""
    values: dict[str, str] = {}
    for number, raw in enumerate(block.text.splitlines(), start=block.line + 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not re.fullmatch(r"[A-Z_][A-Z0-9_]*", key):
            raise DocError(f"line {number}: not a KEY=VALUE line: {raw!r}")
        values[key] = value
    return values


def set_env_lines(text: str, values: dict[str, str]) -> str:
    """``text`` (an env file) with each key set: an existing line, commented out or not, is
    replaced in place; a key not present is appended."""
    lines = text.splitlines()
    for key, value in values.items():
        pattern = re.compile(rf"^\s*#?\s*{re.escape(key)}=")
        for index, line in enumerate(lines):
            if pattern.match(line):
                lines[index] = f"{key}={value}"
                break
        else:
            lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"
