"""Address safety of the egress proxy: canonical hosts, authorities, classify (THREATS C1-C4).

Table tests pin every rule of :mod:`svcgate.egress.addresses`; Hypothesis checks that
arbitrary text only ever raises :class:`TargetError`, that canonicalisation is idempotent,
that numeric IPv4 decoding agrees with libc ``inet_aton`` and that wildcard matching over
canonical hosts agrees with a label-wise reference matcher.
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svcgate.egress.addresses import (
    IPAddress,
    Network,
    Target,
    TargetError,
    canonical_host,
    classify,
    parse_authority,
    parse_networks,
)
from svcgate.egress.local_addrs import own_addresses
from svcgate.host_patterns import matches, normalize_pattern

REASONS = {
    "metadata",
    "unspecified",
    "multicast",
    "broadcast",
    "embedded_ipv4",
    "own_address",
    "loopback",
    "private",
    "link_local",
    "cgnat",
    "reserved",
}


def ip(text: str) -> IPAddress:
    return ipaddress.ip_address(text)


def nets(*texts: str) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(text) for text in texts)


# --- C3: IP literals in every encoding --------------------------------------------------------

C3_VECTORS = [
    ("2130706433", "127.0.0.1", "loopback"),
    ("0x7f000001", "127.0.0.1", "loopback"),
    ("0177.0.0.1", "127.0.0.1", "loopback"),
    ("127.1", "127.0.0.1", "loopback"),
    ("0", "0.0.0.0", "unspecified"),
    ("[::ffff:127.0.0.1]", "::ffff:127.0.0.1", "embedded_ipv4"),
    ("[64:ff9b::7f00:1]", "64:ff9b::7f00:1", "embedded_ipv4"),
    ("[2002:7f00:1::]", "2002:7f00:1::", "embedded_ipv4"),
    ("[2001:0:4136:e378:8000:63bf:3fff:fdd2]", "2001:0:4136:e378:8000:63bf:3fff:fdd2",
     "embedded_ipv4"),  # Teredo
    ("[::127.0.0.1]", "::127.0.0.1", "embedded_ipv4"),
    ("[fd00:ec2::254]", "fd00:ec2::254", "metadata"),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "address", "reason"), C3_VECTORS)
def test_c3_vectors_are_ip_literals_and_denied(raw: str, address: str, reason: str) -> None:
    host, parsed = canonical_host(raw)
    assert parsed == ip(address)
    assert host == str(ip(address))
    assert classify(parsed) == reason
    # Denied even under the widest carve-out, except plain loopback which an operator may open.
    wide = nets("0.0.0.0/0", "::/0")
    if reason == "loopback":
        assert classify(parsed, allowed=wide) is None
    else:
        assert classify(parsed, allowed=wide) == reason
    # The same through an authority, as the proxy sees it.
    target = parse_authority(f"{raw}:443")
    assert target.ip == parsed
    assert target.port == 443


NUMERIC_IPV4 = [
    ("2130706433", "127.0.0.1"),
    ("0x7f000001", "127.0.0.1"),
    ("0X7F000001", "127.0.0.1"),
    ("0X7F.1", "127.0.0.1"),
    ("0177.0.0.1", "127.0.0.1"),
    ("127.1", "127.0.0.1"),
    ("127.0.1", "127.0.0.1"),
    ("0", "0.0.0.0"),
    ("017700000001", "127.0.0.1"),
    ("0x7f.0.0.01", "127.0.0.1"),
    ("127.0.0.1.", "127.0.0.1"),
    ("0.0.0.0256", "0.0.0.174"),
    ("00000000000000000000001", "0.0.0.1"),
    ("4294967295", "255.255.255.255"),
    ("0xffffffff", "255.255.255.255"),
    ("1.2.65535", "1.2.255.255"),
    ("1.16777215", "1.255.255.255"),
    ("169.254.43518", "169.254.169.254"),
    ("0xa9fea9fe", "169.254.169.254"),
    ("８.８.８.８", "8.8.8.8"),  # full-width digits map to ASCII under UTS #46
    ("１２７．０．０．１", "127.0.0.1"),  # full-width dots too
]


@pytest.mark.parametrize(("raw", "address"), NUMERIC_IPV4)
def test_numeric_ipv4_forms_are_decoded(raw: str, address: str) -> None:
    assert canonical_host(raw) == (address, ipaddress.IPv4Address(address))


NOT_IPV4 = [
    "example.123",
    "1.2.3.4.5",
    "08",
    "0.0.0.09",
    "0x",
    "1.2.3.0x",
    "0x100000000",
    "4294967296",
    "1.2.65536",
    "1.16777216",
    "256.1.1.1",
    "1.2.3.256",
    "1..2",
    ".1",
    "1.2.3.4..",
    "a.0x1",
    "+1",
]


@pytest.mark.parametrize("raw", NOT_IPV4)
def test_numeric_last_label_must_be_ipv4(raw: str) -> None:
    with pytest.raises(TargetError):
        canonical_host(raw)


@pytest.mark.parametrize(
    ("raw", "host"),
    [
        ("1.2.3.4.example.com", "1.2.3.4.example.com"),
        ("0x7f.example", "0x7f.example"),
        ("0x1g", "0x1g"),  # inet_aton refuses it too: a (single-label) name
        ("123abc", "123abc"),
        ("00x1", "00x1"),
        ("0x0x1", "0x0x1"),
        ("localhost", "localhost"),
    ],
)
def test_numeric_looking_names_stay_names(raw: str, host: str) -> None:
    assert canonical_host(raw) == (host, None)


INET_ATON_SPELLINGS = [
    *(raw for raw, _ in NUMERIC_IPV4 if raw.isascii()),
    *(raw for raw in NOT_IPV4),
    "1", "255", "256", "0377.0377.0377.0377", "0400.0.0.0", "0xff.0xff.0xff.0xff",
    "0x100.0.0.0", "1.0x10000", "1.0xffffff", "1.1.0xffff", "1.1.0x10000", "0xFf.1",
    "0.0", "0.0.0", "00", "000.000", "0x0", "0x00000000000000000001", "09", "0019",
    "1.2.3.4", "1.2.3.04", "1.2.3.08", "01.02.03.04", "99999999999999999999",
]  # fmt: skip


def _inet_aton(raw: str) -> ipaddress.IPv4Address | None:
    try:
        return ipaddress.IPv4Address(socket.inet_aton(raw))
    except OSError:
        return None


def _check_against_inet_aton(raw: str) -> None:
    expected = _inet_aton(raw)
    try:
        _, decoded = canonical_host(raw)
    except TargetError:
        decoded = None
        refused = True
    else:
        refused = False
    if expected is not None:
        assert decoded == expected, raw
    elif not raw.endswith("."):
        # libc refuses it: so must we, unless it is a name (its last label is not numeric).
        assert refused or decoded is None, raw


@pytest.mark.parametrize("raw", INET_ATON_SPELLINGS)
def test_numeric_ipv4_agrees_with_inet_aton(raw: str) -> None:
    _check_against_inet_aton(raw)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789abcdefxX.", min_size=1, max_size=24))
def test_numeric_ipv4_agrees_with_inet_aton_generated(raw: str) -> None:
    _check_against_inet_aton(raw)


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1), st.integers(min_value=1, max_value=4))
def test_numeric_ipv4_every_part_count_and_base(number: int, count: int) -> None:
    address = ipaddress.IPv4Address(number)
    octets = list(address.packed)
    parts = [*octets[: count - 1], int.from_bytes(bytes(octets[count - 1 :]), "big")]
    for fmt in ("{}", "0x{:x}", "0X{:X}", "0{:o}"):
        raw = ".".join(fmt.format(part) for part in parts)
        assert canonical_host(raw) == (str(address), address), raw
        assert _inet_aton(raw) == address, raw


# --- IPv6 literals ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "host"),
    [
        ("[::1]", "::1"),
        ("::1", "::1"),
        ("[0:0:0:0:0:0:0:1]", "::1"),
        ("[2606:4700:4700:0000:0000:0000:0000:1111]", "2606:4700:4700::1111"),
        ("[2001:DB8::A]", "2001:db8::a"),
        ("2001:db8::a", "2001:db8::a"),
        ("[::ffff:7f00:1]", str(ipaddress.IPv6Address("::ffff:127.0.0.1"))),
    ],
)
def test_ipv6_literals(raw: str, host: str) -> None:
    assert canonical_host(raw) == (host, ipaddress.IPv6Address(host))


@pytest.mark.parametrize(
    "raw",
    [
        "[127.0.0.1]",
        "[::1",
        "::1]",
        "[::1].",
        "[[::1]]",
        "[]",
        "[example.com]",
        "[fe80::1%eth0]",
        "[fe80::1%25eth0]",
        "fe80::1%eth0",
        "[::1]:443",
        "1:2:3:4:5:6:7:8:9",
        "[::ffff:127.0.0.01]",
        "[ ::1]",
    ],
)
def test_bad_ipv6(raw: str) -> None:
    with pytest.raises(TargetError):
        canonical_host(raw)


# --- Names ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "host"),
    [
        ("example.com", "example.com"),
        ("API.Example.COM.", "api.example.com"),
        ("ехаmple.com", "xn--mple-43d3a6i.com"),  # Cyrillic е, х, а
        ("bücher.de", "xn--bcher-kva.de"),
        ("BÜCHER.DE", "xn--bcher-kva.de"),
        ("xn--bcher-kva.de", "xn--bcher-kva.de"),
        ("straße.de", "xn--strae-oqa.de"),  # non-transitional: ß is kept
        ("example。com", "example.com"),  # ideographic full stop is a dot
        ("ｅｘａｍｐｌｅ．ｃｏｍ", "example.com"),
        ("r3---sn-abc.googlevideo.com", "r3---sn-abc.googlevideo.com"),
        ("a", "a"),
        ("a-b.c", "a-b.c"),
        ("1.2.3.4.example.com", "1.2.3.4.example.com"),
        ("a" * 63 + ".com", "a" * 63 + ".com"),
        (".".join(["a" * 63] * 3 + ["b" * 61]), ".".join(["a" * 63] * 3 + ["b" * 61])),
        (".".join(["a" * 63] * 3 + ["b" * 61]) + ".", ".".join(["a" * 63] * 3 + ["b" * 61])),
    ],
)
def test_names(raw: str, host: str) -> None:
    assert canonical_host(raw) == (host, None)


@pytest.mark.parametrize(
    "raw",
    [
        "",
        ".",
        "..",
        "example.com..",
        ".example.com",
        "a..b",
        "-a.com",
        "a-.com",
        "a_b.com",
        "_dmarc.example.com",
        "a" * 64 + ".com",
        ".".join(["a" * 63] * 3 + ["b" * 62]),
        "x" * 300,
        "exa mple.com",
        " example.com",
        "example.com ",
        "example.com\t",
        "example.com\n",
        "exa\x00mple.com",
        "exa\x7fmple.com",
        "ex\u00adample.com",  # soft hyphen: invisible, would map to example.com
        "ex\u200bample.com",  # zero-width space
        "example\u2028.com",
        "exa\u00a0mple.com",
        "user@example.com",
        "example.com/path",
        "example.com\\path",
        "example.com%2f",
        "example.com?",
        "example.com#",
        "example.com＠evil.net",  # full-width @ maps to @
        "example.com／x",
        "*.example.com",
        "xn--",
        "xn--.com",
        "xn--a.com",
        "xn--example-.com",
        "xn--abc-",
        "xn--zz-zz.com",
        "a\u200db.com",  # ZWJ outside the contexts IDNA allows
        "\U000e0001.com",
        "☃.com",  # symbols are not IDNA 2008
        "\ud800.com",
    ],
)
def test_bad_names(raw: str) -> None:
    with pytest.raises(TargetError) as info:
        canonical_host(raw)
    assert len(str(info.value)) < 200


def test_error_message_truncates_echoed_input() -> None:
    secret_ish = "a" * 50 + "_" + "b" * 100
    with pytest.raises(TargetError) as info:
        canonical_host(secret_ish)
    assert "b" * 20 not in str(info.value)


# --- Authorities ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("authority", "default", "expected"),
    [
        ("example.com:443", None, Target("example.com", None, 443)),
        ("Example.COM.:8443", None, Target("example.com", None, 8443)),
        ("example.com", 443, Target("example.com", None, 443)),
        ("example.com:80", 443, Target("example.com", None, 80)),
        ("[::1]:8080", None, Target("::1", ip("::1"), 8080)),
        ("[::1]", 80, Target("::1", ip("::1"), 80)),
        ("127.0.0.1:1", None, Target("127.0.0.1", ip("127.0.0.1"), 1)),
        ("2130706433:443", None, Target("127.0.0.1", ip("127.0.0.1"), 443)),
        ("0x7f.1:65535", None, Target("127.0.0.1", ip("127.0.0.1"), 65535)),
        ("example.com:00443", None, Target("example.com", None, 443)),
        ("bücher.de:443", None, Target("xn--bcher-kva.de", None, 443)),
    ],
)
def test_parse_authority(authority: str, default: int | None, expected: Target) -> None:
    target = parse_authority(authority, default_port=default)
    assert target == expected
    assert parse_authority(target.authority) == target


@pytest.mark.parametrize(
    ("authority", "default"),
    [
        ("example.com", None),
        ("[::1]", None),
        ("", None),
        ("", 443),
        (":443", None),
        ("example.com:", None),
        ("example.com:", 443),
        ("example.com:0", None),
        ("example.com:65536", None),
        ("example.com:000443", None),
        ("example.com:+443", None),
        ("example.com:-1", None),
        ("example.com: 443", None),
        ("example.com:443 ", None),
        ("example.com :443", None),
        ("example.com:0x1bb", None),
        ("example.com:４４３", None),  # non-ASCII digits
        ("example.com:443:1", None),
        ("example.com：443", None),  # full-width colon
        ("::1:443", None),
        ("::1", 443),
        ("2001:db8::1", 443),
        ("[::1]:", None),
        ("[::1]443", None),
        ("[::1]x:443", None),
        ("[::1:443", None),
        ("[127.0.0.1]:443", None),
        ("[fe80::1%eth0]:443", None),
        ("user@example.com:443", None),
        ("user:pass@example.com:443", None),
        ("example.com/:443", None),
        ("example.123:443", None),
        ("a" * 300 + ":443", None),
    ],
)
def test_parse_authority_refuses(authority: str, default: int | None) -> None:
    with pytest.raises(TargetError):
        parse_authority(authority, default_port=default)


def test_parse_authority_checks_default_port() -> None:
    with pytest.raises(ValueError, match="default port"):
        parse_authority("example.com", default_port=0)


@pytest.mark.parametrize(
    ("target", "authority"),
    [
        (Target("example.com", None, 443), "example.com:443"),
        (Target("127.0.0.1", ip("127.0.0.1"), 80), "127.0.0.1:80"),
        (Target("2001:db8::1", ip("2001:db8::1"), 443), "[2001:db8::1]:443"),
    ],
)
def test_target_authority(target: Target, authority: str) -> None:
    assert target.authority == authority


# --- Hypothesis: no other exceptions, idempotence --------------------------------------------

_INTERESTING_PIECES = [
    *"0123456789abcdefxX.:[]%@/\\-_ \t",
    "xn--", "::", "ff", "ffff:", "١", "８", "．", "。", "ß", "е", "\u200d", "\u00ad", "K",
]  # fmt: skip
INTERESTING = st.lists(st.sampled_from(_INTERESTING_PIECES), max_size=30).map("".join)


def _check_host(raw: str) -> None:
    try:
        host, address = canonical_host(raw)
    except TargetError:
        return
    assert host.isascii()
    assert host == host.lower()
    assert not host.endswith(".")
    assert canonical_host(host) == (host, address)
    if address is None:
        assert len(host) <= 253
        assert not host.rpartition(".")[2].isdigit()
    else:
        assert host == str(address)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_canonical_host_only_raises_target_error(raw: str) -> None:
    _check_host(raw)


@settings(max_examples=200, deadline=None)
@given(INTERESTING)
def test_canonical_host_only_raises_target_error_interesting(raw: str) -> None:
    _check_host(raw)


def _check_authority(raw: str, default: int | None) -> None:
    try:
        target = parse_authority(raw, default_port=default)
    except TargetError:
        return
    assert 1 <= target.port <= 65535
    assert canonical_host(target.host) == (target.host, target.ip)
    assert parse_authority(target.authority) == target


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80), st.sampled_from([None, 443]))
def test_parse_authority_only_raises_target_error(raw: str, default: int | None) -> None:
    _check_authority(raw, default)


@settings(max_examples=200, deadline=None)
@given(INTERESTING, st.sampled_from([None, 443]))
def test_parse_authority_only_raises_target_error_interesting(
    raw: str, default: int | None
) -> None:
    _check_authority(raw, default)


# --- C1: classify -----------------------------------------------------------------------------

CLASSIFY_TABLE = [
    # metadata
    ("169.254.169.254", "metadata"),
    ("169.254.169.1", "metadata"),
    ("169.254.169.123", "metadata"),
    ("169.254.170.2", "metadata"),
    ("169.254.170.23", "metadata"),
    ("100.100.100.200", "metadata"),
    ("fd00:ec2::254", "metadata"),
    ("fd00:ec2::23", "metadata"),
    ("fd00:ec2::1", "metadata"),
    # unspecified
    ("0.0.0.0", "unspecified"),
    ("0.1.2.3", "unspecified"),
    ("::", "unspecified"),
    # multicast / broadcast
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("ff02::1", "multicast"),
    ("ff05::1:3", "multicast"),
    ("255.255.255.255", "broadcast"),
    # IPv6 embedding IPv4
    ("::ffff:127.0.0.1", "embedded_ipv4"),
    ("::ffff:8.8.8.8", "embedded_ipv4"),
    ("::ffff:0:7f00:1", "embedded_ipv4"),
    ("64:ff9b::7f00:1", "embedded_ipv4"),
    ("64:ff9b::808:808", "embedded_ipv4"),
    ("64:ff9b:1::a00:1", "embedded_ipv4"),
    ("2002:7f00:1::", "embedded_ipv4"),
    ("2002:808:808::1", "embedded_ipv4"),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "embedded_ipv4"),
    ("::127.0.0.1", "embedded_ipv4"),
    ("::2", "embedded_ipv4"),
    ("::a9fe:a9fe", "embedded_ipv4"),
    # loopback
    ("127.0.0.1", "loopback"),
    ("127.255.255.254", "loopback"),
    ("::1", "loopback"),
    # private
    ("10.0.0.1", "private"),
    ("10.255.255.255", "private"),
    ("172.16.0.1", "private"),
    ("172.31.255.255", "private"),
    ("192.168.1.1", "private"),
    ("fc00::1", "private"),
    ("fd12:3456::1", "private"),
    # link-local
    ("169.254.0.1", "link_local"),
    ("169.254.168.255", "link_local"),
    ("169.254.170.1", "link_local"),
    ("fe80::1", "link_local"),
    ("febf::1", "link_local"),
    # CGNAT
    ("100.64.0.1", "cgnat"),
    ("100.127.255.255", "cgnat"),
    # reserved
    ("192.0.0.1", "reserved"),
    ("192.0.0.170", "reserved"),
    ("192.0.2.1", "reserved"),
    ("192.88.99.1", "reserved"),
    ("198.18.0.1", "reserved"),
    ("198.19.255.255", "reserved"),
    ("198.51.100.1", "reserved"),
    ("203.0.113.1", "reserved"),
    ("240.0.0.1", "reserved"),
    ("255.255.255.254", "reserved"),
    ("100::1", "reserved"),
    ("100:0:0:1::1", "reserved"),
    ("2001:1::1", "reserved"),
    ("2001:2::1", "reserved"),
    ("2001:10::1", "reserved"),
    ("2001:20::1", "reserved"),
    ("2001:db8::1", "reserved"),
    ("3fff::1", "reserved"),
    ("5f00::1", "reserved"),
    ("fec0::1", "reserved"),
    ("4000::1", "reserved"),
    ("8000::1", "reserved"),
    # public
    ("8.8.8.8", None),
    ("1.1.1.1", None),
    ("2606:4700:4700::1111", None),
    ("2a00:1450:4001:82b::200e", None),
    ("9.255.255.255", None),
    ("11.0.0.1", None),
    ("100.63.255.255", None),
    ("100.128.0.1", None),
    ("169.253.255.255", None),
    ("169.255.0.1", None),
    ("172.15.255.255", None),
    ("172.32.0.1", None),
    ("192.167.255.255", None),
    ("192.169.0.1", None),
    ("223.255.255.255", None),
    ("2001:4860:4860::8888", None),
]


@pytest.mark.parametrize(("address", "reason"), CLASSIFY_TABLE)
def test_classify_table(address: str, reason: str | None) -> None:
    assert classify(ip(address)) == reason


ALWAYS_DENIED = [(address, reason) for address, reason in CLASSIFY_TABLE if reason in {
    "metadata", "unspecified", "multicast", "broadcast", "embedded_ipv4"}]  # fmt: skip


@pytest.mark.parametrize(("address", "reason"), ALWAYS_DENIED)
@pytest.mark.parametrize(
    "allowed",
    [
        nets("0.0.0.0/0", "::/0"),
        nets("0.0.0.0/0"),
        nets("::/0"),
        nets("169.254.0.0/16", "fd00::/8", "127.0.0.0/8", "224.0.0.0/4"),
    ],
)
def test_always_denied_ignores_carve_out(
    address: str, reason: str, allowed: tuple[Network, ...]
) -> None:
    assert classify(ip(address), allowed=allowed) == reason
    assert classify(ip(address), allowed=allowed, own={ip(address)}) == reason


@pytest.mark.parametrize(
    ("address", "allowed", "reason"),
    [
        ("127.0.0.1", ("127.0.0.0/8",), None),
        ("127.5.5.5", ("127.0.0.0/8",), None),
        ("127.0.0.1", ("127.0.0.1/32",), None),
        ("127.0.0.2", ("127.0.0.1/32",), "loopback"),
        ("::1", ("127.0.0.0/8",), "loopback"),
        ("::1", ("::1/128",), None),
        ("169.254.169.254", ("127.0.0.0/8",), "metadata"),
        ("0.0.0.0", ("127.0.0.0/8",), "unspecified"),
        ("::ffff:127.0.0.1", ("127.0.0.0/8",), "embedded_ipv4"),
        ("::ffff:127.0.0.1", ("::ffff:0:0/96",), "embedded_ipv4"),
        ("169.254.1.1", ("169.254.0.0/16",), None),
        ("169.254.169.254", ("169.254.0.0/16",), "metadata"),
        ("10.1.2.3", ("10.0.0.0/8",), None),
        ("10.1.2.3", ("10.0.0.0/24",), "private"),
        ("192.168.1.10", ("192.168.1.0/24",), None),
        ("192.0.2.7", ("192.0.2.0/24",), None),
        ("100.64.0.1", ("100.64.0.0/10",), None),
        ("fd12::1", ("fc00::/7",), None),
        ("fd00:ec2::254", ("fc00::/7",), "metadata"),
        ("10.0.0.1", ("0.0.0.0/0", "::/0"), None),
        ("::1", ("0.0.0.0/0", "::/0"), None),
        # Versions never mix: an IPv4 carve-out covers no IPv6 address and vice versa.
        ("::1", ("0.0.0.0/0",), "loopback"),
        ("fc00::1", ("0.0.0.0/0",), "private"),
        ("10.0.0.1", ("::/0",), "private"),
        ("127.0.0.1", ("::/0",), "loopback"),
        ("8.8.8.8", ("10.0.0.0/8",), None),
    ],
)
def test_classify_carve_out(address: str, allowed: tuple[str, ...], reason: str | None) -> None:
    assert classify(ip(address), allowed=nets(*allowed)) == reason


OWN = frozenset({ip("127.0.0.1"), ip("::1"), ip("192.0.2.2"), ip("fd00::2"), ip("8.8.4.4"),
                 ip("fe80::fc:ff:fe00:1")})  # fmt: skip


@pytest.mark.parametrize(
    ("address", "allowed", "reason"),
    [
        ("127.0.0.1", (), "own_address"),
        ("127.0.0.1", ("127.0.0.0/8",), None),
        ("::1", (), "own_address"),
        ("::1", ("::1/128",), None),
        ("::1", ("127.0.0.0/8",), "own_address"),
        ("192.0.2.2", (), "own_address"),
        ("192.0.2.2", ("192.0.2.0/24",), "own_address"),
        ("192.0.2.3", ("192.0.2.0/24",), None),
        ("fd00::2", ("fc00::/7",), "own_address"),
        ("fd00::3", ("fc00::/7",), None),
        ("8.8.4.4", (), "own_address"),
        ("8.8.4.4", ("0.0.0.0/0",), "own_address"),
        ("8.8.8.8", (), None),
        ("fe80::fc:ff:fe00:1", ("fe80::/10",), "own_address"),
        ("fe80::fc:ff:fe00:1%eth0", ("fe80::/10",), "own_address"),
        ("127.0.0.2", ("127.0.0.0/8",), None),
    ],
)
def test_classify_own_addresses(address: str, allowed: tuple[str, ...], reason: str | None) -> None:
    assert classify(ip(address), allowed=nets(*allowed), own=OWN) == reason


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.ip_addresses(), st.ip_addresses(v=6, network="::/96"),
                 st.ip_addresses(v=6, network="::ffff:0:0/96")))  # fmt: skip
def test_classify_denies_everything_python_calls_non_global(address: IPAddress) -> None:
    reason = classify(address)
    assert reason is None or reason in REASONS
    if reason is None:
        assert address.is_global
        assert not address.is_private
        assert not address.is_loopback
        assert not address.is_link_local
        assert not address.is_multicast
        assert not address.is_reserved


def test_own_addresses() -> None:
    own = own_addresses()
    assert ip("127.0.0.1") in own
    loopback6 = Path("/proc/net/if_inet6")
    if loopback6.exists() and "00000000000000000000000000000001" in loopback6.read_text():
        assert ip("::1") in own
    for address in own:
        assert isinstance(address, ipaddress.IPv4Address | ipaddress.IPv6Address)
        assert getattr(address, "scope_id", None) is None
        assert classify(address, own=own) is not None


# --- Operator carve-out setting ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ()),
        ("  ", ()),
        ("10.0.0.0/8", ("10.0.0.0/8",)),
        ("10.0.0.0/8, 192.168.1.5 ,fc00::/7", ("10.0.0.0/8", "192.168.1.5/32", "fc00::/7")),
        ("::1", ("::1/128",)),
        ("10.0.0.0/8,,10.0.0.0/8,", ("10.0.0.0/8",)),
        ("0.0.0.0/0", ("0.0.0.0/0",)),
    ],
)
def test_parse_networks(text: str, expected: tuple[str, ...]) -> None:
    assert parse_networks(text) == nets(*expected)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10.0.0.1/8", "did you mean 10.0.0.0/8"),
        ("nope", "not an IP address or CIDR"),
        ("10.0.0.0/33", "not an IP address or CIDR"),
        ("010.0.0.0/8", "not an IP address or CIDR"),
        ("10.0.0.0/8;192.168.0.0/16", "not an IP address or CIDR"),
        ("fe80::/10%eth0", "zone ids"),
        ("example.com", "not an IP address or CIDR"),
    ],
)
def test_parse_networks_refuses(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_networks(text)


# --- C4: wildcard host patterns over canonical hosts -----------------------------------------


@pytest.mark.parametrize(
    ("raw_host", "expected"),
    [
        ("api.example.com", True),
        ("a.b.example.com", True),
        ("API.Example.COM.", True),
        ("ａｐｉ.example.com", True),  # full-width letters fold to api
        ("example.com", False),
        ("example.com.", False),
        ("evil-example.com", False),
        ("evilexample.com", False),
        ("example.com.evil.net", False),
        ("api.example.com.evil.net", False),
        ("api.ехаmple.com", False),  # Cyrillic homograph of example
        ("ехаmple.com", False),
        ("api.example.co", False),
        ("127.0.0.1", False),
        ("2130706433", False),
        ("[::1]", False),
    ],
)
def test_wildcard_table(raw_host: str, expected: bool) -> None:
    pattern = normalize_pattern("*.example.com")
    host, _ = canonical_host(raw_host)
    assert matches(pattern, host) is expected


@pytest.mark.parametrize(
    ("pattern", "raw_host", "expected"),
    [
        ("example.com", "example.com", True),
        ("example.com", "EXAMPLE.COM.", True),
        ("example.com", "api.example.com", False),
        ("127.0.0.1", "127.0.0.1", True),
        ("127.0.0.1", "2130706433", True),  # the exact literal, however it is spelt
        ("127.0.0.1", "127.0.0.2", False),
        ("xn--bcher-kva.de", "bücher.de", True),
        ("*.xn--bcher-kva.de", "www.BÜCHER.de", True),
    ],
)
def test_exact_pattern_table(pattern: str, raw_host: str, expected: bool) -> None:
    host, _ = canonical_host(raw_host)
    assert matches(normalize_pattern(pattern), host) is expected


def reference_match(pattern: str, host: str) -> bool:
    """The documented rule, label by label: ``*.base`` covers names strictly below base."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        is_ip = False
    else:
        is_ip = True
    if pattern.startswith("*."):
        if is_ip:
            return False
        base = pattern[2:].split(".")
        labels = host.split(".")
        return len(labels) > len(base) and labels[len(labels) - len(base) :] == base
    return host == pattern


LABELS = st.sampled_from(
    ["a", "b", "api", "www", "example", "evil-example", "xn--mple-43d3a6i", "com", "net",
     "co", "uk", "1", "0x7f", "e", "xample", "example-com"]
)  # fmt: skip
NAMES = st.lists(LABELS, min_size=1, max_size=5).map(".".join)


@settings(max_examples=250, deadline=None)
@given(
    st.tuples(st.booleans(), st.lists(LABELS, min_size=1, max_size=3).map(".".join)),
    st.one_of(NAMES, st.ip_addresses().map(str)),
    st.booleans(),
    st.booleans(),
)
def test_wildcard_matches_reference(
    pattern_parts: tuple[bool, str], raw_host: str, upper: bool, dot: bool
) -> None:
    wildcard, base = pattern_parts
    try:
        pattern = normalize_pattern(("*." if wildcard else "") + base)
    except ValueError:
        return  # refused when the configuration loads; never matched against
    raw = (raw_host.upper() if upper else raw_host) + ("." if dot and ":" not in raw_host else "")
    try:
        host, _ = canonical_host(raw)
    except TargetError:
        return
    assert matches(pattern, host) is reference_match(pattern, host)
