"""Pure decision code: durations, strict JSON, redirect targets, roles, flow cookies."""

from __future__ import annotations

import json
from urllib.parse import urljoin

import pytest
from hypothesis import given
from hypothesis import strategies as st

from svcgate import flow_cookie
from svcgate.duration import parse_duration
from svcgate.redirects import safe_next
from svcgate.roles import project_roles, role_for
from svcgate.strict_json import StrictJSONError, loads_strict


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("168h", 168 * 3600),
        ("90m", 5400),
        ("1h30m", 5400),
        ("1.5h", 5400),
        ("300ms", 0.3),
        ("2h45m30s", 2 * 3600 + 45 * 60 + 30),
        ("0", 0),
        ("10us", 1e-5),
    ],
)
def test_go_durations_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "h", "10", "-1h", "+1h", "1d", "1h 30m", "1H", "1hh", "x"])
def test_bad_go_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"."):
        parse_duration(text)


@pytest.mark.parametrize(
    "body",
    [
        b'{"a": 1, "a": 2}',
        b'{"x": NaN}',
        b'{"x": Infinity}',
        b'{"x": -Infinity}',
        b'{"x": "\\ud800"}',
        b'\xef\xbb\xbf{"x": 1}',
        b'{"x": ' + b"9" * 5000 + b"}",
        b"[" * 100_000 + b"]" * 100_000,
        b'{"x": 1',
        b"\xff\xfe",
        b"",
    ],
    ids=[
        "duplicate",
        "nan",
        "inf",
        "neg-inf",
        "lone-surrogate",
        "bom",
        "huge-int",
        "deep",
        "truncated",
        "not-utf8",
        "empty",
    ],
)
def test_lenient_json_is_refused(body: bytes) -> None:
    with pytest.raises(StrictJSONError):
        loads_strict(body)


def test_strict_json_accepts_ordinary_documents() -> None:
    assert loads_strict(b'{"name": "x", "n": [1, 2.5, true, null, "\\u00e9"]}') == {
        "name": "x",
        "n": [1, 2.5, True, None, "é"],
    }


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@given(json_values)
def test_strict_json_round_trips_ordinary_values(value: object) -> None:
    try:
        encoded = json.dumps(value).encode()
    except UnicodeEncodeError:
        return
    try:
        assert loads_strict(encoded) == value
    except StrictJSONError as exc:
        # Only lone surrogates (which hypothesis text can produce) are refused.
        assert "surrogate" in str(exc)


@pytest.mark.parametrize(
    "candidate",
    [
        "//evil.example",
        "/\\evil.example",
        "https:evil.example",
        "https://evil.example/",
        "evil.example",
        "/%2F%2Fevil.example",
        "/%5Cevil.example",
        "/%252F%252Fevil.example",
        "\\\\evil",
        "/\t/evil.example",
        "javascript:alert(1)",
        "",
        None,
    ],
)
def test_open_redirects_fall_back_to_root(candidate: str | None) -> None:
    assert safe_next(candidate) == "/"


@pytest.mark.parametrize("candidate", ["/", "/profiles/3", "/audit?before=10", "/a/b#c"])
def test_same_origin_paths_are_kept(candidate: str) -> None:
    assert safe_next(candidate) == candidate


@given(st.text(max_size=60))
def test_safe_next_always_stays_on_origin(candidate: str) -> None:
    base = "https://gw.example/"
    resolved = urljoin(base, safe_next(candidate))
    assert resolved.startswith("https://gw.example/")
    # Browsers also treat backslashes as slashes.
    assert urljoin(base, safe_next(candidate).replace("\\", "/")).startswith(base)


@pytest.mark.parametrize(
    ("claims", "role"),
    [
        ({"urn:zitadel:iam:org:project:roles": {"svc-admin": {"1": "d"}}}, "admin"),
        ({"urn:zitadel:iam:org:project:12345:roles": {"svc-admin": {"1": "d"}}}, "admin"),
        ({"urn:acme:iam:org:project:roles": {"svc-admin": {}}}, "admin"),
        ({"urn:zitadel:iam:org:project:roles": ["svc-admin"]}, "admin"),
        ({"urn:zitadel:iam:org:project:roles": {"viewer": {"1": "d"}}}, "user"),
        ({"urn:zitadel:iam:org:project:roles": {}}, "user"),
        ({"roles": ["svc-admin"]}, "user"),
        ({"urn:zitadel:iam:org:project:roles:extra": {"svc-admin": {}}}, "user"),
        ({"urn:zitadel:iam:org:project:roles": "svc-admin"}, "user"),
        ({}, "user"),
    ],
)
def test_admin_role_comes_only_from_the_project_roles_claim(claims: dict, role: str) -> None:
    assert role_for(claims, "svc-admin") == role


def test_project_roles_merges_every_roles_claim() -> None:
    claims = {
        "urn:zitadel:iam:org:project:roles": {"a": {}},
        "urn:zitadel:iam:org:project:9:roles": {"b": {}},
    }
    assert project_roles(claims) == {"a", "b"}


KEY = b"k" * 32


def test_flow_cookie_round_trip() -> None:
    flow = flow_cookie.Flow.new(next_path="/x", now=1000.0)
    assert flow_cookie.verify(flow_cookie.sign(flow, KEY), KEY, now=1001.0) == flow
    assert 43 <= len(flow.verifier) <= 128


def test_flow_cookie_expires_after_ten_minutes() -> None:
    flow = flow_cookie.Flow.new(next_path="/", now=1000.0)
    value = flow_cookie.sign(flow, KEY)
    with pytest.raises(flow_cookie.FlowCookieError, match="expired"):
        flow_cookie.verify(value, KEY, now=1000.0 + 601)


@pytest.mark.parametrize("mutate", ["payload", "mac", "key", "garbage", "empty"])
def test_forged_flow_cookies_fail(mutate: str) -> None:
    flow = flow_cookie.Flow.new(next_path="/", now=1000.0)
    value = flow_cookie.sign(flow, KEY)
    payload, mac = value.split(".")
    key = KEY
    if mutate == "payload":
        value = ("A" if payload[0] != "A" else "B") + payload[1:] + "." + mac
    elif mutate == "mac":
        value = payload + "." + ("A" if mac[0] != "A" else "B") + mac[1:]
    elif mutate == "key":
        key = b"x" * 32
    elif mutate == "garbage":
        value = "not-a-cookie"
    else:
        value = ""
    with pytest.raises(flow_cookie.FlowCookieError):
        flow_cookie.verify(value, key, now=1001.0)
