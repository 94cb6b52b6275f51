"""``svcgate netns ls`` / ``sandbox ps`` / ``sandbox logs`` against a real daemon process,
over its root-only control socket; and the daemon's start-up checks for that socket and for
the sandbox state directory."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway_support import Gateway, run_cli, start_gateway
from process_support import public_tmpdir
from supervisor_helpers import REPO

if os.geteuid() != 0:  # pragma: no cover - CI and dev machines run these as root
    pytest.skip("the daemon runs sandboxes and needs root", allow_module_level=True)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = start_gateway(tmp_path_factory.mktemp("opcli"), idp=None)
    try:
        yield gw
    finally:
        gw.stop()


def data_dir_of(gw: Gateway) -> Path:
    return Path(gw.env["SVC_DATA_DIR"])


def test_the_control_socket_is_a_root_only_socket_in_the_data_dir(daemon: Gateway) -> None:
    st = (data_dir_of(daemon) / "control.sock").lstat()
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0


def test_a_daemon_without_sandboxes_lists_empty_tables(daemon: Gateway) -> None:
    data = data_dir_of(daemon)
    ls = run_cli("netns", "ls", data_dir=data)
    assert (ls.returncode, ls.stderr) == (0, "")
    assert ls.stdout.split() == [
        "NAMESPACE",
        "PROFILE",
        "SERVER",
        "OWNER",
        "PID",
        "EGRESS",
        "AGE",
        "CONNS",
    ]
    ps = run_cli("sandbox", "ps", data_dir=data)
    assert ps.returncode == 0
    assert ps.stdout.split() == [
        "PROFILE",
        "SERVER",
        "TENANT",
        "OWNER",
        "STATE",
        "PID",
        "NAMESPACE",
        "AGE",
        "EXIT",
    ]
    for command in (("netns", "ls"), ("sandbox", "ps")):
        result = run_cli(*command, "--json", data_dir=data)
        assert result.returncode == 0 and json.loads(result.stdout) == []


def test_logs_of_an_unknown_sandbox_exit_1_with_one_line(daemon: Gateway) -> None:
    result = run_cli("sandbox", "logs", "nobody", "echo", data_dir=data_dir_of(daemon))
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == "svcgate: no sandbox for server 'echo' in profile 'nobody'\n"


def test_the_socket_can_be_named_explicitly(daemon: Gateway, tmp_path: Path) -> None:
    socket_path = str(data_dir_of(daemon) / "control.sock")
    by_env = run_cli(
        "sandbox", "ps", "--json", data_dir=tmp_path, extra_env={"SVC_CONTROL_SOCKET": socket_path}
    )
    by_flag = run_cli("sandbox", "ps", "--json", "--socket", socket_path, data_dir=tmp_path)
    assert (by_env.returncode, by_env.stdout.strip()) == (0, "[]")
    assert (by_flag.returncode, by_flag.stdout.strip()) == (0, "[]")


def test_a_non_root_operator_is_told_permission_denied(daemon: Gateway) -> None:
    # The operator commands import only the standard library, so Debian's python3 can run
    # them as the unprivileged uid from a copy of the package it can read.
    copy = public_tmpdir("opcli-pkg")
    try:
        shutil.copytree(REPO / "svcgate", copy / "svcgate", ignore=shutil.ignore_patterns("*.pyc"))
        for path in copy.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        # Python's import system lists each sys.path entry; 0711 would hide the package.
        copy.chmod(0o755)
        result = subprocess.run(
            [
                "/usr/bin/python3",
                "-c",
                "import sys; from svcgate.operator_cli import main; sys.exit(main(sys.argv[1:]))",
                "netns",
                "ls",
            ],
            env={"PYTHONPATH": str(copy), "SVC_DATA_DIR": str(data_dir_of(daemon))},
            cwd="/",  # the checkout may sit below a directory uid 65534 cannot enter
            user=65534,
            group=65534,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        shutil.rmtree(copy)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.startswith("svcgate: permission denied on ")
    assert "root-only" in result.stderr and result.stderr.count("\n") == 1


def test_no_daemon_and_a_stale_socket_give_clear_errors(tmp_path: Path) -> None:
    missing = run_cli("netns", "ls", data_dir=tmp_path)
    assert missing.returncode == 1
    assert missing.stderr == (
        f"svcgate: no control socket at {tmp_path}/control.sock: is the daemon running? "
        "(set SVC_CONTROL_SOCKET or SVC_DATA_DIR, or use --socket)\n"
    )
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(tmp_path / "control.sock"))
    stale.close()
    result = run_cli("sandbox", "ps", "--json", data_dir=tmp_path)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        f"svcgate: the daemon is not running ({tmp_path}/control.sock is a stale socket)\n"
    )


def test_the_socket_is_removed_at_shutdown_and_a_live_one_is_never_taken_over(
    tmp_path: Path,
) -> None:
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    first = start_gateway(tmp_path / "one", idp=None)
    try:
        socket_path = data_dir_of(first) / "control.sock"
        second = start_gateway(
            tmp_path / "two",
            idp=None,
            extra_env={"SVC_CONTROL_SOCKET": str(socket_path)},
            expect_ready=False,
        )
        code = second.proc.wait(timeout=60)
        second.stop()
        assert code == 1
        assert f"svcgate: control socket: {socket_path} is in use" in second.log_text()
        # The first daemon still answers on its socket.
        assert run_cli("sandbox", "ps", "--json", data_dir=data_dir_of(first)).returncode == 0
    finally:
        assert first.stop() == 0
    assert not socket_path.exists()


def test_a_sandbox_dir_the_sandbox_uid_cannot_reach_stops_start_up(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    gw = start_gateway(
        tmp_path,
        idp=None,
        extra_env={"SVC_SANDBOX_DIR": str(private / "sandboxes")},
        expect_ready=False,
    )
    code = gw.proc.wait(timeout=60)
    gw.stop()
    assert code == 1
    assert f"svcgate: sandboxes ({private}/sandboxes): " in gw.log_text()
    assert "not searchable by the sandbox host uid 65534" in gw.log_text()
    assert not (Path(gw.env["SVC_DATA_DIR"]) / "control.sock").exists()
