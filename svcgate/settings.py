"""Settings, parsed once from the environment into a frozen object and passed down.

Error handling: any missing or malformed value raises :class:`SettingsError` naming the
variable; the CLI prints it as one line and exits non-zero. Secret values never appear in
messages or in ``repr``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from svcgate.duration import parse_duration
from svcgate.egress.config import EgressConfigError, EgressSettings, egress_settings_from_env
from svcgate.host_patterns import is_loopback_host
from svcgate.local_servers import LocalServer, LocalServersError, parse_local_servers
from svcgate.registry.config import (
    DEFAULT_IMAGE_DIR,
    RegistryConfigError,
    RegistrySettings,
    image_dir_from_env,
    registry_settings_from_env,
)
from svcgate.servers import LEGACY_SERVER

DEFAULT_LISTEN = "0.0.0.0:8080"  # the product listens on all interfaces by default (SPEC)
# Metrics stay on loopback unless the operator opens them (docs/observability.md).
DEFAULT_METRICS_LISTEN = "127.0.0.1:9464"
DEFAULT_ADMIN_ROLE = "svc-admin"
DEFAULT_SESSION_TTL = "168h"
DEFAULT_DATA_DIR = "svcgate-data"
CALLBACK_PATH = "/api/auth/callback"
CONTROL_SOCKET_NAME = "control.sock"
# Outside the data directory on purpose: sandbox scratch dirs are bind sources that bwrap
# opens as the unprivileged sandbox uid, so every parent must be searchable by it, and the
# data directory (0700) must stay closed. /run is also right for records of objects
# (namespaces, cgroups, processes) that do not survive a reboot.
DEFAULT_SANDBOX_DIR = "/run/svcgate/sandboxes"
# sun_path holds 108 bytes with the terminating NUL; the daemon binds the socket under a
# temporary name as long as "control.sock" in the same directory.
_MAX_SOCKET_PATH = 107
OIDC_CORE_VARS = ("SVC_OIDC_ISSUER", "SVC_OIDC_CLIENT_ID", "SVC_OIDC_REDIRECT_URL")


class SettingsError(Exception):
    """A setting is missing or malformed. ``str()`` is one line naming the variable."""

    def __init__(self, variable: str, problem: str) -> None:
        super().__init__(f"{variable}: {problem}")
        self.variable = variable


@dataclass(frozen=True)
class OidcSettings:
    issuer: str
    client_id: str
    redirect_url: str
    client_secret: str = field(repr=False, default="")


@dataclass(frozen=True)
class Settings:
    listen_host: str
    listen_port: int
    data_dir: Path
    bearer_token: str = field(repr=False)
    oidc: OidcSettings | None
    admin_role: str
    session_ttl: float
    public_origin: str | None
    echo_bin: Path | None
    vault_key_file: Path
    vault_key_create: bool
    # Runtime state of sandboxes (records, namespace metadata, scratch dirs).
    sandbox_dir: Path
    # The operator control socket (root-only unix socket).
    control_socket: Path
    log_level: str = "INFO"
    # SVC_LOG_FORMAT: "auto" (JSON into the systemd journal, text elsewhere), "json", "text".
    log_format: str = "auto"
    # Operator-defined servers (SVC_SERVERS_FILE), by name.
    local_servers: Mapping[str, LocalServer] = field(default_factory=dict)
    # Extra origins allowed to call the MCP endpoints (SVC_MCP_ALLOWED_ORIGINS).
    mcp_allowed_origins: tuple[str, ...] = ()
    # The egress proxy (SVC_EGRESS_*).
    egress: EgressSettings = field(default_factory=EgressSettings)
    # The registry installer (SVC_REGISTRY_*); None: install/uninstall answer 501.
    registry: RegistrySettings | None = None
    # Unpacked images of installed servers (SVC_IMAGE_DIR).
    image_dir: Path = Path(DEFAULT_IMAGE_DIR)
    # The Prometheus listener (SVC_METRICS_LISTEN); None: no metrics listener.
    metrics_listen: tuple[str, int] | None = ("127.0.0.1", 9464)

    @property
    def mcp_origins(self) -> tuple[str, ...]:
        """Origins a browser may call the data plane from (A5); others get 403."""
        own = (self.public_origin,) if self.public_origin else ()
        return own + self.mcp_allowed_origins

    @property
    def control_plane_enabled(self) -> bool:
        return self.oidc is not None

    @property
    def secure_cookies(self) -> bool:
        return self.public_origin is not None and self.public_origin.startswith("https://")


def _parse_listen(value: str, variable: str = "SVC_LISTEN") -> tuple[str, int]:
    match = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d{1,5})|([^:\[\]]*):(\d{1,5})", value)
    if match is None:
        raise SettingsError(variable, f"expected HOST:PORT or [IPV6]:PORT, got {value!r}")
    host = match.group(1) or match.group(3) or "0.0.0.0"  # noqa: S104 - ":8080" means all interfaces
    port = int(match.group(2) or match.group(4))
    if port > 65535:
        raise SettingsError(variable, f"port {port} is out of range")
    return host, port


def _parse_metrics_listen(value: str, public: tuple[str, int]) -> tuple[str, int] | None:
    """``SVC_METRICS_LISTEN``: HOST:PORT like SVC_LISTEN, or ``off``."""
    if value.strip().lower() == "off":
        return None
    listen = _parse_listen(value or DEFAULT_METRICS_LISTEN, "SVC_METRICS_LISTEN")
    if listen[1] == public[1] and listen[1] != 0:
        raise SettingsError("SVC_METRICS_LISTEN", f"port {listen[1]} is SVC_LISTEN's port")
    return listen


def _parse_http_url(variable: str, value: str) -> tuple[str, str, str]:
    """Return (scheme, host, origin) for an http(s) URL, or raise naming the variable."""
    if any(ord(c) < 0x21 or c == "\x7f" for c in value):
        raise SettingsError(variable, "must not contain spaces or control characters")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        raise SettingsError(variable, f"not a valid URL: {value!r}") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SettingsError(variable, f"must be an http:// or https:// URL, got {value!r}")
    if parts.username or parts.password:
        raise SettingsError(variable, "must not contain user information")
    host = parts.hostname
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    return parts.scheme, host, f"{parts.scheme}://{netloc}"


def _read_secret_file(variable: str, path: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(variable, f"cannot read {path!r} ({type(exc).__name__})") from exc
    return text.rstrip("\r\n")


def _parse_oidc(env: Mapping[str, str]) -> OidcSettings | None:
    values = {name: env.get(name, "").strip() for name in OIDC_CORE_VARS}
    present = [name for name, value in values.items() if value]
    if not present:
        for extra in ("SVC_OIDC_CLIENT_SECRET", "SVC_OIDC_CLIENT_SECRET_FILE"):
            if env.get(extra, ""):
                raise SettingsError(extra, "is set but SVC_OIDC_ISSUER is empty")
        return None
    if len(present) != len(OIDC_CORE_VARS):
        missing = next(name for name in OIDC_CORE_VARS if not values[name])
        raise SettingsError(
            missing,
            "is required when any of SVC_OIDC_ISSUER, SVC_OIDC_CLIENT_ID, "
            "SVC_OIDC_REDIRECT_URL is set",
        )
    issuer = values["SVC_OIDC_ISSUER"]
    scheme, host, _ = _parse_http_url("SVC_OIDC_ISSUER", issuer)
    if scheme != "https" and not is_loopback_host(host):
        raise SettingsError("SVC_OIDC_ISSUER", "must be https:// (http:// only for loopback)")
    if "?" in issuer or "#" in issuer:
        raise SettingsError("SVC_OIDC_ISSUER", "must not contain a query or fragment")
    client_id = values["SVC_OIDC_CLIENT_ID"]
    if any(ord(c) < 0x21 for c in client_id):
        raise SettingsError("SVC_OIDC_CLIENT_ID", "must not contain spaces or control characters")
    redirect = values["SVC_OIDC_REDIRECT_URL"]
    _parse_http_url("SVC_OIDC_REDIRECT_URL", redirect)
    if urlsplit(redirect).path != CALLBACK_PATH or urlsplit(redirect).query:
        raise SettingsError("SVC_OIDC_REDIRECT_URL", f"must end in {CALLBACK_PATH}")
    secret = env.get("SVC_OIDC_CLIENT_SECRET", "")
    secret_file = env.get("SVC_OIDC_CLIENT_SECRET_FILE", "")
    if secret and secret_file:
        raise SettingsError(
            "SVC_OIDC_CLIENT_SECRET_FILE", "set either it or SVC_OIDC_CLIENT_SECRET, not both"
        )
    if secret_file:
        secret = _read_secret_file("SVC_OIDC_CLIENT_SECRET_FILE", secret_file)
    elif not secret:
        # systemd's LoadCredential=oidc-client-secret:... (see docs/systemd.md); like the
        # vault key, an explicit variable wins over the credential.
        credentials_dir = env.get("CREDENTIALS_DIRECTORY", "")
        credential = Path(credentials_dir, "oidc-client-secret")
        if credentials_dir and credential.exists():
            secret = _read_secret_file("$CREDENTIALS_DIRECTORY/oidc-client-secret", str(credential))
    return OidcSettings(
        issuer=issuer,
        client_id=client_id,
        redirect_url=redirect,
        client_secret=secret,
    )


def vault_key_location(env: Mapping[str, str], data_dir: Path) -> tuple[Path, bool]:
    """Where the vault's key ring lives, and whether it may be created (development only).

    ``SVC_VAULT_KEY_FILE`` wins; then systemd's ``$CREDENTIALS_DIRECTORY/vault-key``
    (``LoadCredential=vault-key:...``); otherwise ``<data dir>/vault.key``, generated on first
    start for development.
    """
    explicit = env.get("SVC_VAULT_KEY_FILE", "")
    if explicit:
        return Path(explicit).absolute(), False
    credentials_dir = env.get("CREDENTIALS_DIRECTORY", "")
    if credentials_dir:
        return Path(credentials_dir) / "vault-key", False
    return data_dir / "vault.key", True


def data_dir_from_env(env: Mapping[str, str]) -> Path:
    """``SVC_DATA_DIR``, else systemd's ``$STATE_DIRECTORY``, else ``./svcgate-data``."""
    text = env.get("SVC_DATA_DIR", "") or env.get("STATE_DIRECTORY", "").split(":")[0]
    return Path(text or DEFAULT_DATA_DIR).absolute()


