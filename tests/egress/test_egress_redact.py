"""Response redaction of the injected secret (THREATS C8): forms, streaming, lengths.

A naive per-position reference (:func:`reference`) defines the expected output: every byte
inside any occurrence of any form becomes ``*``. The streaming redactor must agree with it
for every chunking.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
from urllib.parse import quote, quote_plus, urlencode

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svcgate.egress.redact import StreamRedactor, redact, secret_forms

SECRET = b'sk-live_ab/c+d=e"f\\g h\xc3\xa9-0123456789'


def reference(data: bytes, forms: Sequence[bytes]) -> tuple[bytes, int]:
    spans = sorted(
        (
            (at, at + len(form))
            for form in forms
            for at in range(len(data) - len(form) + 1)
            if data[at : at + len(form)] == form
        ),
        key=lambda span: (span[0], -span[1]),
    )
    out = bytearray(data)
    count = 0
    reach = -1
    for start, end in spans:
        out[start:end] = b"*" * (end - start)
        if end > reach:
            count += 1
            reach = end
    return bytes(out), count


def stream(data: bytes, forms: Sequence[bytes], cuts: Sequence[int]) -> tuple[bytes, int]:
    redactor = StreamRedactor(forms)
    pieces: list[bytes] = []
    previous = 0
    for cut in sorted({min(max(c, 0), len(data)) for c in cuts}):
        pieces.append(redactor.feed(data[previous:cut]))
        previous = cut
    pieces.append(redactor.feed(data[previous:]))
    pieces.append(redactor.finish())
    return b"".join(pieces), redactor.redactions


def assert_clean(out: bytes, forms: Sequence[bytes]) -> None:
    for form in forms:
        if b"*" not in form:
            assert form not in out, form


# --- forms --------------------------------------------------------------------------------


def test_forms_are_long_enough_unique_and_longest_first() -> None:
    forms = secret_forms(SECRET)
    assert len(set(forms)) == len(forms)
    assert all(len(form) >= 4 for form in forms)
    assert [len(f) for f in forms] == sorted((len(f) for f in forms), reverse=True)
    assert SECRET in forms
    assert quote(SECRET, safe="").encode() in forms
    assert quote_plus(SECRET).encode() in forms
    assert json.dumps(SECRET.decode())[1:-1].encode() in forms


def test_short_forms_are_dropped() -> None:
    assert secret_forms(b"ab") == ()
    assert secret_forms(b"abc") == (b"YWJj",)  # only base64 at alignment 0 reaches 4 bytes
    assert b"abcd" in secret_forms(b"abcd")


def test_plain_ascii_secret_has_no_redundant_forms() -> None:
    forms = secret_forms(b"tok_0123456789abcdef")
    # raw == quoted == JSON; six base64 cores (std and URL-safe coincide for this secret
    # only when no '+' or '/' appears, which is data-dependent), so just bound the count.
    assert forms.count(b"tok_0123456789abcdef") == 1
    assert len(forms) <= 1 + 6


@pytest.mark.parametrize(
    "form",
    secret_forms(SECRET),
    ids=lambda form: form.decode("utf-8", "replace")[:30],
)
def test_every_form_is_scrubbed_inside_a_json_body(form: bytes) -> None:
    forms = secret_forms(SECRET)
    body = b'{"headers": {"X-Api-Key": "' + form + b'", "Host": "api.example.com"}}'
    out, count = redact(body, forms)
    assert len(out) == len(body)
    assert count >= 1
    assert_clean(out, forms)
    assert out.startswith(b'{"headers": {"X-Api-Key": "')
    assert out.endswith(b'", "Host": "api.example.com"}}')


@pytest.mark.parametrize(
    "body",
    [
        json.dumps({"headers": {"Authorization": "Bearer " + SECRET.decode()}}).encode(),
        json.dumps({"v": SECRET.decode()}, ensure_ascii=False).encode(),
        urlencode({"api_key": SECRET}).encode(),
        b"GET /x?key=" + quote(SECRET, safe="").lower().encode() + b" HTTP/1.1",
        b"token=" + base64.urlsafe_b64encode(b'{"k":"' + SECRET + b'"}').rstrip(b"="),
    ],
    ids=["json-ascii", "json-utf8", "urlencode", "lowercase-hex", "base64url-jwt-like"],
)
def test_realistic_reflections_are_scrubbed(body: bytes) -> None:
    forms = secret_forms(SECRET)
    out, count = redact(body, forms)
    assert count >= 1
    assert len(out) == len(body)
    assert_clean(out, forms)


@pytest.mark.parametrize("user", [b"", b"u", b"us", b"usr", b"user", b"users"])
@pytest.mark.parametrize("encode", [base64.b64encode, base64.urlsafe_b64encode])
def test_http_basic_base64_is_scrubbed_at_every_alignment(
    user: bytes, encode: Callable[[bytes], bytes]
) -> None:
    forms = secret_forms(SECRET)
    blob = encode(user + b":" + SECRET)
    header = b"Authorization: Basic " + blob + b"\r\n"
    out, count = redact(header, forms)
    assert count >= 1
    assert len(out) == len(header)
    assert_clean(out, forms)
    # At most 3 characters on each side of the secret's core survive.
    assert out.count(b"*") >= len(blob) - len(base64.b64encode(user + b":")) - 6


@settings(max_examples=150, deadline=None)
@given(
    secret=st.binary(min_size=4, max_size=40),
    before=st.binary(max_size=20),
    after=st.binary(max_size=20),
    urlsafe=st.booleans(),
)
def test_base64_core_appears_whatever_surrounds_the_secret(
    secret: bytes, before: bytes, after: bytes, urlsafe: bool
) -> None:
    encode = base64.urlsafe_b64encode if urlsafe else base64.b64encode
    blob = encode(before + secret + after)
    cores = [form for form in secret_forms(secret) if form in blob]
    assert cores


# --- streaming ----------------------------------------------------------------------------


def test_no_forms_passes_the_same_object_through() -> None:
    redactor = StreamRedactor(())
    chunk = b"x" * 1000 + SECRET
    assert redactor.feed(chunk) is chunk
    assert redactor.finish() == b""
    assert redactor.redactions == 0


def test_clean_data_is_byte_identical_and_not_held_back() -> None:
    forms = secret_forms(SECRET)
    redactor = StreamRedactor(forms)
    chunk = b'data: {"jsonrpc": "2.0", "id": 1}\n\n'
    assert redactor.feed(chunk) == chunk  # nothing here can start a form
    assert redactor.finish() == b""
    assert redactor.redactions == 0


def test_possible_form_start_is_held_back_then_released() -> None:
    forms = [b"secret-token-123"]
    redactor = StreamRedactor(forms)
    assert redactor.feed(b"hello secret-tok") == b"hello "
    assert redactor.feed(b"en-999 bye") == b"secret-token-999 bye"
    assert redactor.feed(b" secret-token-1") == b" "
    assert redactor.finish() == b"secret-token-1"
    assert redactor.redactions == 0


def test_hold_back_is_bounded() -> None:
    forms = [b"aaaaaaaa"]
    redactor = StreamRedactor(forms)
    emitted = redactor.feed(b"a" * 7)
    assert emitted == b""
    emitted = redactor.feed(b"b" + b"a" * 20)
    assert emitted == b"aaaaaaab" + b"*" * 13
    assert redactor.finish() == b"*" * 7


def test_secret_split_at_every_boundary() -> None:
    forms = secret_forms(SECRET)
    body = b'{"reflected": "' + SECRET + b'", "again": "' + quote(SECRET, safe="").encode() + b'"}'
    expected, expected_count = reference(body, forms)
    assert_clean(expected, forms)
    for cut in range(len(body) + 1):
        assert stream(body, forms, [cut]) == (expected, expected_count)
    for first in range(0, len(body), 7):
        for second in range(first, len(body), 5):
            assert stream(body, forms, [first, second]) == (expected, expected_count)


def test_one_byte_at_a_time() -> None:
    forms = secret_forms(SECRET)
    body = b"x" * 5 + base64.b64encode(b"me:" + SECRET) + b"\r\n" + SECRET + SECRET
    out, count = stream(body, forms, range(len(body)))
    assert (out, count) == reference(body, forms)
    assert count >= 3
    assert_clean(out, forms)


def test_overlapping_occurrences_are_all_covered() -> None:
    out, count = redact(b"xxabcdefghxx", [b"abcd", b"cdefgh"])
    assert out == b"xx********xx"
    assert count == 2
    out, count = redact(b"abababab", [b"abab"])
    assert out == b"********"
    assert count == 3


def test_nested_occurrence_is_counted_once() -> None:
    out, count = redact(b"--abcdef--", [b"abcdef", b"bcd"])
    assert out == b"--******--"
    assert count == 1


def test_occurrence_reaching_into_the_held_tail_stays_starred() -> None:
    # "cd" is held back (it may start "cdxy") although it ends an "abcd" occurrence.
    redactor = StreamRedactor([b"abcd", b"cdxy"])
    assert redactor.feed(b"-abcd") == b"-**"
    assert redactor.feed(b"e") == b"**e"
    assert redactor.finish() == b""
    assert redactor.redactions == 1


def test_nested_count_is_settled_only_when_the_tail_is() -> None:
    for cuts in ([], [1]):
        assert stream(b"a\0", [b"a", b"a\0"], cuts) == (b"**", 1)
        assert stream(b"a!", [b"a", b"a\0"], cuts) == (b"*!", 1)


def test_redact_one_shot() -> None:
    value = b"Bearer " + SECRET
    out, count = redact(value, secret_forms(SECRET))
    assert out == b"Bearer " + b"*" * len(SECRET)
    assert count == 1
    assert redact(b"nothing here", secret_forms(SECRET)) == (b"nothing here", 0)


def test_empty_form_is_refused() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        StreamRedactor([b"abcd", b""])


def test_empty_chunks_are_harmless() -> None:
    redactor = StreamRedactor([b"abcd"])
    assert redactor.feed(b"") == b""
    assert redactor.feed(b"xab") == b"x"
    assert redactor.feed(b"") == b""
    assert redactor.feed(b"cd!") == b"****!"
    assert redactor.finish() == b""


def _embed(secret: bytes, before: bytes, after: bytes, how: str) -> bytes:
    if how == "raw":
        return before + secret + after
    if how == "base64":
        return before + base64.b64encode(before + secret + after) + after
    if how == "base64url":
        return base64.urlsafe_b64encode(before + secret + after).rstrip(b"=")
    if how == "quote":
        return before + quote(secret, safe="").encode() + after
    if how == "quote_plus":
        return before + quote_plus(secret).encode() + after
    return before + json.dumps(secret.decode("utf-8", "replace")).encode() + after


@settings(max_examples=300, deadline=None)
@given(
    secret=st.binary(min_size=8, max_size=48),
    before=st.binary(max_size=64),
    after=st.binary(max_size=64),
    how=st.sampled_from(["raw", "base64", "base64url", "quote", "quote_plus", "json"]),
    repeat=st.integers(min_value=1, max_value=3),
    cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=12),
)
def test_property_random_secret_surroundings_and_chunking(
    secret: bytes, before: bytes, after: bytes, how: str, repeat: int, cuts: list[int]
) -> None:
    forms = secret_forms(secret)
    body = _embed(secret, before, after, how) * repeat
    out, count = stream(body, forms, cuts)
    assert len(out) == len(body)
    assert (out, count) == reference(body, forms)
    assert count >= 1
    assert_clean(out, forms)


@settings(max_examples=150, deadline=None)
@given(
    data=st.binary(max_size=300),
    forms=st.lists(st.binary(min_size=1, max_size=6), min_size=1, max_size=4),
    cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=20),
)
def test_property_streaming_matches_reference_for_arbitrary_forms(
    data: bytes, forms: list[bytes], cuts: list[int]
) -> None:
    assert stream(data, forms, cuts) == reference(data, sorted(set(forms), key=len, reverse=True))
