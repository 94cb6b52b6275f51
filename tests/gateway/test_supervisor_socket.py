"""The operator control socket served in-process over a supervisor holding real sandboxes:
protocol, table rendering, access control, and cleanup on cancellation."""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import stat
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from process_support import public_tmpdir
from supervisor_helpers import (
    copy_echo_server,
    ensure_echo,
    leftovers,
    running_supervisor,
    unique_server,
)

from sandbox import SandboxSpec
from svcgate import operator_cli
from svcgate.operator_socket import (
    MAX_REQUEST_BYTES,
    ControlSocketError,
    bind_control_socket,
    serve_control_socket,
)
from svcgate.supervisor import SandboxKey, SandboxOwner, SandboxSupervisor

if os.geteuid() != 0:  # pragma: no cover - CI and dev machines run these as root
    pytest.skip("control socket tests need root (sandboxes)", allow_module_level=True)


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = public_tmpdir("ctl")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@asynccontextmanager
async def serving(path: Path, supervisor: SandboxSupervisor) -> AsyncIterator[trio.CancelScope]:
    async with trio.open_nursery() as nursery:
        with trio.fail_after(5):
            await nursery.start(serve_control_socket, path, supervisor)
        yield nursery.cancel_scope
        nursery.cancel_scope.cancel()


async def call(path: Path, request: dict[str, Any]) -> Any:
    with trio.fail_after(10):
        return await trio.to_thread.run_sync(operator_cli.call, path, request)


async def raw_exchange(path: Path, payload: bytes) -> list[dict[str, Any]]:
    """Send raw bytes, half-close, and return every response line until the server hangs up."""
    data = b""
    with trio.fail_after(10):
        stream = await trio.open_unix_socket(str(path))
        async with stream:
            await stream.send_all(payload)
            await stream.send_eof()
            try:
                while chunk := await stream.receive_some(65536):
                    data += chunk
            except trio.BrokenResourceError:
                # A server that closes with our bytes unread resets the connection (after
                # the answers it sent, which we have read).
                pass
    return [json.loads(line) for line in data.splitlines()]


async def hung_up(stream: trio.SocketStream) -> bool:
    """True once the peer closed: EOF, or a reset if it left some of our bytes unread."""
    try:
        return await stream.receive_some(10) == b""
    except trio.BrokenResourceError:
        return True


async def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    args = operator_cli.build_parser().parse_args(argv)
    with trio.fail_after(10):
        code = await trio.to_thread.run_sync(
            lambda: operator_cli.run_command(args, env={}, out=out, err=err)
        )
    return code, out.getvalue(), err.getvalue()


