"""Structured logs (svcgate.logs): the formats, the request id from the front to the sandbox's
stderr, rate-limited sandbox output, and no secret in any log line.

Unit tests first (formatters, redaction, format choice, context propagation under trio, the
stderr ring buffer); then real gateway processes whose stderr is the log under test.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
from data_plane_support import DataPlaneGateway, data_plane_gateway, text_of
from gateway_support import (
    ACCEPT,
    CLIENT_ID,
    Gateway,
    api,
    authorize,
    begin_login,
    finish_login,
    free_port,
    start_gateway,
)
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from process_support import public_tmpdir

from devidp.provider import DevIdP
from sandbox.stderr_log import StderrLog
from svcgate.logs import (
    REQUEST_ID,
    JsonFormatter,
    TextFormatter,
    choose_format,
    configure_logging,
    detach_request,
    echoing_request_id,
    redact,
    request_id_from_header,
)
from svcgate.settings import SettingsError, settings_from_env

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "stderr_server.py"
TS = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
HEX_ID = re.compile(r"[0-9a-f]{16}")


def record(msg: str, *args: object, exc: bool = False, **extra: Any) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            exc_info = sys.exc_info()
    rec = logging.LogRecord("svcgate.test", logging.INFO, __file__, 1, msg, args, exc_info)
    rec.__dict__.update(extra)
    return rec


# -- formatters -----------------------------------------------------------------------------------


def test_a_json_record_has_the_schema_fields_context_and_extras() -> None:
    token = REQUEST_ID.set("rid-1")
    try:
        line = JsonFormatter().format(
            record("%s took %d ms", "call", 7, profile="p", server="s", sandbox="sb", pid=9)
        )
    finally:
        REQUEST_ID.reset(token)
    assert "\n" not in line
    data = json.loads(line)
    assert re.fullmatch(TS, data.pop("ts"))
    assert data == {
        "level": "INFO",
        "logger": "svcgate.test",
        "msg": "call took 7 ms",
        "request_id": "rid-1",
        "profile": "p",
        "server": "s",
        "sandbox": "sb",
        "pid": 9,
    }
    assert list(data)[:5] == ["level", "logger", "msg", "request_id", "profile"]


def test_a_json_record_keeps_a_traceback_on_its_one_line() -> None:
    line = JsonFormatter().format(record("failed", exc=True))
    assert "\n" not in line
    data = json.loads(line)
    assert "request_id" not in data  # none outside a request
    assert data["exc"].startswith("Traceback") and "ValueError: boom" in data["exc"]


def test_a_record_naming_its_own_request_id_wins_over_the_context() -> None:
    token = REQUEST_ID.set("ambient")
    try:
        assert "request_id" not in json.loads(JsonFormatter().format(record("x", request_id=None)))
        both = json.loads(JsonFormatter().format(record("x", request_id=["a", "b"])))
        text = TextFormatter().format(record("x", request_id=["a", "b"]))
    finally:
        REQUEST_ID.reset(token)
    assert both["request_id"] == ["a", "b"]
    assert " [a,b] x" in text


def test_arguments_that_do_not_fit_the_format_do_not_break_the_line() -> None:
    data = json.loads(JsonFormatter().format(record("%d calls", "many")))
    assert data["msg"] == "%d calls [unformattable arguments]"


def test_text_is_time_level_logger_request_id_message_and_fields() -> None:
    token = REQUEST_ID.set("rid-2")
    try:
        line = TextFormatter().format(record("hello %s", "there", server="s", note="two words"))
    finally:
        REQUEST_ID.reset(token)
    assert re.fullmatch(
        TS + r' INFO svcgate\.test \[rid-2\] hello there server=s note="two words"', line
    )
    without = TextFormatter().format(record("plain"))
    assert re.fullmatch(TS + r" INFO svcgate\.test plain", without)


def test_text_escapes_control_characters_and_puts_the_traceback_below() -> None:
    line = TextFormatter().format(record("a\x1b[31mred\x07\nforged line", exc=True))
    first, *rest = line.split("\n")
    assert first.endswith("a\\x1b[31mred\\x07\\x0aforged line")
    assert rest[0].startswith("Traceback") and "ValueError: boom" in line


# -- redaction ------------------------------------------------------------------------------------

PROFILE_TOKEN = "svc_" + "Q" * 43


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        (f"Authorization: Bearer {PROFILE_TOKEN}", PROFILE_TOKEN),
        ("{'authorization': 'Basic dXNlcjpwYXNz'}", "dXNlcjpwYXNz"),
        ('"Proxy-Authorization": "Bearer opaque-value-1"', "opaque-value-1"),
        ("headers: bearer opaque.value~2", "opaque.value~2"),
        ("Cookie: svc_session=sess-value-3; svc_flow=flow-4", "sess-value-3"),
        ("Cookie: svc_session=sess-value-3; svc_flow=flow-4", "flow-4"),
        ("set svc_session=sess-value-5 for", "sess-value-5"),
        ("GET /api/auth/callback?code=code-value-6&state=state-7", "code-value-6"),
        ("GET /api/auth/callback?code=code-value-6&state=state-7", "state-7"),
        ('{"client_secret": "client-secret-8"}', "client-secret-8"),
        ("access_token=at-value-9&x=1", "at-value-9"),
        ("password: pw-value-10", "pw-value-10"),
        (f"the token is {PROFILE_TOKEN}.", PROFILE_TOKEN),
        ("id eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiIxMjM0NSJ9.c2lnbmF0dXJl", "eyJzdWIiOiIxMjM0NSJ9"),
        ("GITHUB_TOKEN=ghp_" + "a" * 36, "ghp_" + "a" * 36),
        ("key AKIAABCDEFGHIJKLMNOP", "AKIAABCDEFGHIJKLMNOP"),
    ],
)
def test_known_secret_shapes_are_masked(text: str, secret: str) -> None:
    masked = redact(text)
    assert secret not in masked
    assert "[REDACTED]" in masked
    assert secret not in JsonFormatter().format(record(text))
    assert secret not in TextFormatter().format(record("%s", text, detail=text))


@pytest.mark.parametrize(
    "text",
    [
        "tools/call echo: ok",
        "sandbox svcg1a2b3c-0f0f0f0f started for probe (profile p1): pid 77",
        "profile token rotated; progressToken=5; svc_session cookie is httpOnly",
        "received SIGTERM: draining in-flight requests",
    ],
)
def test_ordinary_lines_are_left_alone(text: str) -> None:
    assert redact(text) == text


# -- choosing the format --------------------------------------------------------------------------


def test_auto_is_json_only_when_stderr_is_the_journal_stream(tmp_path: Path) -> None:
    with (tmp_path / "stream").open("w") as stream, (tmp_path / "other").open("w") as other:
        st = os.fstat(stream.fileno())
        journal = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert choose_format("auto", stream, journal) == "json"
        assert choose_format("auto", other, journal) == "text"  # redirected under systemd
        assert choose_format("auto", stream, {}) == "text"
        assert choose_format("auto", stream, {"JOURNAL_STREAM": "junk"}) == "text"
        assert choose_format("text", stream, journal) == "text"
        assert choose_format("json", other, {}) == "json"
    leader, follower = os.openpty()
    try:
        with os.fdopen(follower, "w", closefd=False) as tty:
            assert tty.isatty()
            assert choose_format("auto", tty, {}) == "text"
    finally:
        os.close(leader)
        os.close(follower)


def test_the_format_setting_is_checked(tmp_path: Path) -> None:
    env = {"SVC_BEARER_TOKEN": "t" * 16, "SVC_DATA_DIR": str(tmp_path / "data")}
    assert settings_from_env(env).log_format == "auto"
    assert settings_from_env({**env, "SVC_LOG_FORMAT": "JSON"}).log_format == "json"
    with pytest.raises(SettingsError, match=r"^SVC_LOG_FORMAT: must be one of auto, json, text$"):
        settings_from_env({**env, "SVC_LOG_FORMAT": "xml"})


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """configure_logging() changes process-wide state: put pytest's back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    hook = sys.excepthook
    flags = (logging.logThreads, logging.logProcesses, logging.logMultiprocessing)
    srcfile = logging._srcfile
    try:
        yield
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        sys.excepthook = hook
        logging.captureWarnings(False)
        logging.logThreads, logging.logProcesses, logging.logMultiprocessing = flags
        logging._srcfile = srcfile


