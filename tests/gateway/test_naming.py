"""Catalogue names (svcgate.naming): the MCP rule, injectivity, order independence, routing."""

from __future__ import annotations

import hashlib
import random
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from svcgate.naming import (
    NAME_RULE,
    NameMap,
    exposed_name,
    map_names,
    resolve_resources,
    split_exposed,
)
from svcgate.servers import SERVER_NAME

TOOL_ALPHABET = string.ascii_letters + string.digits + "_-"
SERVER_HEAD = string.ascii_lowercase + string.digits
LONG_NAME = "list_pull_request_review_comments_with_reactions_and_resolution_status"


def tag(original: str) -> str:
    """The 8 hex characters the rule derives from an original name."""
    return hashlib.sha256(original.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def room(server: str) -> int:
    return 64 - len(server) - 1


def is_kept_unchanged(server: str, name: str) -> bool:
    """Rule 1, stated independently of the module: ``server_name`` is a valid MCP name."""
    return name != "" and NAME_RULE.fullmatch(f"{server}_{name}") is not None


servers = st.builds(
    lambda head, tail: head + tail,
    st.sampled_from(SERVER_HEAD),
    st.one_of(
        st.text(SERVER_HEAD + "-", max_size=12),
        # Long server names leave 0-12 characters for the suffix: the edge of the rule.
        st.text(SERVER_HEAD + "-", min_size=51, max_size=63),
    ),
)
valid_tool_names = st.text(TOOL_ALPHABET, min_size=1, max_size=70)
odd_tool_names = st.text(
    st.one_of(st.sampled_from(TOOL_ALPHABET + ". /:\n"), st.characters()), max_size=80
)
tool_names = st.one_of(valid_tool_names, odd_tool_names, st.sampled_from(["", "a-b", "a.b"]))


@st.composite
def name_lists(draw: st.DrawFn) -> list[str]:
    """Names that often collide once sanitized: ``x.y``, ``x y`` and ``x-y`` side by side."""
    names = draw(st.lists(tool_names, max_size=25))
    for base in draw(st.lists(valid_tool_names, max_size=4)):
        names += [base.replace("-", sep) for sep in draw(st.sets(st.sampled_from(". -é")))]
    return draw(st.permutations(names))


def check_consistent(server: str, names: list[str], result: NameMap) -> None:
    assert {v: k for k, v in result.exposed_to_original.items()} == result.original_to_exposed
    named = set(result.original_to_exposed)
    assert named | set(result.dropped) == set(names)
    assert not named & set(result.dropped)
    assert list(result.dropped) == sorted(set(result.dropped))
    for suffix, original in result.exposed_to_original.items():
        exposed = exposed_name(server, suffix)
        assert NAME_RULE.fullmatch(exposed), exposed
        assert split_exposed(exposed) == (server, suffix)
        assert original in names


# --- properties -------------------------------------------------------------------------


@given(servers, name_lists())
def test_every_exposed_name_is_a_valid_mcp_name_and_routes_back(
    server: str, names: list[str]
) -> None:
    check_consistent(server, names, map_names(server, names))


@given(servers, name_lists())
def test_mapping_is_injective(server: str, names: list[str]) -> None:
    result = map_names(server, names)
    suffixes = list(result.original_to_exposed.values())
    assert len(suffixes) == len(set(suffixes))
    assert len(result.exposed_to_original) == len(result.original_to_exposed)


@given(servers, name_lists(), st.randoms(use_true_random=False))
def test_mapping_depends_only_on_the_set_of_names(
    server: str, names: list[str], rng: random.Random
) -> None:
    shuffled = list(names) + list(names[: len(names) // 2])
    rng.shuffle(shuffled)
    assert map_names(server, shuffled) == map_names(server, names)
    assert map_names(server, reversed(names)) == map_names(server, iter(names))


@given(servers, name_lists())
def test_valid_names_keep_their_name_whatever_else_is_listed(server: str, names: list[str]) -> None:
    result = map_names(server, names)
    for name in names:
        if is_kept_unchanged(server, name):
            assert result.original_to_exposed[name] == name
        else:
            assert result.exposed_to_original.get(name) != name


@given(servers, name_lists())
def test_other_names_are_sanitized_or_hashed(server: str, names: list[str]) -> None:
    result = map_names(server, names)
    for original, suffix in result.original_to_exposed.items():
        if is_kept_unchanged(server, original):
            continue
        sanitized = "".join(c if c in TOOL_ALPHABET else "-" for c in original)
        keep = min(len(sanitized), room(server) - 9)
        hashed = f"{sanitized[:keep]}-{tag(original)}" if keep > 0 else tag(original)
        assert suffix in (sanitized, hashed)
        if suffix == sanitized:
            assert sanitized != ""
            assert len(sanitized) <= room(server)


@given(servers, name_lists())
def test_names_are_dropped_only_when_no_hashed_form_is_free(server: str, names: list[str]) -> None:
    result = map_names(server, names)
    for original in result.dropped:
        assert not is_kept_unchanged(server, original)
        if room(server) >= 8:
            sanitized = "".join(c if c in TOOL_ALPHABET else "-" for c in original)
            keep = min(len(sanitized), room(server) - 9)
            hashed = f"{sanitized[:keep]}-{tag(original)}" if keep > 0 else tag(original)
            assert result.exposed_to_original[hashed] != original


@given(servers, name_lists())
def test_nothing_is_dropped_when_the_suffix_has_room_and_no_name_mimics_a_hash(
    server: str, names: list[str]
) -> None:
    # Hashed forms can then only meet each other: a 2**-32 chance per pair, so never here.
    looks_hashed = [name for name in names if len(name) >= 8 and name[-8:].isalnum()]
    result = map_names(server, [name for name in names if name not in looks_hashed])
    if room(server) >= 8:
        assert result.dropped == ()


@given(servers, name_lists())
def test_repeated_names_count_once_and_are_not_dropped(server: str, names: list[str]) -> None:
    once = map_names(server, names)
    assert map_names(server, names * 3) == once
    assert len(once.dropped) == len(set(once.dropped))


@given(servers, st.text())
def test_split_exposed_inverts_exposed_name(server: str, suffix: str) -> None:
    assert split_exposed(exposed_name(server, suffix)) == (server, suffix)


@given(st.text())
def test_split_exposed_accepts_only_a_server_name_before_the_first_underscore(
    exposed: str,
) -> None:
    result = split_exposed(exposed)
    head, separator, tail = exposed.partition("_")
    if separator and SERVER_NAME.fullmatch(head):
        assert result == (head, tail)
    else:
        assert result is None


# --- pinned examples --------------------------------------------------------------------


def test_dotted_name_yields_to_an_existing_dashed_name() -> None:
    for names in (["a.b", "a-b"], ["a-b", "a.b"]):
        result = map_names("github", names)
        assert result.exposed_to_original == {"a-b": "a-b", "a-b-2e7336dc": "a.b"}
        assert result.dropped == ()
    assert tag("a.b") == "2e7336dc"


def test_dotted_name_alone_is_sanitized() -> None:
    assert map_names("github", ["a.b"]).original_to_exposed == {"a.b": "a-b"}


def test_names_sanitizing_alike_are_settled_in_sorted_order() -> None:
    result = map_names("github", ["a.b", "a b"])  # " " sorts before "."
    assert result.original_to_exposed == {"a b": "a-b", "a.b": "a-b-2e7336dc"}


def test_seventy_character_name_is_truncated_and_hashed() -> None:
    assert len(LONG_NAME) == 70
    result = map_names("github", [LONG_NAME])
    suffix = "list_pull_request_review_comments_with_reactions-7417efbf"
    assert result.original_to_exposed == {LONG_NAME: suffix}
    assert len(exposed_name("github", suffix)) == 64


def test_name_that_exactly_fills_64_characters_is_kept() -> None:
    name = "x" * room("github")
    assert map_names("github", [name]).original_to_exposed == {name: name}
    longer = name + "x"
    assert map_names("github", [longer]).original_to_exposed == {
        longer: "x" * 48 + "-" + tag(longer)
    }


def test_unicode_letters_become_dashes() -> None:
    assert map_names("github", ["héllo"]).original_to_exposed == {"héllo": "h-llo"}
    result = map_names("github", ["héllo", "h-llo"])
    assert result.original_to_exposed == {"h-llo": "h-llo", "héllo": "h-llo-3c48591d"}


@pytest.mark.parametrize(
    ("original", "suffix"),
    [
        ("read file", "read-file"),
        ("fs/read", "fs-read"),
        ("tool\n", "tool-"),  # NAME_RULE's "$" would accept the newline under match()
        ("日本", "--"),
        ("\ud800", "-"),
        ("", "e3b0c442"),
    ],
    ids=["space", "slash", "newline", "cjk", "lone-surrogate", "empty"],
)
def test_odd_names_get_pinned_suffixes(original: str, suffix: str) -> None:
    assert map_names("fs", [original]).original_to_exposed == {original: suffix}


@pytest.mark.parametrize(
    ("server_length", "suffix"),
    [(54, "c71bd109"), (55, "c71bd109"), (53, "x-c71bd109")],
    ids=["room-9", "room-8", "room-10"],
)
def test_hashed_form_shrinks_to_the_hash_alone(server_length: int, suffix: str) -> None:
    server = "s" * server_length
    assert map_names(server, ["x" * 70]).original_to_exposed == {"x" * 70: suffix}
    assert tag("x" * 70) == "c71bd109"


def test_long_server_names_drop_what_cannot_fit() -> None:
    server = "s" * 56  # room 7: below the 8 hex characters of the hashed form
    result = map_names(server, ["short", "x" * 8, "a.b", ""])
    assert result.original_to_exposed == {"short": "short", "a.b": "a-b"}
    assert result.dropped == ("", "xxxxxxxx")
    assert map_names("s" * 63, ["a"]).dropped == ("a",)
    assert map_names("s" * 64, ["a", "b"]).dropped == ("a", "b")


def test_name_whose_hashed_form_is_taken_is_dropped() -> None:
    names = ["a.b", "a-b", "a-b-2e7336dc"]
    result = map_names("github", names)
    assert result.dropped == ("a.b",)
    assert result.original_to_exposed == {"a-b": "a-b", "a-b-2e7336dc": "a-b-2e7336dc"}


def test_duplicates_are_ignored_not_dropped() -> None:
    result = map_names("github", ["a.b", "a.b", "run", "run"])
    assert result == NameMap({"a-b": "a.b", "run": "run"}, {"a.b": "a-b", "run": "run"}, ())


@pytest.mark.parametrize("server", ["", "Github", "-x", "a_b", "s" * 65, "git hub", "x\n"])
def test_invalid_server_names_are_refused(server: str) -> None:
    with pytest.raises(ValueError, match="server name"):
        map_names(server, ["tool"])
    with pytest.raises(ValueError, match="server name"):
        exposed_name(server, "tool")


def test_a_single_string_is_not_taken_for_a_list_of_names() -> None:
    with pytest.raises(TypeError, match="not one string"):
        map_names("github", "tool")


@pytest.mark.parametrize(
    "exposed",
    ["github", "_tool", "GitHub_tool", "-gh_tool", "git.hub_tool", "s" * 65 + "_x", "gh\n_x"],
)
def test_split_exposed_refuses_names_without_a_server(exposed: str) -> None:
    assert split_exposed(exposed) is None


def test_split_exposed_splits_at_the_first_underscore() -> None:
    assert split_exposed("github_create_issue") == ("github", "create_issue")
    assert split_exposed("a-b__x") == ("a-b", "_x")


# --- resources --------------------------------------------------------------------------

uri_lists = st.lists(st.sampled_from(["file:///a", "file:///b", "mem://c", "x:d", "é:e"]))


@given(st.dictionaries(servers, uri_lists, max_size=6))
def test_resources_go_to_the_first_server_by_name(per_server: dict[str, list[str]]) -> None:
    owners, hidden = resolve_resources(per_server)
    listing = {(server, uri) for server, uris in per_server.items() for uri in uris}
    assert set(owners) == {uri for _, uri in listing}
    for uri, owner in owners.items():
        assert owner == min(server for server, listed in listing if listed == uri)
    assert hidden == sorted((server, uri) for server, uri in listing if owners[uri] != server)


@given(st.dictionaries(servers, uri_lists, max_size=6), st.randoms(use_true_random=False))
def test_resources_do_not_depend_on_order(
    per_server: dict[str, list[str]], rng: random.Random
) -> None:
    items = [(server, list(reversed(uris))) for server, uris in per_server.items()]
    rng.shuffle(items)
    assert resolve_resources(dict(items)) == resolve_resources(per_server)


def test_resource_collision_pinned() -> None:
    owners, hidden = resolve_resources(
        {"notes": ["file:///x", "file:///y", "file:///x"], "docs": ["file:///x"]}
    )
    assert owners == {"file:///x": "docs", "file:///y": "notes"}
    assert hidden == [("notes", "file:///x")]


def test_resource_uris_repeated_by_one_server_are_not_hidden() -> None:
    assert resolve_resources({"docs": ["file:///x", "file:///x"]}) == ({"file:///x": "docs"}, [])


def test_resource_uris_given_as_one_string_are_refused() -> None:
    with pytest.raises(TypeError, match="not a string"):
        resolve_resources({"docs": "file:///x"})