async def test_commands_and_tables_for_a_supervisor_holding_sandboxes(workdir: Path) -> None:
    echo_bin = copy_echo_server(workdir)
    state_dir = workdir / "state"
    path = workdir / "control.sock"
    a, b, crashy = unique_server(), unique_server(), unique_server("crashy")

    async def noisy() -> SandboxSpec:
        code = "import sys; [print(m, file=sys.stderr) for m in ('first line', 'last line')]"
        return SandboxSpec(command=("/usr/bin/python3", "-c", code, crashy), label=crashy)

    async with running_supervisor(state_dir) as supervisor, serving(path, supervisor):
        await ensure_echo(supervisor, echo_bin, 1, a)
        await ensure_echo(supervisor, echo_bin, 2, b)
        owner = SandboxOwner("team-x", 42)
        with trio.fail_after(15):
            exited = await supervisor.ensure(SandboxKey(3, crashy), noisy, owner=owner)
            await exited.wait()
        infos = {i.server: i for i in await supervisor.list()}

        ps = await call(path, {"cmd": "sandbox.ps"})
        assert [(r["profile_slug"], r["server"], r["state"]) for r in ps] == [
            ("profile-1", a, "running"),
            ("profile-2", b, "running"),
            ("team-x", crashy, "exited"),
        ]
        assert ps[0]["pid"] == infos[a].pid and ps[0]["namespace"] == infos[a].namespace
        assert (ps[0]["tenant"], ps[0]["owner_user_id"], ps[2]["exit_code"]) == (1, 101, 0)
        assert all(r["age_seconds"] >= 0 for r in ps)

        ls = await call(path, {"cmd": "netns.ls"})
        assert [r["namespace"] for r in ls] == [infos[s].namespace for s in (a, b, crashy)]
        assert ls[1] == {
            "namespace": infos[b].namespace,
            "profile_id": 2,
            "profile_slug": "profile-2",
            "server": b,
            "owner_user_id": 102,
            "pid": infos[b].pid,
            "state": "running",
            "egress_listener": None,
            "egress_connections": 0,
            "started_at": infos[b].started_at,
            "age_seconds": ls[1]["age_seconds"],
        }

        logs = await call(path, {"cmd": "sandbox.logs", "profile": "team-x", "server": crashy})
        assert logs == {"profile": "team-x", "server": crashy, "lines": ["first line", "last line"]}
        request = {"cmd": "sandbox.logs", "profile": "3", "server": crashy, "lines": 1}
        by_id = await call(path, request)
        assert by_id["lines"] == ["last line"]

        # The CLI renders the same answers as tables, or passes them through with --json.
        code, out, err = await run_cli(["netns", "ls", "--socket", str(path)])
        assert (code, err) == (0, "")
        header, *rows = out.splitlines()
        assert header.split() == [
            "NAMESPACE",
            "PROFILE",
            "SERVER",
            "OWNER",
            "PID",
            "EGRESS",
            "AGE",
            "CONNS",
        ]
        assert rows[0].split()[:5] == [infos[a].namespace, "profile-1", a, "101", str(infos[a].pid)]
        assert rows[0].split()[5] == "-" and rows[0].split()[7] == "0"

        code, out, _ = await run_cli(["sandbox", "ps", "--socket", str(path)])
        assert code == 0
        assert [line.split()[:5] for line in out.splitlines()[1:]] == [
            ["profile-1", a, "1", "101", "running"],
            ["profile-2", b, "2", "102", "running"],
            ["team-x", crashy, "3", "42", "exited"],
        ]
        code, out, _ = await run_cli(["sandbox", "ps", "--json", "--socket", str(path)])
        assert code == 0 and [r["server"] for r in json.loads(out)] == [a, b, crashy]

        code, out, _ = await run_cli(["sandbox", "logs", "team-x", crashy, "--socket", str(path)])
        assert (code, out) == (0, "first line\nlast line\n")

        code, out, err = await run_cli(["sandbox", "logs", "nobody", a, "--socket", str(path)])
        assert (code, out) == (1, "")
        assert err == f"svcgate: no sandbox for server {a!r} in profile 'nobody'\n"
    assert not path.exists()
    assert leftovers(state_dir, (a, b, crashy)) == {}


async def test_bad_requests_get_error_answers_and_the_connection_stays_usable(
    workdir: Path,
) -> None:
    path = workdir / "control.sock"
    async with running_supervisor(workdir / "state") as supervisor, serving(path, supervisor):
        replies = await raw_exchange(
            path,
            b"not json\n"
            b"[1, 2]\n"
            b"\n"
            b'{"cmd": "reboot"}\n'
            b'{"cmd": "sandbox.logs", "server": "x"}\n'
            b'{"cmd": "sandbox.logs", "profile": "p", "server": "x", "lines": 0}\n'
            b'{"cmd": "sandbox.logs", "profile": "p", "server": "x", "lines": true}\n'
            b'{"cmd": "sandbox.logs", "profile": "p", "server": "x"}\n'
            b'{"cmd": "sandbox.ps"}\n',
        )
        assert [r.get("error", {}).get("code") for r in replies] == [
            "bad_request",
            "bad_request",
            "unknown_command",
            "bad_request",
            "bad_request",
            "bad_request",
            "not_found",
            None,
        ]
        assert replies[-1] == {"ok": True, "result": []}

        # An over-long request line is refused and the connection closed.
        [too_long] = await raw_exchange(path, b"x" * (MAX_REQUEST_BYTES + 100))
        assert too_long["error"]["code"] == "bad_request"
        assert await call(path, {"cmd": "netns.ls"}) == []