@pytest.mark.usefixtures("restored_logging")
def test_library_loggers_and_warnings_become_json_lines() -> None:
    stream = io.StringIO()
    assert configure_logging("INFO", fmt="json", stream=stream) == "json"
    logging.getLogger("hypercorn.error").info("Running on %s", "http://127.0.0.1:1")
    logging.getLogger("mcp.server.streamable_http").warning("from the SDK")
    logging.getLogger("svcgate.x").debug("below the level")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("deprecated thing", DeprecationWarning, stacklevel=1)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(x["logger"], x["level"]) for x in lines] == [
        ("hypercorn.error", "INFO"),
        ("mcp.server.streamable_http", "WARNING"),
        ("py.warnings", "WARNING"),
    ]
    assert lines[0]["msg"] == "Running on http://127.0.0.1:1"


# -- request ids ----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [b"abc", b"trace-1.2:3_x", b"A" * 64])
def test_a_plain_client_request_id_is_kept(value: bytes) -> None:
    assert request_id_from_header(value) == value.decode()


@pytest.mark.parametrize(
    "value", [None, b"", b"A" * 65, b"has space", b"new\nline", "caf\u00e9".encode(), b"a/b"]
)
def test_other_request_ids_are_replaced_by_random_ones(value: bytes | None) -> None:
    first, second = request_id_from_header(value), request_id_from_header(value)
    assert HEX_ID.fullmatch(first) and first != second


