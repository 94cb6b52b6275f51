"""Graceful shutdown of ``svcgate serve``: SIGTERM/SIGINT exit 0, in-flight requests drain.

Every wait is bounded. The bounds are generous failure limits, not expectations of speed:
with nothing in flight the daemon stops long before them, and each is below the daemon's
20-second graceful timeout so that "waited for the timeout" cannot pass as "drained".
"""

from __future__ import annotations

import signal
import socket
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest
from gateway_support import Gateway, api, login, start_gateway

from devidp.provider import DevIdP

EXIT_TIMEOUT = 10.0
IO_TIMEOUT = 10.0
CLOSE_TIMEOUT = 3.0  # a server closes a finished connection at once: a bound, not a speed
POLL_INTERVAL = 0.02


@contextmanager
def running(tmp: Path, idp: DevIdP, data_dir: Path | None = None) -> Iterator[Gateway]:
    """A gateway that is always gone afterwards (killed if a test left it running)."""
    gw = start_gateway(tmp, idp=idp, data_dir=data_dir)
    try:
        yield gw
    finally:
        gw.stop(signal.SIGKILL)  # signals only a gateway the test left running


def address(gw: Gateway) -> tuple[str, int]:
    host, port = gw.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def wait_for_log(gw: Gateway, needle: str, timeout: float = IO_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while needle not in gw.log_text():
        if time.monotonic() > deadline:
            raise AssertionError(f"{needle!r} not logged within {timeout}s:\n{gw.log_text()}")
        if gw.proc.poll() is not None:
            raise AssertionError(f"gateway exited before logging {needle!r}:\n{gw.log_text()}")
        time.sleep(POLL_INTERVAL)


def connect_refused(addr: tuple[str, int]) -> bool:
    try:
        with socket.create_connection(addr, timeout=IO_TIMEOUT):
            return False
    except ConnectionRefusedError:
        return True


def wait_until_refused(gw: Gateway, timeout: float = IO_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not connect_refused(address(gw)):
        if time.monotonic() > deadline:
            raise AssertionError(f"the listener still accepts connections after {timeout}s")
        time.sleep(POLL_INTERVAL)


def read_head(sock: socket.socket) -> tuple[int, bytes]:
    """Read one HTTP/1.1 response head, skipping ``1xx`` interim responses."""
    buffer = b""
    while True:
        while b"\r\n\r\n" not in buffer:
            chunk = sock.recv(65536)
            if not chunk:
                raise AssertionError(f"connection closed mid-response: {buffer!r}")
            buffer += chunk
        head, _, buffer = buffer.partition(b"\r\n\r\n")
        status_line = head.split(b"\r\n", 1)[0]
        assert status_line.startswith(b"HTTP/1.1 "), status_line
        status = int(status_line.split()[1])
        if status >= 200:
            return status, head


def wait_exit(gw: Gateway) -> int:
    """Wait (bounded) for an exit already under way, without signalling again."""
    code = gw.proc.wait(timeout=EXIT_TIMEOUT)
    gw.stop()  # the process is gone: this only collects the output pump
    return code


def assert_clean_exit(gw: Gateway, code: int) -> None:
    assert code == 0, gw.log_text()
    log = gw.log_text()
    assert "svcgate stopped" in log
    assert "Traceback" not in log


def test_sigterm_without_traffic_exits_0_and_closes_the_port(idp: DevIdP, tmp_path: Path) -> None:
    with running(tmp_path, idp) as gw:
        gw.proc.send_signal(signal.SIGTERM)
        assert_clean_exit(gw, wait_exit(gw))
        assert "received SIGTERM" in gw.log_text()
        assert connect_refused(address(gw))


def test_sigint_exits_0(idp: DevIdP, tmp_path: Path) -> None:
    with running(tmp_path, idp) as gw:
        gw.proc.send_signal(signal.SIGINT)
        assert_clean_exit(gw, wait_exit(gw))
        assert "received SIGINT" in gw.log_text()
        assert connect_refused(address(gw))


def test_in_flight_request_drains_after_sigterm_and_new_connections_are_refused(
    idp: DevIdP, tmp_path: Path
) -> None:
    with running(tmp_path, idp) as gw:
        session = login(gw, "bob")
        host, port = address(gw)
        with closing(socket.create_connection((host, port), timeout=IO_TIMEOUT)) as sock:
            # ``Expect: 100-continue`` makes the server confirm it has parsed the request head
            # and started the request before we signal, so the request is really in flight.
            sock.sendall(
                (
                    "POST /api/auth/logout HTTP/1.1\r\n"
                    f"Host: {host}:{port}\r\n"
                    f"Cookie: svc_session={session}\r\n"
                    "Content-Type: application/json\r\n"
                    "Content-Length: 2\r\n"
                    "Expect: 100-continue\r\n"
                    "\r\n"
                ).encode()
            )
            interim = b""
            while b"\r\n\r\n" not in interim:
                chunk = sock.recv(65536)
                assert chunk, interim
                interim += chunk
            assert interim.startswith(b"HTTP/1.1 100 "), interim

            gw.proc.send_signal(signal.SIGTERM)
            wait_for_log(gw, "received SIGTERM: draining")
            # The listener closes while the request is still being served: new connections
            # are refused, yet the process is alive because it is draining.
            wait_until_refused(gw)
            assert gw.proc.poll() is None, "the gateway exited with a request in flight"

            sock.sendall(b"{}")
            status, head = read_head(sock)
            assert status == 204, head
        # The client has closed its side; nothing else holds the daemon now.
        assert_clean_exit(gw, wait_exit(gw))

    with closing(sqlite3.connect(Path(gw.env["SVC_DATA_DIR"]) / "svcgate.db")) as conn:
        assert conn.execute("SELECT count(*) FROM sessions").fetchone()[0] == 0
        decisions = [row[0] for row in conn.execute("SELECT decision FROM audit ORDER BY id")]
    assert decisions == ["login", "logout"]


def test_sessions_and_view_as_survive_a_sigterm_restart(idp: DevIdP, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with running(tmp_path, idp, data_dir) as gw:
        bob = login(gw, "bob")
        carol = login(gw, "carol")
        alice = login(gw, "alice")
        with api(gw, carol) as client:
            carol_id = client.get("/api/me").json()["user"]["id"]
        with api(gw, alice) as client:
            response = client.post(
                "/api/admin/impersonate", json={"user_id": carol_id, "ttl_minutes": 30}
            )
            assert response.status_code == 204, response.text
        gw.proc.send_signal(signal.SIGTERM)
        assert_clean_exit(gw, wait_exit(gw))

    with running(tmp_path, idp, data_dir) as gw:
        with api(gw, bob) as client:
            me = client.get("/api/me")
        assert me.status_code == 200, me.text
        assert me.json()["user"]["email"] == "bob@example.test"
        with api(gw, alice) as client:
            me = client.get("/api/me")
            assert me.status_code == 200, me.text
            assert me.json()["impersonating"] is True
            assert me.json()["user"]["id"] == carol_id
            assert me.json()["real_user"]["email"] == "alice@example.test"
            # View-as restricts alice's audit view to carol's events.
            events = client.get("/api/audit", params={"limit": 200}).json()["events"]
        assert [e["decision"] for e in events] == ["impersonate_start", "login"]
        gw.proc.send_signal(signal.SIGTERM)
        assert_clean_exit(gw, wait_exit(gw))


def test_idle_keep_alive_connection_does_not_hold_up_shutdown(idp: DevIdP, tmp_path: Path) -> None:
    # Regression: quart-trio cancels the request as soon as the response is written; if that
    # cancellation lands inside hypercorn's end-of-response bookkeeping, the connection is
    # never marked idle and SIGTERM waits the whole graceful timeout for it.
    with running(tmp_path, idp) as gw:
        session = login(gw, "bob")
        host, port = address(gw)
        with closing(socket.create_connection((host, port), timeout=CLOSE_TIMEOUT)) as sock:
            sock.sendall(
                f"GET /api/me HTTP/1.1\r\nHost: {host}:{port}\r\nCookie: svc_session={session}"
                "\r\n\r\n".encode()
            )
            status, _ = read_head(sock)
            assert status == 200
            gw.proc.send_signal(signal.SIGTERM)
            # An idle connection has nothing to drain: the server closes it at once.
            try:
                while sock.recv(65536):
                    pass
            except ConnectionResetError:
                pass  # closed too
            except TimeoutError:
                pytest.fail("the server kept an idle connection open while shutting down")
        assert_clean_exit(gw, wait_exit(gw))


def test_connection_close_request_gets_its_connection_closed(idp: DevIdP, tmp_path: Path) -> None:
    # Same regression: the close that ``Connection: close`` asks for was skipped.
    with running(tmp_path, idp) as gw:
        host, port = address(gw)
        with closing(socket.create_connection((host, port), timeout=CLOSE_TIMEOUT)) as sock:
            sock.sendall(
                f"GET /api/me HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode()
            )
            received = b""
            try:
                while chunk := sock.recv(65536):
                    received += chunk
            except TimeoutError:
                pytest.fail(f"the server never closed the connection; received {received!r}")
        assert received.startswith(b"HTTP/1.1 401 ")


def test_a_group_readable_data_dir_is_tightened(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    gw = start_gateway(tmp_path, idp=None, data_dir=data)
    try:
        assert (data.stat().st_mode & 0o777) == 0o700
        assert ((data / "svcgate.db").stat().st_mode & 0o777) == 0o600
    finally:
        assert gw.stop() == 0