def control_socket_from_env(env: Mapping[str, str], data_dir: Path) -> Path:
    """``SVC_CONTROL_SOCKET``, else ``<data dir>/control.sock``. Raises :class:`SettingsError`."""
    text = env.get("SVC_CONTROL_SOCKET", "")
    path = Path(text).absolute() if text else data_dir / CONTROL_SOCKET_NAME
    longest = max(len(os.fsencode(path)), len(os.fsencode(path.parent / CONTROL_SOCKET_NAME)))
    if longest > _MAX_SOCKET_PATH:
        raise SettingsError(
            "SVC_CONTROL_SOCKET",
            f"{str(path)!r} is too long for a unix socket (at most {_MAX_SOCKET_PATH} bytes)",
        )
    return path


def sandbox_dir_from_env(env: Mapping[str, str]) -> Path:
    """``SVC_SANDBOX_DIR``, else ``$RUNTIME_DIRECTORY/sandboxes`` (systemd), else the default."""
    explicit = env.get("SVC_SANDBOX_DIR", "")
    if explicit:
        return Path(explicit).absolute()
    runtime = env.get("RUNTIME_DIRECTORY", "").split(":")[0]
    return Path(runtime, "sandboxes") if runtime else Path(DEFAULT_SANDBOX_DIR)