async def test_echoing_adds_the_header_without_touching_the_senders_list() -> None:
    shared = [(b"content-type", b"application/json")]
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    tagged = echoing_request_id(send, "rid-9")
    await tagged({"type": "http.response.start", "status": 200, "headers": shared})
    await tagged({"type": "http.response.body", "body": b"{}"})
    assert sent[0]["headers"] == [*shared, (b"x-request-id", b"rid-9")]
    assert shared == [(b"content-type", b"application/json")]
    assert sent[1] == {"type": "http.response.body", "body": b"{}"}


async def test_the_request_id_reaches_child_tasks_and_worker_threads() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("svcgate.test.context")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    seen: dict[str, str | None] = {}

    async def child() -> None:
        seen["child"] = REQUEST_ID.get()
        logger.info("in a child task")

    async def detached() -> None:
        detach_request()
        seen["detached"] = REQUEST_ID.get()

    def in_thread() -> None:
        seen["thread"] = REQUEST_ID.get()
        logger.info("in a worker thread")

    try:
        REQUEST_ID.set("rid-ctx")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(child)
            nursery.start_soon(detached)
        await trio.to_thread.run_sync(in_thread)
        seen["after"] = REQUEST_ID.get()
    finally:
        logger.removeHandler(handler)
    assert seen == {"child": "rid-ctx", "detached": None, "thread": "rid-ctx", "after": "rid-ctx"}
    ids = [json.loads(line)["request_id"] for line in stream.getvalue().splitlines()]
    assert ids == ["rid-ctx", "rid-ctx"]


# -- a sandbox's stderr ---------------------------------------------------------------------------


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def stderr_records() -> Iterator[list[logging.LogRecord]]:
    capture = Capture()
    logger = logging.getLogger("sandbox.stderr")
    old = logger.level
    logger.addHandler(capture)
    logger.setLevel(logging.INFO)
    try:
        yield capture.records
    finally:
        logger.removeHandler(capture)
        logger.setLevel(old)


def test_stderr_lines_are_tagged_with_the_requests_in_flight(
    stderr_records: list[logging.LogRecord],
) -> None:
    in_flight: list[str] = []
    log = StderrLog("p/s", "sb-1")
    log.annotate(profile="p", server="s")
    log.correlate(lambda: list(in_flight))
    log.feed(b"idle\n")
    in_flight.append("r1")
    log.feed(b"one\n")
    in_flight.append("r2")
    log.feed(b"two\npartial")
    in_flight.clear()
    log.flush()
    assert log.tail() == ["idle", "[rid=r1] one", "[rid=r1,r2] two", "partial"]
    assert [(r.getMessage(), r.__dict__["request_id"]) for r in stderr_records] == [
        ("idle", None),
        ("one", "r1"),
        ("two", ["r1", "r2"]),
        ("partial", None),
    ]
    assert {(r.__dict__["profile"], r.__dict__["server"], r.__dict__["sandbox"])
            for r in stderr_records} == {("p", "s", "sb-1")}  # fmt: skip