async def test_the_socket_is_root_only_and_replaces_only_a_stale_file(workdir: Path) -> None:
    path = workdir / "control.sock"
    async with running_supervisor(workdir / "state") as supervisor:
        async with serving(path, supervisor):
            st = path.lstat()
            assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
            assert st.st_uid == os.geteuid()
            # A second daemon must not steal a live socket.
            with pytest.raises(ControlSocketError, match="in use"):
                bind_control_socket(path)
            assert path.exists() and await call(path, {"cmd": "sandbox.ps"}) == []
        assert not path.exists()

        # A socket file left by a killed daemon (nobody listening) is replaced.
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(str(path))
        stale.close()
        async with serving(path, supervisor):
            assert await call(path, {"cmd": "sandbox.ps"}) == []
        assert not path.exists()

        path.write_text("not a socket")
        with pytest.raises(ControlSocketError, match="not a socket"):
            bind_control_socket(path)
        assert path.read_text() == "not a socket"
        with pytest.raises(ControlSocketError, match="too long"):
            bind_control_socket(workdir / ("d" * 120) / "control.sock")
    # No temporary bind directory is left beside the socket.
    assert sorted(os.listdir(workdir)) == ["control.sock", "state"]


async def test_peers_other_than_root_are_refused_even_if_the_file_mode_allows_them(
    workdir: Path,
) -> None:
    path = workdir / "control.sock"
    # The refusal is sent as soon as the connection is accepted; the client only reads
    # (writing could race the server's close and fail with EPIPE).
    script = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "s.connect(sys.argv[1])\n"
        "print(s.makefile().readline(), end='')\n"
    )
    async with running_supervisor(workdir / "state") as supervisor, serving(path, supervisor):
        path.chmod(0o666)  # defeat the first line of defence to test the second
        with trio.fail_after(15):
            result = await trio.run_process(
                ["/usr/bin/python3", "-c", script, str(path)],
                user=65534,
                group=65534,
                extra_groups=[],
                capture_stdout=True,
                capture_stderr=True,
                env={},
                check=False,
            )
        assert result.returncode == 0, result.stderr
        reply = json.loads(result.stdout)
        assert reply == {
            "ok": False,
            "error": {"code": "forbidden", "message": "the control socket is root-only"},
        }


async def test_cancelling_the_server_with_clients_connected_removes_the_socket(
    workdir: Path,
) -> None:
    path = workdir / "control.sock"
    async with running_supervisor(workdir / "state") as supervisor:
        async with serving(path, supervisor) as scope:
            idle = await trio.open_unix_socket(str(path))
            half = await trio.open_unix_socket(str(path))
            await half.send_all(b'{"cmd": "sandbox')  # mid-request
            assert await call(path, {"cmd": "sandbox.ps"}) == []  # others are still served
            scope.cancel()
        assert not path.exists()
        with trio.fail_after(5):
            # The server closed both connections without an answer.
            assert await hung_up(idle) and await hung_up(half)
        await idle.aclose()
        await half.aclose()


def test_ages_and_tables_render_compactly() -> None:
    assert [operator_cli.format_age(s) for s in (None, 0, 59.9, 60, 187, 3600, 7501, 90000)] == [
        "-",
        "0s",
        "59s",
        "1m00s",
        "3m07s",
        "1h00m",
        "2h05m",
        "1d01h",
    ]
    columns = (("NAME", "name"), ("PID", "pid"))
    assert operator_cli.render_table(columns, []) == "NAME  PID"
    table = operator_cli.render_table(
        columns, [{"name": "a-long-name", "pid": 1}, {"name": "b\nc", "pid": None}]
    )
    assert table.splitlines() == ["NAME         PID", "a-long-name  1", "b?c          -"]
    assert operator_cli.render_netns([]).split() == [
        "NAMESPACE",
        "PROFILE",
        "SERVER",
        "OWNER",
        "PID",
        "EGRESS",
        "AGE",
        "CONNS",
    ]
    with pytest.raises(operator_cli.ControlError, match="malformed"):
        operator_cli.render_ps({"not": "a list"})
