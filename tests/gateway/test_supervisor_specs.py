"""Pure parts of the sandbox supervisor: the legacy fallback's spec, name prefixes, and the
settings that place sandbox state and the control socket."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox import Bind
from svcgate.legacy_spec import SANDBOX_PYTHON, legacy_server_spec
from svcgate.settings import SettingsError, settings_from_env
from svcgate.supervisor import SandboxKey, SandboxOwner, SupervisorConfig, launcher_prefix

KEY = SandboxKey(12, "echo")
OWNER = SandboxOwner("team-a", 3)


def test_a_python_echo_bin_runs_with_the_hosts_python_from_a_read_only_bind() -> None:
    spec = legacy_server_spec(Path("/srv/repo/svcgate/examples/echo_server.py"), KEY, OWNER)
    dest = "/opt/server/echo/echo_server.py"
    assert spec.command == (SANDBOX_PYTHON, dest)
    assert spec.binds == (Bind("/srv/repo/svcgate/examples/echo_server.py", dest),)
    assert not spec.binds[0].writable
    assert spec.label == "team-a/echo"
    assert spec.rootfs is None  # host mode: the host's /usr, read-only
    assert spec.netns is None  # the launcher makes the sandbox its own namespace
    assert spec.scratch is None
    assert dict(spec.env)["PATH"] == "/usr/local/bin:/usr/bin:/bin"


def test_any_other_echo_bin_is_executed_directly_from_a_normalised_path() -> None:
    spec = legacy_server_spec(Path("/opt/tools/../bin/echo-server"), SandboxKey(1, "x"), OWNER)
    assert spec.command == ("/opt/server/x/echo-server",)
    assert spec.binds == (Bind("/opt/bin/echo-server", "/opt/server/x/echo-server"),)


def test_distinct_state_dirs_never_share_a_name_prefix() -> None:
    a, b = launcher_prefix(Path("/run/svcgate/sandboxes")), launcher_prefix(Path("/srv/x"))
    assert a != b
    assert a == launcher_prefix(Path("/run/svcgate/sandboxes"))
    for prefix in (a, b):
        assert prefix.startswith("svcg") and prefix.endswith("-") and len(prefix) == 11
    config = SupervisorConfig(state_dir=Path("/srv/x"), stop_grace=1.5).launcher_config()
    assert (config.prefix, config.stop_grace) == (b, 1.5)


BASE = {"SVC_BEARER_TOKEN": "tok-123", "SVC_DATA_DIR": "/var/lib/svcgate"}


def test_sandbox_state_lives_in_run_and_the_control_socket_in_the_data_dir() -> None:
    settings = settings_from_env(BASE)
    assert settings.sandbox_dir == Path("/run/svcgate/sandboxes")
    assert settings.control_socket == Path("/var/lib/svcgate/control.sock")
    systemd = settings_from_env({**BASE, "RUNTIME_DIRECTORY": "/run/svcgate-unit"})
    assert systemd.sandbox_dir == Path("/run/svcgate-unit/sandboxes")
    explicit = settings_from_env(
        {
            **BASE,
            "RUNTIME_DIRECTORY": "/run/ignored",
            "SVC_SANDBOX_DIR": "/srv/sandboxes",
            "SVC_CONTROL_SOCKET": "/run/svcgate/ctl.sock",
        }
    )
    assert explicit.sandbox_dir == Path("/srv/sandboxes")
    assert explicit.control_socket == Path("/run/svcgate/ctl.sock")


def test_bad_socket_and_sandbox_dir_settings_name_their_variable(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"^SVC_CONTROL_SOCKET: .* too long for a unix socket"):
        settings_from_env({**BASE, "SVC_CONTROL_SOCKET": "/run/" + "s" * 110})
    with pytest.raises(SettingsError, match=r"^SVC_CONTROL_SOCKET: "):
        settings_from_env({**BASE, "SVC_DATA_DIR": "/" + "d" * 100})
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(SettingsError, match=r"^SVC_SANDBOX_DIR: .* is not a directory"):
        settings_from_env({**BASE, "SVC_SANDBOX_DIR": str(not_a_dir)})