def test_a_noisy_sandbox_is_rate_limited_and_the_rest_is_counted(
    stderr_records: list[logging.LogRecord],
) -> None:
    now = [0.0]
    log = StderrLog("p/s", "sb-2", max_lines=50, rate=2.0, burst=3, clock=lambda: now[0])
    log.feed(b"".join(b"flood %d\n" % i for i in range(10)))
    assert [r.getMessage() for r in stderr_records] == ["flood 0", "flood 1", "flood 2"]
    now[0] += 1.0  # two more lines' worth
    log.feed(b"later 1\nlater 2\nlater 3\n")
    messages = [r.getMessage() for r in stderr_records[3:]]
    assert messages[0].startswith("7 stderr line(s) not logged")
    assert stderr_records[3].levelno == logging.WARNING
    assert stderr_records[3].__dict__["suppressed"] == 7
    assert messages[1:] == ["later 1", "later 2"]
    log.flush()  # EOF reports what is still held back
    assert stderr_records[-1].__dict__["suppressed"] == 1
    assert len(log.tail()) == 13  # the ring buffer keeps every line


def test_an_overlong_line_is_cut_in_the_log_but_kept_in_the_ring_buffer(
    stderr_records: list[logging.LogRecord],
) -> None:
    log = StderrLog("p/s", "sb-3")
    log.feed(b"x" * 5000 + b"\n")
    assert log.tail() == ["x" * 5000]
    message = stderr_records[0].getMessage()
    assert message.startswith("x" * 2000) and message.endswith("(3000 more chars)")


# -- a real gateway -------------------------------------------------------------------------------

CLIENT_SECRET = "oidc-client-secret-5d1c9a"
CREDENTIAL = "credential-canary-0b7e44f1"


def log_records(gw: Gateway) -> list[dict[str, Any]]:
    return [json.loads(line) for line in gw.log_text().splitlines() if line.strip()]


def wait_for_records(gw: Gateway, match: Any, count: int = 1, within: float = 10.0) -> list[Any]:
    """The JSON records for which ``match(record)`` holds, once there are ``count``."""
    deadline = time.monotonic() + within
    while True:
        found = [r for r in log_records(gw) if match(r)]
        if len(found) >= count:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{count} matching record(s) not logged; got {found}")
        time.sleep(0.05)


