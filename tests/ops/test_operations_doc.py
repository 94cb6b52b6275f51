"""docs/operations.md's command blocks match the walkthrough's plan (pure, no root).

The root walkthrough (test_operations_walkthrough.py) runs the blocks; this catches a block
added or renamed without deciding how the walkthrough treats it, within a second.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from doc_blocks import DocError, env_assignments, parse_blocks, set_env_lines
from walkthrough import PLAN

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def test_every_command_block_of_the_document_is_in_the_walkthrough_plan() -> None:
    blocks = parse_blocks(DOC.read_text())
    assert list(blocks) == list(PLAN)


def test_the_appendix_names_every_block() -> None:
    appendix = DOC.read_text().split("## Appendix: How this document is tested", 1)[1]
    for name, plan in PLAN.items():
        assert f"`{name}`" in appendix, f"{name} ({plan}) is not in the appendix"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("```sh\nls\n```\n", "without a walkthrough marker"),
        ("<!-- walkthrough: a -->\ntext\n```sh\nls\n```\n", "not followed by a block"),
        (
            "<!-- walkthrough: a -->\n```sh\nls\n```\n<!-- walkthrough: a -->\n```sh\nls\n```\n",
            "used twice",
        ),
        ("<!-- walkthrough: a -->\n```\nls\n```\n", "precedes a non-sh block"),
        ("<!-- walkthrough: a -->\n```sh\nls\n", "unclosed"),
    ],
)
def test_marker_rules_are_enforced(text: str, problem: str) -> None:
    with pytest.raises(DocError, match=problem):
        parse_blocks(text)


def test_env_lines_replace_commented_and_set_lines_and_append_new_ones() -> None:
    block = parse_blocks("<!-- walkthrough: e -->\n```sh\nA=1\n# note\nB=two words\nC=3\n```\n")[
        "e"
    ]
    values = env_assignments(block)
    assert values == {"A": "1", "B": "two words", "C": "3"}
    text = "# example\n#A=0\nB=old\n"
    assert set_env_lines(text, values) == "# example\nA=1\nB=two words\nC=3\n"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_of_the_document_resolves() -> None:
    for target in re.findall(r"\]\(([^)\s]+)\)", DOC.read_text()):
        if target.startswith(("http://", "https://")):
            continue
        path, _, fragment = target.partition("#")
        file = DOC.parent / (path or DOC.name)
        assert file.is_file(), target
        if fragment:
            headings = re.findall(r"^#+\s+(.*)$", file.read_text(), re.M)
            assert fragment in {_anchor(h) for h in headings}, target


def test_the_nginx_example_never_buffers_mcp_responses() -> None:
    """Event streams must pass as they are written; the walkthrough's MCP call answers with
    JSON and would not notice a buffering proxy."""
    conf = (DOC.parent / "examples" / "nginx-svcgate.conf").read_text()
    locations = dict(re.findall(r"location (= /mcp|/mcp/) \{(.*?)\}", conf, re.S))
    assert set(locations) == {"= /mcp", "/mcp/"}
    for body in locations.values():
        assert "proxy_buffering off;" in body
        assert "gzip off;" in body
        assert "proxy_pass http://svcgate_gateway;" in body