def settings_from_env(env: Mapping[str, str] | None = None) -> Settings:
    """Parse every ``SVC_*`` variable once. Raises :class:`SettingsError`."""
    env = dict(os.environ if env is None else env)

    bearer = env.get("SVC_BEARER_TOKEN", "")
    if not bearer:
        raise SettingsError("SVC_BEARER_TOKEN", "is required (the legacy /mcp bearer token)")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in bearer):
        raise SettingsError("SVC_BEARER_TOKEN", "must not contain spaces or control characters")

    host, port = _parse_listen(env.get("SVC_LISTEN", "") or DEFAULT_LISTEN)
    metrics_listen = _parse_metrics_listen(env.get("SVC_METRICS_LISTEN", ""), (host, port))

    data_dir = data_dir_from_env(env)
    if data_dir.exists() and not data_dir.is_dir():
        raise SettingsError("SVC_DATA_DIR", f"{str(data_dir)!r} exists and is not a directory")

    oidc = _parse_oidc(env)

    admin_role = env.get("SVC_OIDC_ADMIN_ROLE", "") or DEFAULT_ADMIN_ROLE
    if any(ord(c) < 0x20 for c in admin_role):
        raise SettingsError("SVC_OIDC_ADMIN_ROLE", "must not contain control characters")

    ttl_text = env.get("SVC_SESSION_TTL", "") or DEFAULT_SESSION_TTL
    try:
        session_ttl = parse_duration(ttl_text)
    except ValueError as exc:
        raise SettingsError(
            "SVC_SESSION_TTL", f"invalid duration {ttl_text!r} (examples: 168h, 90m, 1h30m)"
        ) from exc
    if session_ttl < 60:
        raise SettingsError("SVC_SESSION_TTL", "must be at least 1m")

    public_origin: str | None = None
    public_url = env.get("SVC_PUBLIC_URL", "")
    if public_url:
        _, _, public_origin = _parse_http_url("SVC_PUBLIC_URL", public_url)
        if urlsplit(public_url).path not in ("", "/") or urlsplit(public_url).query:
            raise SettingsError("SVC_PUBLIC_URL", "must be an origin such as https://gw.example")
    elif oidc is not None:
        _, _, public_origin = _parse_http_url("SVC_OIDC_REDIRECT_URL", oidc.redirect_url)

    echo_bin: Path | None = None
    echo_text = env.get("SVC_ECHO_BIN", "")
    if echo_text:
        echo_bin = Path(echo_text).absolute()
        if not echo_bin.is_file():
            raise SettingsError("SVC_ECHO_BIN", f"{echo_text!r} is not a file")
        if not os.access(echo_bin, os.X_OK):
            raise SettingsError("SVC_ECHO_BIN", f"{echo_text!r} is not executable")

    vault_key_file, vault_key_create = vault_key_location(env, data_dir)
    control_socket = control_socket_from_env(env, data_dir)
    sandbox_dir = sandbox_dir_from_env(env)
    if sandbox_dir.exists() and not sandbox_dir.is_dir():
        raise SettingsError("SVC_SANDBOX_DIR", f"{str(sandbox_dir)!r} is not a directory")

    local_servers: dict[str, LocalServer] = {}
    servers_file = env.get("SVC_SERVERS_FILE", "")
    if servers_file:
        try:
            local_servers = parse_local_servers(Path(servers_file).read_bytes())
        except OSError as exc:
            raise SettingsError(
                "SVC_SERVERS_FILE", f"cannot read {servers_file!r} ({exc.strerror})"
            ) from exc
        except LocalServersError as exc:
            raise SettingsError("SVC_SERVERS_FILE", str(exc)) from exc
        if echo_bin is not None and LEGACY_SERVER in local_servers:
            raise SettingsError("SVC_SERVERS_FILE", f"{LEGACY_SERVER!r} is taken by SVC_ECHO_BIN")

    mcp_allowed_origins: list[str] = []
    for item in env.get("SVC_MCP_ALLOWED_ORIGINS", "").split(","):
        item = item.strip()
        if not item:
            continue
        _, _, origin = _parse_http_url("SVC_MCP_ALLOWED_ORIGINS", item)
        if origin != item.rstrip("/"):
            raise SettingsError("SVC_MCP_ALLOWED_ORIGINS", f"{item!r} is not an origin")
        mcp_allowed_origins.append(origin)

    log_level = (env.get("SVC_LOG_LEVEL", "") or "INFO").upper()
    if log_level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise SettingsError("SVC_LOG_LEVEL", "must be one of DEBUG, INFO, WARNING, ERROR")
    log_format = (env.get("SVC_LOG_FORMAT", "") or "auto").lower()
    if log_format not in ("auto", "json", "text"):
        raise SettingsError("SVC_LOG_FORMAT", "must be one of auto, json, text")
    try:
        egress = egress_settings_from_env(env)
    except EgressConfigError as exc:
        raise SettingsError(exc.variable, str(exc)) from exc
    try:
        registry = registry_settings_from_env(env)
        image_dir = image_dir_from_env(env)
    except RegistryConfigError as exc:
        raise SettingsError(exc.variable, str(exc)) from exc

    return Settings(
        listen_host=host,
        listen_port=port,
        data_dir=data_dir,
        bearer_token=bearer,
        oidc=oidc,
        admin_role=admin_role,
        session_ttl=session_ttl,
        public_origin=public_origin,
        echo_bin=echo_bin,
        vault_key_file=vault_key_file,
        vault_key_create=vault_key_create,
        sandbox_dir=sandbox_dir,
        control_socket=control_socket,
        log_level=log_level,
        log_format=log_format,
        local_servers=local_servers,
        mcp_allowed_origins=tuple(mcp_allowed_origins),
        egress=egress,
        registry=registry,
        image_dir=image_dir,
        metrics_listen=metrics_listen,
    )
