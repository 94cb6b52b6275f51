"""systemd credentials (``LoadCredential=``): the OIDC client secret and the vault key are read
from ``$CREDENTIALS_DIRECTORY`` when no explicit variable names them (docs/systemd.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from svcgate.settings import SettingsError, settings_from_env

BASE = {"SVC_BEARER_TOKEN": "tok-123"}
OIDC = {
    "SVC_OIDC_ISSUER": "https://idp.example",
    "SVC_OIDC_CLIENT_ID": "svcgate",
    "SVC_OIDC_REDIRECT_URL": "https://gw.example/api/auth/callback",
}


@pytest.fixture
def credentials(tmp_path: Path) -> Path:
    directory = tmp_path / "credentials"
    directory.mkdir(mode=0o700)
    (directory / "oidc-client-secret").write_text("from-credential\n")
    (directory / "vault-key").write_text("")
    return directory


def test_the_client_secret_comes_from_the_credential(credentials: Path) -> None:
    settings = settings_from_env({**BASE, **OIDC, "CREDENTIALS_DIRECTORY": str(credentials)})
    assert settings.oidc is not None
    assert settings.oidc.client_secret == "from-credential"
    assert "from-credential" not in repr(settings)
    # The vault key ring comes from the same directory (LoadCredential=vault-key:...).
    assert settings.vault_key_file == credentials / "vault-key"
    assert not settings.vault_key_create


def test_an_explicit_secret_wins_over_the_credential(credentials: Path) -> None:
    env = {**BASE, **OIDC, "CREDENTIALS_DIRECTORY": str(credentials)}
    settings = settings_from_env({**env, "SVC_OIDC_CLIENT_SECRET": "from-env"})
    assert settings.oidc is not None and settings.oidc.client_secret == "from-env"
    secret_file = credentials.parent / "secret.txt"
    secret_file.write_text("from-file\n")
    settings = settings_from_env({**env, "SVC_OIDC_CLIENT_SECRET_FILE": str(secret_file)})
    assert settings.oidc is not None and settings.oidc.client_secret == "from-file"


def test_without_the_credential_the_client_is_public(credentials: Path) -> None:
    (credentials / "oidc-client-secret").unlink()
    settings = settings_from_env({**BASE, **OIDC, "CREDENTIALS_DIRECTORY": str(credentials)})
    assert settings.oidc is not None and settings.oidc.client_secret == ""


def test_the_credential_is_ignored_when_oidc_is_not_configured(credentials: Path) -> None:
    settings = settings_from_env({**BASE, "CREDENTIALS_DIRECTORY": str(credentials)})
    assert settings.oidc is None


def test_an_unreadable_credential_names_it(credentials: Path) -> None:
    (credentials / "oidc-client-secret").unlink()
    (credentials / "oidc-client-secret").mkdir()
    with pytest.raises(SettingsError) as caught:
        settings_from_env({**BASE, **OIDC, "CREDENTIALS_DIRECTORY": str(credentials)})
    assert caught.value.variable == "$CREDENTIALS_DIRECTORY/oidc-client-secret"
    assert str(caught.value).startswith("$CREDENTIALS_DIRECTORY/oidc-client-secret: cannot read")
