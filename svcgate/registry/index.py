"""The registry index: a signed JSON document naming installable servers (pure, no I/O).

Format (docs/registry.md has the full reference)::

    {"version": 7, "expires": "2027-01-01T00:00:00Z",
     "servers": {"echo": {"description": "...", "versions": {"1.2.0": {
         "image": "registry.example/mcp/echo@sha256:<64 hex>",
         "manifest": {
             "tools": [{"name": "echo", "default": true, "sha256": "<64 hex>"}],
             "command": ["/usr/bin/python3", "/app/echo_server.py"],
             "env": {"LOG_LEVEL": "info"},
             "workdir": "/app",
             "credential": {"env": "GITHUB_TOKEN", "header": "Authorization",
                            "format": "Bearer {token}", "hosts": ["api.github.com"]},
             "egress": ["example.com"],
             "limits": {"memory_mb": 256, "pids": 64, "cpus": 0.5}}}}}}}

The caller verifies the signature over the exact bytes first (:mod:`.signing`); only then is
the document parsed here, strictly: duplicate keys, NaN and deep nesting refuse the whole
document (:mod:`svcgate.strict_json`), as do unknown or malformed top-level fields. An entry
(one server, or one version of it) with an unknown field or a bad value is *refused* on its
own: it is kept as an error message and cannot be installed, while the other entries stay
usable (THREATS.md F7: index metadata never shapes the runtime beyond this schema; there is
no way to ask for mounts, host networking, privileges or devices).

Versions are semantic versions (``MAJOR.MINOR.PATCH`` with an optional ``-prerelease``); a
bare ref installs the newest release that is not a prerelease (or the newest prerelease if
there is nothing else).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from svcgate.host_patterns import HostPatternError, normalize_pattern
from svcgate.registry.oci import ImageRef, OCIError, parse_image_ref
from svcgate.servers import SERVER_NAME
from svcgate.strict_json import StrictJSONError, loads_strict

MAX_INDEX_BYTES = 8 * 1024 * 1024
MAX_SERVERS = 10_000
MAX_VERSIONS = 1_000
MAX_TOOLS = 1_000
MAX_ENV = 128
MAX_HOSTS = 64
MAX_TEXT = 4096
_SEMVER = re.compile(
    r"^(0|[1-9]\d{0,8})\.(0|[1-9]\d{0,8})\.(0|[1-9]\d{0,8})(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_HEADER = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")
_REF = re.compile(r"^([a-z0-9][a-z0-9-]{0,63})(?:@(\S{1,64}))?$")
# Set by the gateway in every sandbox; a manifest may not set or shadow them.
RESERVED_ENV = frozenset(
    {
        "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy",
        "ALL_PROXY", "all_proxy", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS", "NODE_USE_ENV_PROXY", "LD_PRELOAD", "LD_LIBRARY_PATH",
        "LD_AUDIT",
    }
)  # fmt: skip
# Bounds of manifest resource limits (the gateway's defaults apply where one is absent).
MEMORY_MB = (16, 65_536)
PIDS = (8, 4_096)
CPUS = (0.05, 64.0)
DEFAULT_LIMITS = {"memory_mb": 512, "pids": 256, "cpus": 1.0}


class IndexFormatError(ValueError):
    """The index (or one entry) is malformed; ``str()`` says where and why."""


class RefError(ValueError):
    """A registry ref that is not ``name`` or ``name@version``."""


def _fail(where: str, problem: str) -> IndexFormatError:
    return IndexFormatError(f"{where}: {problem}")


# -- versions -------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class SemVer:
    """Ordering key of a semantic version (SemVer 2.0.0 precedence, no build metadata)."""

    major: int
    minor: int
    patch: int
    # (1,) for a release; (0, ids...) for a prerelease, so a release sorts after it.
    pre: tuple[Any, ...] = (1,)

    @property
    def prerelease(self) -> bool:
        return self.pre != (1,)


def parse_version(text: str) -> SemVer:
    match = _SEMVER.match(text)
    if match is None:
        raise ValueError(f"{text[:64]!r} is not a semantic version (MAJOR.MINOR.PATCH)")
    major, minor, patch, pre = match.groups()
    if pre is None:
        return SemVer(int(major), int(minor), int(patch))
    ids: list[Any] = []
    for part in pre.split("."):
        # Numeric identifiers sort before alphanumeric ones, and numerically.
        ids.append((0, int(part), "") if part.isdigit() else (1, 0, part))
    return SemVer(int(major), int(minor), int(patch), (0, *ids))


def parse_ref(text: str) -> tuple[str, str | None]:
    """``name`` or ``name@version`` -> (name, version or None). Raises :class:`RefError`."""
    if not isinstance(text, str):
        raise RefError("ref must be a string")
    match = _REF.match(text)
    if match is None:
        raise RefError(
            "ref must be name@version or name (server names match ^[a-z0-9][a-z0-9-]{0,63}$)"
        )
    name, version = match.groups()
    if version is not None:
        try:
            parse_version(version)
        except ValueError as exc:
            raise RefError(str(exc)) from None
    return name, version


# -- the manifest ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolPin:
    name: str
    default: bool
    sha256: str


@dataclass(frozen=True)
class CredentialSpec:
    """How the owner's credential reaches this server's API (through the egress proxy)."""

    hosts: tuple[str, ...]
    env: str | None = None  # receives the placeholder, never the secret
    header: str | None = None
    format: str | None = None


@dataclass(frozen=True)
class Limits:
    memory_mb: int | None = None
    pids: int | None = None
    cpus: float | None = None

    def effective(self) -> dict[str, float]:
        return {
            key: value if value is not None else DEFAULT_LIMITS[key]
            for key, value in (
                ("memory_mb", self.memory_mb),
                ("pids", self.pids),
                ("cpus", self.cpus),
            )
        }


@dataclass(frozen=True)
class Manifest:
    tools: tuple[ToolPin, ...]
    command: tuple[str, ...] | None = None
    env: tuple[tuple[str, str], ...] = ()
    workdir: str | None = None
    credential: CredentialSpec | None = None
    egress: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)

    def tool(self, name: str) -> ToolPin | None:
        for pin in self.tools:
            if pin.name == name:
                return pin
        return None

    @property
    def default_tools(self) -> frozenset[str]:
        return frozenset(pin.name for pin in self.tools if pin.default)


def _obj(
    value: Any, where: str, allowed: set[str], required: Set[str] = frozenset()
) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(where, "must be an object")
    unknown = set(value) - allowed
    if unknown:
        raise _fail(where, f"unknown field(s) {sorted(k[:64] for k in unknown)}")
    missing = required - set(value)
    if missing:
        raise _fail(where, f"missing field(s) {sorted(missing)}")
    return value


def _text(value: Any, where: str, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str) or not value or len(value) > limit or "\x00" in value:
        raise _fail(where, f"must be a non-empty string of at most {limit} characters")
    return value


def _abs_path(value: Any, where: str) -> str:
    path = _text(value, where)
    if not path.startswith("/") or "/../" in f"{path}/" or "/./" in f"{path}/" or "//" in path:
        raise _fail(where, "must be a normalised absolute path")
    return path


def _patterns(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > MAX_HOSTS:
        raise _fail(where, f"must be a list of at most {MAX_HOSTS} host patterns")
    out: list[str] = []
    for i, item in enumerate(value):
        try:
            pattern = normalize_pattern(_text(item, f"{where}[{i}]", 253))
        except HostPatternError as exc:
            raise _fail(f"{where}[{i}]", str(exc)) from None
        if pattern not in out:
            out.append(pattern)
    return tuple(out)


def _env_name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _ENV_NAME.match(value):
        raise _fail(where, "must be an environment variable name")
    if value in RESERVED_ENV or value.startswith("SVC_"):
        raise _fail(where, f"{value} is reserved for the gateway")
    return value


def _int_in(value: Any, where: str, bounds: tuple[int, int]) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not bounds[0] <= value <= bounds[1]:
        raise _fail(where, f"must be an integer from {bounds[0]} to {bounds[1]}")
    return value


def parse_manifest(value: Any, where: str = "manifest") -> Manifest:
    """Parse one manifest object strictly. Raises :class:`IndexFormatError`."""
    body = _obj(
        value,
        where,
        {"tools", "command", "env", "workdir", "credential", "egress", "limits"},
        {"tools"},
    )
    tools_raw = body["tools"]
    if not isinstance(tools_raw, list) or len(tools_raw) > MAX_TOOLS:
        raise _fail(f"{where}.tools", f"must be a list of at most {MAX_TOOLS} tools")
    tools: list[ToolPin] = []
    for i, item in enumerate(tools_raw):
        at = f"{where}.tools[{i}]"
        tool = _obj(item, at, {"name", "default", "sha256"}, {"name", "default", "sha256"})
        name = _text(tool["name"], f"{at}.name", 128)
        if not isinstance(tool["default"], bool):
            raise _fail(f"{at}.default", "must be true or false")
        digest = tool["sha256"]
        if not isinstance(digest, str) or not _HEX64.match(digest):
            raise _fail(f"{at}.sha256", "must be 64 lower-case hex digits")
        if any(pin.name == name for pin in tools):
            raise _fail(at, f"tool {name!r} is listed twice")
        tools.append(ToolPin(name, tool["default"], digest))
    command: tuple[str, ...] | None = None
    if "command" in body:
        raw = body["command"]
        if not isinstance(raw, list) or not raw or len(raw) > 64:
            raise _fail(f"{where}.command", "must be a non-empty list of at most 64 strings")
        command = tuple(_text(arg, f"{where}.command[{i}]") for i, arg in enumerate(raw))
        _abs_path(command[0], f"{where}.command[0]")
    env: dict[str, str] = {}
    if "env" in body:
        raw_env = body["env"]
        if not isinstance(raw_env, dict) or len(raw_env) > MAX_ENV:
            raise _fail(f"{where}.env", f"must be an object of at most {MAX_ENV} strings")
        for key, item in raw_env.items():
            name = _env_name(key, f"{where}.env")
            if not isinstance(item, str) or len(item) > MAX_TEXT or "\x00" in item:
                raise _fail(f"{where}.env.{name}", "must be a string")
            env[name] = item
    workdir = _abs_path(body["workdir"], f"{where}.workdir") if "workdir" in body else None
    credential: CredentialSpec | None = None
    if "credential" in body:
        at = f"{where}.credential"
        raw_cred = _obj(body["credential"], at, {"env", "header", "format", "hosts"}, {"hosts"})
        hosts = _patterns(raw_cred["hosts"], f"{at}.hosts")
        if not hosts:
            raise _fail(f"{at}.hosts", "must name at least one host")
        cred_env = _env_name(raw_cred["env"], f"{at}.env") if "env" in raw_cred else None
        if cred_env is not None and cred_env in env:
            raise _fail(f"{at}.env", f"{cred_env} is also set in env")
        header = raw_cred.get("header")
        if header is not None and (not isinstance(header, str) or not _HEADER.match(header)):
            raise _fail(f"{at}.header", "must be an HTTP header name of at most 64 characters")
        fmt = raw_cred.get("format")
        if fmt is not None and (
            not isinstance(fmt, str)
            or len(fmt) > 256
            or "{token}" not in fmt
            or any(c in fmt for c in "\r\n\x00")
        ):
            raise _fail(f"{at}.format", "must be at most 256 characters and contain {token}")
        credential = CredentialSpec(hosts, cred_env, header, fmt)
    egress = _patterns(body["egress"], f"{where}.egress") if "egress" in body else ()
    limits = Limits()
    if "limits" in body:
        at = f"{where}.limits"
        raw_limits = _obj(body["limits"], at, {"memory_mb", "pids", "cpus"})
        cpus = raw_limits.get("cpus")
        if cpus is not None and (
            not isinstance(cpus, (int, float))
            or isinstance(cpus, bool)
            or not CPUS[0] <= cpus <= CPUS[1]
        ):
            raise _fail(f"{at}.cpus", f"must be a number from {CPUS[0]} to {CPUS[1]}")
        limits = Limits(
            memory_mb=_int_in(raw_limits["memory_mb"], f"{at}.memory_mb", MEMORY_MB)
            if "memory_mb" in raw_limits
            else None,
            pids=_int_in(raw_limits["pids"], f"{at}.pids", PIDS) if "pids" in raw_limits else None,
            cpus=float(cpus) if cpus is not None else None,
        )
    return Manifest(
        tools=tuple(tools),
        command=command,
        env=tuple(sorted(env.items())),
        workdir=workdir,
        credential=credential,
        egress=egress,
        limits=limits,
    )


# -- the index ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Release:
    name: str
    version: str
    image: ImageRef
    manifest: Manifest
    # The manifest object exactly as the signed index gave it (stored with the server).
    manifest_json: Mapping[str, Any]


@dataclass(frozen=True)
class RegistryIndex:
    version: int
    expires: datetime
    releases: Mapping[str, Mapping[str, Release]]
    # Refused entries: "name" or "name@version" -> the reason.
    errors: Mapping[str, str]

    def resolve(self, name: str, version: str | None) -> Release:
        """The release a ref names (bare name: newest). Raises :class:`LookupError`."""
        key = f"{name}@{version}" if version else name
        if key in self.errors:
            raise LookupError(f"the index entry {key} is refused: {self.errors[key]}")
        versions = self.releases.get(name)
        if versions is None:
            if name in self.errors:
                raise LookupError(f"the index entry {name} is refused: {self.errors[name]}")
            raise LookupError(f"the registry index has no server named {name!r}")
        if version is not None:
            release = versions.get(version)
            if release is None:
                available = ", ".join(sorted(versions, key=parse_version)) or "none"
                raise LookupError(
                    f"the registry index has no version {version} of {name} (has: {available})"
                )
            return release
        # The newest listed version, refused ones included: a bare ref never falls back
        # to an older release because the newest one is malformed.
        refused = [k.partition("@")[2] for k in self.errors if k.startswith(f"{name}@")]
        ordered = sorted([*versions, *refused], key=parse_version)
        if not ordered:
            raise LookupError(f"the registry index lists no version of {name}")
        stable = [v for v in ordered if not parse_version(v).prerelease]
        newest = (stable or ordered)[-1]
        if newest not in versions:
            raise LookupError(
                f"the index entry {name}@{newest} is refused: {self.errors[f'{name}@{newest}']}"
            )
        return versions[newest]


def parse_expiry(value: Any) -> datetime:
    if not isinstance(value, str) or not value:
        raise _fail("expires", "must be an RFC 3339 date-time string")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise _fail("expires", f"{value[:64]!r} is not an RFC 3339 date-time") from None
    if moment.tzinfo is None:
        raise _fail("expires", "must carry a time zone (for example 2027-01-01T00:00:00Z)")
    return moment.astimezone(UTC)


def parse_index(data: bytes) -> RegistryIndex:
    """Parse verified index bytes. Raises :class:`IndexFormatError` for a malformed document."""
    if len(data) > MAX_INDEX_BYTES:
        raise IndexFormatError(f"the index is larger than {MAX_INDEX_BYTES} bytes")
    try:
        document = loads_strict(data)
    except StrictJSONError as exc:
        raise IndexFormatError(f"the index is not valid JSON ({exc})") from None
    top = _obj(
        document, "index", {"version", "expires", "servers"}, {"version", "expires", "servers"}
    )
    version = top["version"]
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version < 2**53:
        raise _fail("version", "must be a positive integer")
    expires = parse_expiry(top["expires"])
    servers = top["servers"]
    if not isinstance(servers, dict) or len(servers) > MAX_SERVERS:
        raise _fail("servers", f"must be an object of at most {MAX_SERVERS} servers")
    releases: dict[str, dict[str, Release]] = {}
    errors: dict[str, str] = {}
    for name, entry in servers.items():
        try:
            releases[name] = _parse_server(name, entry, errors)
        except IndexFormatError as exc:
            errors[name] = str(exc)
    return RegistryIndex(version, expires, releases, errors)


def _parse_server(name: str, entry: Any, errors: dict[str, str]) -> dict[str, Release]:
    where = f"servers.{name[:64]}"
    if not SERVER_NAME.match(name):
        raise _fail(where, "server names match ^[a-z0-9][a-z0-9-]{0,63}$ (no '_')")
    body = _obj(entry, where, {"description", "versions"}, {"versions"})
    if "description" in body:
        _text(body["description"], f"{where}.description")
    versions = body["versions"]
    if not isinstance(versions, dict) or len(versions) > MAX_VERSIONS:
        raise _fail(f"{where}.versions", f"must be an object of at most {MAX_VERSIONS} versions")
    out: dict[str, Release] = {}
    for version, release in versions.items():
        try:
            parse_version(version)
        except ValueError as exc:
            raise _fail(f"{where}.versions", str(exc)) from None
        try:
            out[version] = _parse_release(name, version, release)
        except IndexFormatError as exc:
            errors[f"{name}@{version}"] = str(exc)
    return out


def _parse_release(name: str, version: str, value: Any) -> Release:
    where = f"servers.{name}.versions.{version}"
    body = _obj(value, where, {"image", "manifest"}, {"image", "manifest"})
    image_text = _text(body["image"], f"{where}.image", 512)
    try:
        image = parse_image_ref(image_text)
    except OCIError as exc:
        raise _fail(f"{where}.image", str(exc)) from None
    manifest = parse_manifest(body["manifest"], f"{where}.manifest")
    return Release(name, version, image, manifest, body["manifest"])


# -- permission changes between two manifests (THREATS.md F4) ---------------------------------


def widening(old: Manifest, new: Manifest) -> list[str]:
    """What ``new`` may do that ``old`` could not, one line each; empty when nothing widens."""
    changes: list[str] = []
    for host in new.egress:
        if host not in old.egress:
            changes.append(f"egress: may reach {host}")
    old_cred, new_cred = old.credential, new.credential
    if new_cred is not None:
        if old_cred is None:
            changes.append(
                "credential: receives the owner's credential for " + ", ".join(new_cred.hosts)
            )
        else:
            for host in new_cred.hosts:
                if host not in old_cred.hosts:
                    changes.append(f"credential: also sent to {host}")
            for label, before, after in (
                ("env", old_cred.env, new_cred.env),
                ("header", old_cred.header, new_cred.header),
                ("format", old_cred.format, new_cred.format),
            ):
                if before != after:
                    changes.append(f"credential: {label} changes from {before!r} to {after!r}")
    old_env = dict(old.env)
    for key, value in new.env:
        if key not in old_env:
            changes.append(f"env: adds {key}")
        elif old_env[key] != value:
            changes.append(f"env: changes {key}")
    before_limits, after_limits = old.limits.effective(), new.limits.effective()
    for limit, raised in after_limits.items():
        if raised > before_limits[limit]:
            changes.append(f"limits: {limit} rises from {before_limits[limit]:g} to {raised:g}")
    was_default = old.default_tools
    for pin in new.tools:
        if pin.default and pin.name not in was_default:
            changes.append(f"tools: {pin.name} becomes on by default")
    return changes
