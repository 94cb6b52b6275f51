"""Registry installer settings (``SVC_REGISTRY_*``, ``SVC_IMAGE_DIR``), parsed with the others.

=============================  ==============================================================
``SVC_REGISTRY_INDEX``         where the signed index lives: ``https://...``, ``file:///...``,
                               or ``http://`` for a loopback host only
``SVC_REGISTRY_INDEX_SIG``     its detached signature (default: the index URL + ``.sig``)
``SVC_REGISTRY_KEYS``          trusted public keys, comma-separated: ``ed25519:<base64>``
                               values, or absolute paths of files holding such lines
``SVC_REGISTRY_AUTH_FILE``     OCI registry credentials, Docker's ``config.json`` format
                               (optional; anonymous pulls otherwise)
``SVC_REGISTRY_MAX_IMAGE_MB``  cap on an image's unpacked size (default 4096)
``SVC_REGISTRY_INSTALL``       refs to install at start when not installed yet, comma-separated
                               (never upgrades; failures are logged and the gateway runs on)
``SVC_IMAGE_DIR``              the unpacked image store (default ``/var/lib/svcgate-images``)
=============================  ==============================================================

The installer is configured only when both the index and at least one key are set; setting
one without the other is a start-up error (so a typo never silently disables verification).
Without them install and uninstall answer 501, and servers installed earlier keep running.

The image store must be outside the data directory: bubblewrap opens the unpacked root file
systems as the unprivileged sandbox uid, so every parent directory must be searchable by it,
and the data directory (database, vault key) stays 0700.

Standard library only at import time (the settings module imports it; the operator CLI runs
the settings module under a bare ``python3``). Key bytes are checked as Ed25519 keys when the
daemon builds its installer (:mod:`svcgate.registry.signing`).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from svcgate.host_patterns import is_loopback_host

DEFAULT_IMAGE_DIR = "/var/lib/svcgate-images"
KEY_PREFIX = "ed25519:"


class RegistryConfigError(ValueError):
    def __init__(self, variable: str, problem: str) -> None:
        super().__init__(problem)
        self.variable = variable


@dataclass(frozen=True)
class RegistrySettings:
    index_url: str
    signature_url: str
    # Trusted keys as ``ed25519:<base64>`` lines (checked for shape here).
    keys: tuple[str, ...]
    auth_file: Path | None = None
    max_image_bytes: int = 4096 * 1024 * 1024
    # Refs installed at start when missing (SVC_REGISTRY_INSTALL).
    install_at_start: tuple[str, ...] = ()


def check_location(variable: str, url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise RegistryConfigError(variable, "file:// URLs must be absolute (file:///path)")
        return url
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise RegistryConfigError(variable, "must be an https://, file:// or loopback http:// URL")
    if parts.scheme == "http" and not is_loopback_host(parts.hostname):
        raise RegistryConfigError(variable, "http:// is allowed only for a loopback host")
    if parts.username or parts.password:
        raise RegistryConfigError(variable, "must not carry credentials")
    return url


def _key_lines(text: str) -> list[str]:
    keys: list[str] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if item.startswith("/"):
            try:
                lines = Path(item).read_text().splitlines()
            except (OSError, UnicodeDecodeError) as exc:
                raise RegistryConfigError(
                    "SVC_REGISTRY_KEYS", f"cannot read key file {item!r} ({exc})"
                ) from None
            candidates = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]
        else:
            candidates = [item]
        for key in candidates:
            if not key.startswith(KEY_PREFIX):
                raise RegistryConfigError(
                    "SVC_REGISTRY_KEYS", f"keys look like {KEY_PREFIX}<base64 of 32 bytes>"
                )
            try:
                raw = base64.b64decode(key[len(KEY_PREFIX) :], validate=True)
            except (binascii.Error, ValueError):
                raise RegistryConfigError("SVC_REGISTRY_KEYS", "a key is not base64") from None
            if len(raw) != 32:
                raise RegistryConfigError("SVC_REGISTRY_KEYS", "an Ed25519 key has 32 bytes")
            if key not in keys:
                keys.append(key)
    return keys


def registry_settings_from_env(env: Mapping[str, str]) -> RegistrySettings | None:
    index = env.get("SVC_REGISTRY_INDEX", "").strip()
    keys_text = env.get("SVC_REGISTRY_KEYS", "").strip()
    if not index and not keys_text:
        for extra in ("SVC_REGISTRY_INDEX_SIG", "SVC_REGISTRY_AUTH_FILE", "SVC_REGISTRY_INSTALL"):
            if env.get(extra, "").strip():
                raise RegistryConfigError(extra, "is set but SVC_REGISTRY_INDEX is empty")
        return None
    if not index:
        raise RegistryConfigError("SVC_REGISTRY_INDEX", "is required when SVC_REGISTRY_KEYS is set")
    if not keys_text:
        raise RegistryConfigError(
            "SVC_REGISTRY_KEYS", "is required when SVC_REGISTRY_INDEX is set (the trusted keys)"
        )
    check_location("SVC_REGISTRY_INDEX", index)
    signature = env.get("SVC_REGISTRY_INDEX_SIG", "").strip() or index + ".sig"
    check_location("SVC_REGISTRY_INDEX_SIG", signature)
    keys = _key_lines(keys_text)
    if not keys:
        raise RegistryConfigError("SVC_REGISTRY_KEYS", "names no key")
    auth_text = env.get("SVC_REGISTRY_AUTH_FILE", "").strip()
    auth_file: Path | None = None
    if auth_text:
        auth_file = Path(auth_text).absolute()
        if not auth_file.is_file():
            raise RegistryConfigError("SVC_REGISTRY_AUTH_FILE", f"{auth_text!r} is not a file")
    max_text = env.get("SVC_REGISTRY_MAX_IMAGE_MB", "").strip()
    max_bytes = 4096 * 1024 * 1024
    if max_text:
        if not max_text.isdigit() or not 1 <= int(max_text) <= 1024 * 1024:
            raise RegistryConfigError("SVC_REGISTRY_MAX_IMAGE_MB", "must be an integer of MiB")
        max_bytes = int(max_text) * 1024 * 1024
    install = tuple(item.strip() for item in env.get("SVC_REGISTRY_INSTALL", "").split(","))
    return RegistrySettings(
        index, signature, tuple(keys), auth_file, max_bytes, tuple(i for i in install if i)
    )


def image_dir_from_env(env: Mapping[str, str]) -> Path:
    text = env.get("SVC_IMAGE_DIR", "").strip()
    path = Path(text).absolute() if text else Path(DEFAULT_IMAGE_DIR)
    if path.exists() and not path.is_dir():
        raise RegistryConfigError("SVC_IMAGE_DIR", f"{str(path)!r} is not a directory")
    return path