class Secrets:
    """Every secret the module's run handles, to look for in the log at the end."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def add(self, name: str, value: str) -> None:
        self.values[name] = value
        self.values[f"sha256({name})"] = hashlib.sha256(value.encode()).hexdigest()


@pytest.fixture(scope="module")
def own_idp() -> Iterator[DevIdP]:
    """A provider of our own: the gateway is a confidential client (with a secret) here."""
    provider = DevIdP(
        host="127.0.0.1", port=0, client_id=CLIENT_ID, client_secret=CLIENT_SECRET, test_hooks=True
    )
    provider.start()
    try:
        yield provider
    finally:
        provider.stop()


@pytest.fixture(scope="module")
def run_secrets() -> Secrets:
    return Secrets()


@pytest.fixture(scope="module")
def dp(
    own_idp: DevIdP, tmp_path_factory: pytest.TempPathFactory, run_secrets: Secrets
) -> Iterator[DataPlaneGateway]:
    stage = public_tmpdir("logs")
    (stage / "stderr_server.py").write_bytes(FIXTURE.read_bytes())
    (stage / "stderr_server.py").chmod(0o644)
    dest = "/opt/server/noisy/stderr_server.py"
    noisy = {
        "command": ["/usr/bin/python3", dest],
        "binds": [{"source": str(stage / "stderr_server.py"), "dest": dest}],
    }
    with data_plane_gateway(
        tmp_path_factory.mktemp("logs"),
        own_idp,
        extra_servers={"noisy": noisy},
        SVC_LOG_FORMAT="json",
        SVC_LOG_LEVEL="DEBUG",  # every library's records go where secrets are looked for
        SVC_OIDC_CLIENT_SECRET=CLIENT_SECRET,
    ) as gateway:
        run_secrets.add("client secret", CLIENT_SECRET)
        run_secrets.add("legacy bearer", gateway.gateway.env["SVC_BEARER_TOKEN"])
        run_secrets.add("admin session", gateway.admin_session)
        run_secrets.add("user session", gateway.user_session)
        yield gateway


@pytest.fixture(scope="module")
def profile(dp: DataPlaneGateway, run_secrets: Secrets) -> dict[str, Any]:
    created = dp.create_profile("logs-p", ["noisy"])
    run_secrets.add("profile token", created["token"])
    return created


def post(
    dp: DataPlaneGateway, profile: dict[str, Any], body: dict[str, Any], **headers: str
) -> httpx2.Response:
    with httpx2.Client(timeout=30.0) as client:
        return client.post(
            dp.endpoint(profile["slug"]),
            json=body,
            headers={
                "Authorization": f"Bearer {profile['token']}",
                "Accept": ACCEPT,
                **headers,
            },
        )


def open_session(
    dp: DataPlaneGateway, profile: dict[str, Any], capabilities: dict[str, Any]
) -> str:
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": capabilities,
            "clientInfo": {"name": "log-test", "version": "1"},
        },
    }
    response = post(dp, profile, init)
    assert response.status_code == 200, response.text
    session: str = response.headers["mcp-session-id"]
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert post(dp, profile, initialized, **{"Mcp-Session-Id": session}).status_code == 202
    return session


def call(
    dp: DataPlaneGateway,
    profile: dict[str, Any],
    session: str,
    tool: str,
    arguments: dict[str, Any],
    request_id: str | None = None,
) -> httpx2.Response:
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }
    headers = {"Mcp-Session-Id": session}
    if request_id is not None:
        headers["X-Request-Id"] = request_id
    response = post(dp, profile, body, **headers)
    assert response.status_code == 200, response.text
    return response


def sandbox_logs(dp: DataPlaneGateway, slug: str, server: str) -> str:
    env = {**dp.gateway.env, "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-m", "svcgate", "sandbox", "logs", slug, server],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("capabilities", [{}, {"sampling": {}}], ids=["fast-path", "sdk-path"])
def test_a_client_request_id_follows_the_call_into_the_sandbox_logs(
    dp: DataPlaneGateway, profile: dict[str, Any], capabilities: dict[str, Any]
) -> None:
    # A session that declares sampling takes the SDK's path; one that does not, the fast path.
    session = open_session(dp, profile, capabilities)
    rid = f"trace-{len(capabilities)}.a:b_c"
    text = f"hello from {rid}"
    response = call(dp, profile, session, "noisy_say", {"text": text}, rid)
    assert response.headers["x-request-id"] == rid
    assert text in response.text

    (relay,) = wait_for_records(
        dp.gateway, lambda r: r["logger"] == "svcgate.relay" and r.get("request_id") == rid
    )
    assert relay["profile"] == profile["slug"] and relay["server"] == "noisy"
    assert relay["method"] == "tools/call" and relay["tool"] == "say"
    assert relay["outcome"] == "ok" and relay["duration_ms"] >= 0
    assert relay["sandbox"].startswith("svcg") and relay["pid"] > 0
    assert text not in json.dumps(relay)  # no arguments, no result

    (line,) = wait_for_records(
        dp.gateway, lambda r: r["logger"] == "sandbox.stderr" and r["msg"] == f"said: {text}"
    )
    assert line["request_id"] == rid
    assert (line["profile"], line["server"], line["sandbox"]) == (
        profile["slug"],
        "noisy",
        relay["sandbox"],
    )
    assert f"[rid={rid}] said: {text}" in sandbox_logs(dp, profile["slug"], "noisy")


async def test_the_sdk_client_on_the_stateless_revision_carries_its_id_too(
    dp: DataPlaneGateway, profile: dict[str, Any]
) -> None:
    headers = {"Authorization": f"Bearer {profile['token']}", "X-Request-Id": "modern-1"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0)) as http:
        transport = streamable_http_client(dp.endpoint(profile["slug"]), http_client=http)
        async with Client(transport, mode="2026-07-28") as client:
            with trio.fail_after(30):
                result = await client.call_tool("noisy_say", {"text": "modern words"})
    assert text_of(result) == "modern words"
    (relay,) = wait_for_records(
        dp.gateway, lambda r: r["logger"] == "svcgate.relay" and r.get("request_id") == "modern-1"
    )
    assert relay["tool"] == "say" and relay["outcome"] == "ok"
    (line,) = wait_for_records(dp.gateway, lambda r: r["msg"] == "said: modern words")
    assert line["request_id"] == "modern-1"


def test_a_line_written_during_several_calls_names_every_one(
    dp: DataPlaneGateway, profile: dict[str, Any]
) -> None:
    session = open_session(dp, profile, {})

    async def both() -> None:
        async def one(rid: str) -> None:
            await trio.to_thread.run_sync(
                lambda: call(
                    dp, profile, session, "noisy_together", {"text": "pair", "parties": 2}, rid
                )
            )

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(one, "pair-a")
                nursery.start_soon(one, "pair-b")

    trio.run(both)
    (line,) = wait_for_records(
        dp.gateway, lambda r: r["logger"] == "sandbox.stderr" and r["msg"] == "together: pair"
    )
    assert sorted(line["request_id"]) == ["pair-a", "pair-b"]
    tagged = [x for x in sandbox_logs(dp, profile["slug"], "noisy").splitlines() if "pair" in x]
    assert tagged in (
        ["[rid=pair-a,pair-b] together: pair"],
        ["[rid=pair-b,pair-a] together: pair"],
    )
    # The startup line came with no call in flight.
    (ready,) = wait_for_records(dp.gateway, lambda r: r["msg"] == "stderr-fixture: ready")
    assert "request_id" not in ready


def test_a_malformed_request_id_is_replaced_on_every_surface(
    dp: DataPlaneGateway, profile: dict[str, Any]
) -> None:
    bad = "bad id with spaces"
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {"sampling": {}},
            "clientInfo": {"name": "log-test", "version": "1"},
        },
    }
    streamed = post(dp, profile, init, **{"X-Request-Id": bad})  # the SDK's event stream
    assert streamed.headers["content-type"].startswith("text/event-stream")
    with httpx2.Client(base_url=dp.url, timeout=30.0) as client:
        responses = [
            streamed,
            client.post("/mcp/p/nobody", json={}, headers={"X-Request-Id": bad}),  # 401
            client.get("/api/me", headers={"X-Request-Id": "x" * 65}),  # control plane, 401
            client.get("/api/nothing-here", headers={"X-Request-Id": "caf\u00e9".encode()}),
        ]
    ids = [r.headers["x-request-id"] for r in responses]
    assert all(HEX_ID.fullmatch(i) for i in ids) and len(set(ids)) == len(ids), ids
    with api(dp.gateway, dp.user_session) as client:
        me = client.get("/api/me", headers={"X-Request-Id": "ui-42"})
    assert me.status_code == 200 and me.headers["x-request-id"] == "ui-42"
    assert bad not in dp.gateway.log_text()


def test_a_flooding_server_is_rate_limited_in_the_log(
    dp: DataPlaneGateway, profile: dict[str, Any]
) -> None:
    session = open_session(dp, profile, {})
    call(dp, profile, session, "noisy_say", {"text": "flood", "lines": 1000}, "flood-1")

    def suppressed(r: dict[str, Any]) -> bool:
        return r["logger"] == "sandbox.stderr" and "suppressed" in r

    # The count is logged with the next line that passes: send lines until it shows.
    deadline = time.monotonic() + 20
    while not any(suppressed(r) for r in log_records(dp.gateway)):
        assert time.monotonic() < deadline, "no suppressed-lines record"
        call(dp, profile, session, "noisy_say", {"text": "after"}, "flood-2")
    records = log_records(dp.gateway)
    logged = [r for r in records if r.get("msg") == "said: flood"]
    held = sum(r["suppressed"] for r in records if suppressed(r))
    assert 0 < len(logged) < 1000
    assert len(logged) + held == 1000
    assert all(r["request_id"] == "flood-1" for r in logged)


def test_the_whole_run_is_json_lines_without_a_secret(
    dp: DataPlaneGateway, profile: dict[str, Any], run_secrets: Secrets
) -> None:
    gw = dp.gateway
    # A sign-in whose code and state we know, a credential, the legacy token, misplaced ones.
    flow, url = begin_login(gw)
    callback = authorize(url, "carol")
    query = dict(part.split("=", 1) for part in callback.split("?", 1)[1].split("&"))
    result = finish_login(gw, callback, flow)
    assert result.response.status_code == 302 and result.session
    run_secrets.add("oidc code", query["code"])
    run_secrets.add("oidc state", query["state"])
    run_secrets.add("flow cookie", flow)
    run_secrets.add("carol session", result.session)
    with api(gw, result.session) as client:
        put = client.put(
            "/api/credentials/noisy",
            json={"secret": CREDENTIAL, "allowed_hosts": ["api.example.com"]},
            headers={"Origin": gw.origin},
        )
        assert put.status_code == 204, put.text
    run_secrets.add("credential", CREDENTIAL)
    with gw.client() as client:
        # The legacy token is checked, then the unknown session ends the request (404).
        legacy = {"Authorization": f"Bearer {gw.env['SVC_BEARER_TOKEN']}", "Mcp-Session-Id": "0"}
        assert client.get("/mcp", headers=legacy).status_code == 404
        # A session cookie is no data-plane credential (401), nor a profile token in a query.
        cookie = {"Cookie": f"svc_session={result.session}"}
        assert client.post(dp.endpoint(profile["slug"]), json={}, headers=cookie).status_code == 401
        query = {"access_token": profile["token"]}
        assert client.post(dp.endpoint(profile["slug"]), json={}, params=query).status_code == 401
    key_file = Path(gw.env["SVC_DATA_DIR"]) / "vault.key"
    for n, line in enumerate(key_file.read_text().splitlines()):
        for value in json.loads(line).values():
            if isinstance(value, str) and len(value) >= 16:
                run_secrets.add(f"vault key {n}", value)

    assert gw.stop() == 0
    text = gw.log_text()
    records = [json.loads(line) for line in text.splitlines()]  # every line is one object
    assert all({"ts", "level", "logger", "msg"} <= r.keys() for r in records)
    assert all(re.fullmatch(TS, r["ts"]) for r in records)
    messages = [r["msg"] for r in records]
    assert any(m.startswith("sandbox supervisor ready") for m in messages)  # start
    assert any(r["logger"] == "svcgate.relay" for r in records)  # requests
    assert messages[-1] == "svcgate stopped"  # shutdown
    assert any("user" in m and "signed in" in m for m in messages)
    leaked = [name for name, value in run_secrets.values.items() if value in text]
    assert not leaked, leaked


# -- the format by environment --------------------------------------------------------------------


def own_sandbox_dir() -> dict[str, str]:
    return {"SVC_SANDBOX_DIR": str(public_tmpdir("logs-sb") / "state")}


def test_auto_format_is_json_into_the_journal_and_text_elsewhere(tmp_path: Path) -> None:
    port = free_port()
    log_path = tmp_path / f"gateway-{port}.log"
    log_path.touch()
    st = log_path.stat()
    journal = start_gateway(
        tmp_path,
        idp=None,
        port=port,
        extra_env={"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}", **own_sandbox_dir()},
    )
    with journal.client() as client:
        refused = client.get("/", headers={"Authorization": "Bearer wrong", "X-Request-Id": "a-1"})
    assert (refused.status_code, refused.headers["x-request-id"]) == (401, "a-1")
    assert journal.stop() == 0
    records = log_records(journal)
    assert records and all(re.fullmatch(TS, r["ts"]) for r in records)

    (tmp_path / "text").mkdir()
    text = start_gateway(tmp_path / "text", idp=None, extra_env=own_sandbox_dir())
    # The legacy bundle (SVC_ECHO_BIN=/bin/true) cannot start: logged while serving txt-1.
    legacy = {"Authorization": f"Bearer {text.env['SVC_BEARER_TOKEN']}", "X-Request-Id": "txt-1"}
    with text.client() as client:
        client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers=legacy)
    assert text.stop() == 0
    lines = [x for x in text.log_text().splitlines() if x.strip()]
    assert lines and not any(x.startswith("{") for x in lines)
    assert all(re.match(TS + r" (DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+ ", x) for x in lines)
    assert any(" [txt-1] " in x for x in lines)  # a record made while serving that request
