"""Settings come from the environment once; a bad value stops start-up with one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from gateway_support import free_port

from svcgate.settings import SettingsError, settings_from_env

BASE = {"SVC_BEARER_TOKEN": "tok-123"}
OIDC = {
    "SVC_OIDC_ISSUER": "https://idp.example",
    "SVC_OIDC_CLIENT_ID": "svcgate",
    "SVC_OIDC_REDIRECT_URL": "https://gw.example/api/auth/callback",
}


def test_defaults() -> None:
    settings = settings_from_env(BASE)
    assert (settings.listen_host, settings.listen_port) == ("0.0.0.0", 8080)
    assert settings.session_ttl == 168 * 3600
    assert settings.admin_role == "svc-admin"
    assert settings.oidc is None
    assert not settings.control_plane_enabled


def test_secrets_stay_out_of_repr() -> None:
    settings = settings_from_env({**BASE, **OIDC, "SVC_OIDC_CLIENT_SECRET": "s3cr3t-value"})
    assert "tok-123" not in repr(settings)
    assert "s3cr3t-value" not in repr(settings)
    assert settings.oidc is not None and settings.oidc.client_secret == "s3cr3t-value"


def test_public_url_is_derived_from_the_redirect_url() -> None:
    settings = settings_from_env({**BASE, **OIDC})
    assert settings.public_origin == "https://gw.example"
    assert settings.secure_cookies


def test_http_public_url_means_no_secure_cookies() -> None:
    settings = settings_from_env({**BASE, **OIDC, "SVC_PUBLIC_URL": "http://gw.example:8080/"})
    assert settings.public_origin == "http://gw.example:8080"
    assert not settings.secure_cookies


def test_client_secret_file(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("from-file\n")
    settings = settings_from_env({**BASE, **OIDC, "SVC_OIDC_CLIENT_SECRET_FILE": str(secret)})
    assert settings.oidc is not None and settings.oidc.client_secret == "from-file"


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({}, "SVC_BEARER_TOKEN"),
        ({**BASE, "SVC_LISTEN": "nonsense"}, "SVC_LISTEN"),
        ({**BASE, "SVC_LISTEN": "127.0.0.1:99999"}, "SVC_LISTEN"),
        ({**BASE, "SVC_SESSION_TTL": "7d"}, "SVC_SESSION_TTL"),
        ({**BASE, "SVC_SESSION_TTL": "1s"}, "SVC_SESSION_TTL"),
        ({**BASE, "SVC_OIDC_ISSUER": "https://idp.example"}, "SVC_OIDC_CLIENT_ID"),
        (
            {**BASE, "SVC_OIDC_ISSUER": "https://idp.example", "SVC_OIDC_CLIENT_ID": "c"},
            "SVC_OIDC_REDIRECT_URL",
        ),
        ({**BASE, "SVC_OIDC_CLIENT_ID": "c"}, "SVC_OIDC_ISSUER"),
        (
            {**BASE, **OIDC, "SVC_OIDC_REDIRECT_URL": "https://gw.example/cb"},
            "SVC_OIDC_REDIRECT_URL",
        ),
        ({**BASE, **OIDC, "SVC_OIDC_ISSUER": "idp.example"}, "SVC_OIDC_ISSUER"),
        ({**BASE, **OIDC, "SVC_OIDC_ISSUER": "http://idp.example"}, "SVC_OIDC_ISSUER"),
        ({**BASE, **OIDC, "SVC_PUBLIC_URL": "gw.example"}, "SVC_PUBLIC_URL"),
        ({**BASE, **OIDC, "SVC_PUBLIC_URL": "https://gw.example/app"}, "SVC_PUBLIC_URL"),
        (
            {**BASE, **OIDC, "SVC_OIDC_CLIENT_SECRET_FILE": "/nonexistent"},
            "SVC_OIDC_CLIENT_SECRET_FILE",
        ),
        ({**BASE, "SVC_ECHO_BIN": "/nonexistent/echo"}, "SVC_ECHO_BIN"),
    ],
)
def test_bad_settings_name_the_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(SettingsError) as caught:
        settings_from_env(env)
    assert caught.value.variable == variable
    assert str(caught.value).startswith(variable)


def test_loopback_issuer_may_use_http() -> None:
    settings = settings_from_env({**BASE, **OIDC, "SVC_OIDC_ISSUER": "http://127.0.0.1:9000"})
    assert settings.oidc is not None


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({}, "SVC_BEARER_TOKEN"),
        ({"SVC_BEARER_TOKEN": "t", "SVC_SESSION_TTL": "forever"}, "SVC_SESSION_TTL"),
        ({"SVC_BEARER_TOKEN": "t", "SVC_OIDC_ISSUER": "http://127.0.0.1:9"}, "SVC_OIDC_CLIENT_ID"),
    ],
)
def test_serve_refuses_to_start_with_one_line(
    env: dict[str, str], variable: str, tmp_path: Path
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "svcgate", "serve"],
        env={"PATH": "/usr/bin:/bin", "SVC_DATA_DIR": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert variable in lines[0]


def test_unreachable_issuer_fails_fast(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    result = subprocess.run(
        [sys.executable, "-m", "svcgate", "serve"],
        env={
            "PATH": "/usr/bin:/bin",
            "SVC_DATA_DIR": str(tmp_path),
            "SVC_BEARER_TOKEN": "t",
            "SVC_LISTEN": "127.0.0.1:0",
            "SVC_OIDC_ISSUER": f"http://127.0.0.1:{port}",
            "SVC_OIDC_CLIENT_ID": "c",
            "SVC_OIDC_REDIRECT_URL": "http://127.0.0.1:1/api/auth/callback",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "SVC_OIDC_ISSUER" in result.stderr.strip().splitlines()[-1]
    assert "listening" not in result.stdout
