"""Downstream: the JSON-RPC multiplexer over one MCP stdio server's streams.

First against a scripted fake server over trio memory streams (ids, interleaving, progress,
cancellation in both directions, broken peers), then against the real stdlib probe server
(``tests/fixtures/probe_server.py``) run as a process with Debian's ``/usr/bin/python3``.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from svcgate.downstream import Downstream, DownstreamError, DownstreamGone

PROBE = Path(__file__).resolve().parents[1] / "fixtures" / "probe_server.py"
SYSTEM_PYTHON = "/usr/bin/python3"
WAIT = 10  # seconds: the bound on every wait in this module

Handler = Callable[[str, dict[str, Any] | None, list[Any]], Awaitable[dict[str, Any]]]


class RecordingHooks:
    """Hooks that record notifications on a channel and answer requests with ``handler``."""

    def __init__(self, handler: Handler | None = None) -> None:
        self.handler = handler
        self._send, self._receive = trio.open_memory_channel[tuple[str, Any, list[Any]]](math.inf)

    async def on_notification(
        self, method: str, params: dict[str, Any] | None, contexts: list[Any]
    ) -> None:
        self._send.send_nowait((method, params, list(contexts)))

    async def on_request(
        self, method: str, params: dict[str, Any] | None, contexts: list[Any]
    ) -> dict[str, Any]:
        if self.handler is None:
            raise DownstreamError.method_not_found(method)
        return await self.handler(method, params, contexts)

    async def next_notification(self) -> tuple[str, Any, list[Any]]:
        with trio.fail_after(WAIT):
            return await self._receive.receive()


class Peer:
    """The server's end of the connection, scripted by the test."""

    def __init__(self, send: trio.abc.SendStream, receive: trio.abc.ReceiveStream) -> None:
        self.send_stream = send
        self.receive_stream = receive
        self.buffer = bytearray()
        self.lines: list[bytes] = []

    async def receive_line(self) -> bytes | None:
        with trio.fail_after(WAIT):
            while b"\n" not in self.buffer:
                data = await self.receive_stream.receive_some()
                if not data:
                    return None
                self.buffer += data
        line, _, rest = self.buffer.partition(b"\n")
        self.buffer = bytearray(rest)
        self.lines.append(bytes(line))
        return bytes(line)

    async def receive(self) -> dict[str, Any]:
        line = await self.receive_line()
        assert line is not None, "the downstream closed its side"
        message = json.loads(line)
        assert isinstance(message, dict)
        return message

    async def send(self, message: dict[str, Any] | list[Any] | bytes) -> None:
        data = message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n"
        await self.send_stream.send_all(data)

    async def answer(self, request_id: Any, result: dict[str, Any]) -> None:
        await self.send({"jsonrpc": "2.0", "id": request_id, "result": result})


class Background:
    """A call running in its own task and cancel scope, with its outcome kept."""

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.done = trio.Event()
        self.value: Any = None
        self.error: Exception | None = None

    async def wait(self) -> Any:
        with trio.fail_after(WAIT):
            await self.done.wait()
        if self.error is not None:
            raise self.error
        return self.value

    async def wait_error(self) -> Exception:
        with trio.fail_after(WAIT):
            await self.done.wait()
        assert self.error is not None, f"expected an error, got {self.value!r}"
        return self.error


def in_background(
    nursery: trio.Nursery, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any
) -> Background:
    call = Background()

    async def runner() -> None:
        with call.scope:
            try:
                call.value = await fn(*args, **kwargs)
            except Exception as exc:
                call.error = exc
        call.done.set()

    nursery.start_soon(runner)
    return call


@dataclass
class Harness:
    downstream: Downstream
    peer: Peer
    hooks: RecordingHooks
    nursery: trio.Nursery
    run_returned: trio.Event

    def request(self, method: str, params: Any = None, **kwargs: Any) -> Background:
        return in_background(self.nursery, self.downstream.request, method, params, **kwargs)


async def _run(downstream: Downstream, returned: trio.Event, *, task_status: Any) -> None:
    await downstream.run(task_status=task_status)
    returned.set()  # only on a normal return


@asynccontextmanager
async def connected(
    hooks: RecordingHooks | None = None,
    *,
    streams: tuple[Any, Any, Any, Any] | None = None,
    **options: Any,
) -> AsyncIterator[Harness]:
    """A Downstream running against a fake server; streams = (ds send, ds recv, peer...)."""
    if streams is None:
        client, server = trio.testing.memory_stream_pair()
        streams = (client, client, server, server)
    ds_send, ds_receive, peer_send, peer_receive = streams
    hooks = hooks or RecordingHooks()
    downstream = Downstream("fake", ds_send, ds_receive, hooks, **options)
    returned = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(_run, downstream, returned)
        yield Harness(downstream, Peer(peer_send, peer_receive), hooks, nursery, returned)
        nursery.cancel_scope.cancel()


def _progress(token: Any, progress: int, total: int = 2) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {"progressToken": token, "progress": progress, "total": total},
    }


async def _assert_gone(h: Harness) -> None:
    with trio.fail_after(WAIT):
        await h.run_returned.wait()
    assert h.downstream.closed.is_set()
    assert not h.downstream.alive
    with pytest.raises(DownstreamGone):
        await h.downstream.request("tools/list", None)
    with pytest.raises(DownstreamGone):
        await h.downstream.notify("notifications/roots/list_changed", None)


# -- requests and answers -----------------------------------------------------------------


async def test_requests_get_fresh_integer_ids_and_results_come_back_raw() -> None:
    async with connected() as h:
        first = h.request("tools/list", None)
        message = await h.peer.receive()
        assert message == {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        assert h.peer.lines[-1] == b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}'
        raw = {"tools": [{"name": "x", "vendorExtra": {"kept": [1, 2]}}], "nextCursor": None}
        await h.peer.answer(1, raw)
        assert await first.wait() == raw

        second = h.request("tools/call", {"name": "echo", "arguments": {"text": "é"}})
        message = await h.peer.receive()
        assert message["id"] == 2
        assert message["params"] == {"name": "echo", "arguments": {"text": "é"}}
        assert "é".encode() in h.peer.lines[-1]  # ensure_ascii=False: UTF-8 on the wire
        await h.peer.answer(2, {"content": []})
        assert await second.wait() == {"content": []}


async def test_concurrent_requests_answered_out_of_order_reach_their_callers() -> None:
    async with connected() as h:
        calls = [h.request("tools/call", {"n": n}) for n in range(6)]
        received = [await h.peer.receive() for _ in calls]
        assert sorted(m["id"] for m in received) == list(range(1, 7))
        for message in reversed(received):
            await h.peer.answer(message["id"], {"n": message["params"]["n"]})
        assert [await call.wait() for call in calls] == [{"n": n} for n in range(6)]


async def test_many_concurrent_writes_are_serialised() -> None:
    # Memory streams raise BusyResourceError on overlapping send_all, like real pipes.
    async with connected() as h:
        calls = [h.request("ping", {"i": i}) for i in range(50)]
        for _ in calls:
            message = await h.peer.receive()
            await h.peer.answer(message["id"], {"i": message["params"]["i"]})
        assert [await call.wait() for call in calls] == [{"i": i} for i in range(50)]


async def test_error_answer_raises_downstream_error_with_code_message_and_data() -> None:
    async with connected() as h:
        call = h.request("resources/read", {"uri": "x://nope"})
        message = await h.peer.receive()
        error = {"code": -32002, "message": "Resource not found", "data": {"uri": "x://nope"}}
        await h.peer.send({"jsonrpc": "2.0", "id": message["id"], "error": error})
        exc = await call.wait_error()
        assert isinstance(exc, DownstreamError)
        assert (exc.code, exc.message, exc.data) == (-32002, "Resource not found", error["data"])
        assert h.downstream.alive


@pytest.mark.parametrize(
    "answer",
    [{"result": [1, 2]}, {"result": None}, {"error": "boom"}, {}],
    ids=["list-result", "null-result", "string-error", "neither"],
)
async def test_malformed_answer_fails_only_that_request(answer: dict[str, Any]) -> None:
    async with connected() as h:
        call = h.request("tools/list")
        message = await h.peer.receive()
        await h.peer.send({"jsonrpc": "2.0", "id": message["id"], **answer})
        exc = await call.wait_error()
        assert isinstance(exc, DownstreamError)
        assert exc.code == -32603
        assert h.downstream.alive


async def test_answers_with_unknown_ids_are_ignored(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="svcgate.downstream")
    async with connected() as h:
        call = h.request("tools/list")
        message = await h.peer.receive()
        await h.peer.answer(999, {"stray": True})
        await h.peer.answer(str(message["id"]), {"wrong": "type"})
        await h.peer.send({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "x"}})
        await h.peer.answer(message["id"], {"right": True})
        assert await call.wait() == {"right": True}
    assert any("unknown id 999" in r.getMessage() for r in caplog.records)


async def test_batched_answers_are_delivered() -> None:
    async with connected() as h:
        calls = [h.request("a"), h.request("b")]
        received = [await h.peer.receive() for _ in calls]
        batch = [{"jsonrpc": "2.0", "id": m["id"], "result": {"m": m["method"]}} for m in received]
        await h.peer.send(batch)
        assert [await c.wait() for c in calls] == [{"m": "a"}, {"m": "b"}]


async def test_lone_surrogates_in_params_are_sent_escaped() -> None:
    async with connected() as h:
        call = h.request("tools/call", {"text": "a\ud800b"})
        message = await h.peer.receive()
        assert message["params"]["text"] == "a\ud800b"
        await h.peer.answer(message["id"], {})
        assert await call.wait() == {}


# -- progress -------------------------------------------------------------------------------


async def test_progress_token_is_rewritten_and_restored_for_the_caller() -> None:
    async with connected() as h:
        seen: list[dict[str, Any]] = []

        async def on_progress(params: dict[str, Any]) -> None:
            seen.append(params)

        params = {"name": "slow", "_meta": {"progressToken": "client-7", "other": 1}}
        before = copy.deepcopy(params)
        call = h.request("tools/call", params, on_progress=on_progress)
        message = await h.peer.receive()
        token = message["params"]["_meta"]["progressToken"]
        assert token != "client-7"
        assert message["params"]["_meta"]["other"] == 1
        assert params == before  # the caller's dicts are not mutated

        await h.peer.send(_progress(token, 1))
        await h.peer.send(_progress(token, 2))
        await h.peer.answer(message["id"], {"done": True})
        assert await call.wait() == {"done": True}
        assert seen == [
            {"progressToken": "client-7", "progress": 1, "total": 2},
            {"progressToken": "client-7", "progress": 2, "total": 2},
        ]


async def test_same_client_token_on_two_requests_gets_two_gateway_tokens() -> None:
    async with connected() as h:
        seen: dict[str, list[int]] = {"a": [], "b": []}

        def recorder(key: str) -> Callable[[dict[str, Any]], Awaitable[None]]:
            async def on_progress(params: dict[str, Any]) -> None:
                assert params["progressToken"] == "same"
                seen[key].append(params["progress"])

            return on_progress

        meta = {"_meta": {"progressToken": "same"}}
        call_a = h.request("tools/call", meta, on_progress=recorder("a"))
        first = await h.peer.receive()
        call_b = h.request("tools/call", meta, on_progress=recorder("b"))
        second = await h.peer.receive()
        token_a = first["params"]["_meta"]["progressToken"]
        token_b = second["params"]["_meta"]["progressToken"]
        assert token_a != token_b
        await h.peer.send(_progress(token_b, 1))
        await h.peer.send(_progress(token_a, 5))
        await h.peer.send(_progress(token_b, 2))
        await h.peer.answer(first["id"], {})
        await h.peer.answer(second["id"], {})
        await call_a.wait()
        await call_b.wait()
        assert seen == {"a": [5], "b": [1, 2]}


async def test_slow_progress_consumer_does_not_block_other_requests() -> None:
    async with connected() as h:
        release = trio.Event()
        got: list[Any] = []

        async def slow(params: dict[str, Any]) -> None:
            got.append(params["progress"])
            await release.wait()

        slow_call = h.request("tools/call", {"_meta": {"progressToken": 1}}, on_progress=slow)
        slow_message = await h.peer.receive()
        await h.peer.send(_progress(slow_message["params"]["_meta"]["progressToken"], 1))
        other = h.request("tools/list")
        other_message = await h.peer.receive()
        await h.peer.answer(other_message["id"], {"fast": True})
        assert await other.wait() == {"fast": True}
        assert not slow_call.done.is_set()
        release.set()
        await h.peer.answer(slow_message["id"], {"slow": True})
        assert await slow_call.wait() == {"slow": True}
        assert got == [1]


async def test_no_progress_token_is_added_when_the_caller_had_none() -> None:
    async def on_progress(params: dict[str, Any]) -> None:
        raise AssertionError("no progress expected")

    async with connected() as h:
        with_params = h.request("tools/call", {"name": "x"}, on_progress=on_progress)
        message = await h.peer.receive()
        assert message["params"] == {"name": "x"}
        await h.peer.answer(message["id"], {})
        await with_params.wait()

        without = h.request("tools/list", None, on_progress=on_progress)
        message = await h.peer.receive()
        assert "params" not in message
        await h.peer.answer(message["id"], {})
        await without.wait()


async def test_caller_token_passes_through_without_on_progress() -> None:
    async with connected() as h:
        call = h.request("tools/call", {"_meta": {"progressToken": "abc"}}, context="session-1")
        message = await h.peer.receive()
        assert message["params"]["_meta"]["progressToken"] == "abc"
        await h.peer.send(_progress("abc", 1))
        method, params, contexts = await h.hooks.next_notification()
        assert method == "notifications/progress"
        assert params["progressToken"] == "abc"
        assert contexts == ["session-1"]
        await h.peer.answer(message["id"], {})
        await call.wait()


# -- cancellation by the caller --------------------------------------------------------------


async def test_cancelled_caller_sends_notifications_cancelled_and_ids_are_not_reused() -> None:
    async with connected() as h:
        call = h.request("tools/call", {"name": "slow"})
        message = await h.peer.receive()
        call.scope.cancel()
        notice = await h.peer.receive()
        assert notice == {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": message["id"], "reason": "cancelled by the client"},
        }
        with trio.fail_after(WAIT):
            await call.done.wait()
        assert call.scope.cancelled_caught
        assert call.error is None

        await h.peer.answer(message["id"], {"late": True})  # ignored
        following = h.request("tools/list")
        next_message = await h.peer.receive()
        assert next_message["id"] == message["id"] + 1
        await h.peer.answer(next_message["id"], {"ok": 1})
        assert await following.wait() == {"ok": 1}


async def test_a_write_under_way_completes_before_the_cancellation_is_announced() -> None:
    # Lockstep: send_all blocks until the peer reads. Cutting the line would corrupt the pipe.
    ds_send, peer_receive = trio.testing.lockstep_stream_one_way_pair()
    peer_send, ds_receive = trio.testing.memory_stream_one_way_pair()
    async with connected(streams=(ds_send, ds_receive, peer_send, peer_receive)) as h:
        big = "x" * 300_000
        call = h.request("tools/call", {"text": big})
        await trio.testing.wait_all_tasks_blocked()
        call.scope.cancel()
        message = await h.peer.receive()
        assert message["params"]["text"] == big
        notice = await h.peer.receive()
        assert notice["method"] == "notifications/cancelled"
        assert notice["params"]["requestId"] == message["id"]
        with trio.fail_after(WAIT):
            await call.done.wait()
        assert call.scope.cancelled_caught


# -- server to client -----------------------------------------------------------------------


async def test_server_request_is_answered_by_the_hook_with_contexts_oldest_first() -> None:
    seen: list[tuple[str, Any, list[Any]]] = []

    async def handler(method: str, params: Any, contexts: list[Any]) -> dict[str, Any]:
        seen.append((method, params, contexts))
        return {"role": "assistant", "content": {"type": "text", "text": "hi"}, "model": "m"}

    async with connected(RecordingHooks(handler)) as h:
        calls, ids = [], []
        for n, context in enumerate(["session-A", None, "session-B"]):
            calls.append(h.request("tools/call", {"n": n}, context=context))
            ids.append((await h.peer.receive())["id"])  # one at a time: a known order
        request = {"messages": [], "maxTokens": 5}
        await h.peer.send(
            {"jsonrpc": "2.0", "id": "s-1", "method": "sampling/createMessage", "params": request}
        )
        reply = await h.peer.receive()
        assert reply == {
            "jsonrpc": "2.0",
            "id": "s-1",
            "result": {
                "role": "assistant",
                "content": {"type": "text", "text": "hi"},
                "model": "m",
            },
        }
        assert seen == [("sampling/createMessage", request, ["session-A", "session-B"])]
        for request_id in ids:
            await h.peer.answer(request_id, {})
        for call in calls:
            await call.wait()


async def test_unhandled_server_request_is_answered_method_not_found() -> None:
    async with connected() as h:
        await h.peer.send({"jsonrpc": "2.0", "id": 4, "method": "elicitation/create"})
        reply = await h.peer.receive()
        assert reply["id"] == 4
        assert reply["error"]["code"] == -32601


async def test_hook_errors_become_jsonrpc_errors(caplog: pytest.LogCaptureFixture) -> None:
    async def handler(method: str, params: Any, contexts: list[Any]) -> dict[str, Any]:
        if method == "roots/list":
            raise DownstreamError(-32000, "denied", {"why": "policy"})
        if method == "bad/result":
            return ["not", "a", "dict"]  # type: ignore[return-value]  # a buggy hook
        raise RuntimeError("secret detail")

    async with connected(RecordingHooks(handler)) as h:
        await h.peer.send({"jsonrpc": "2.0", "id": 1, "method": "roots/list"})
        reply = await h.peer.receive()
        assert reply["error"] == {"code": -32000, "message": "denied", "data": {"why": "policy"}}

        await h.peer.send({"jsonrpc": "2.0", "id": 2, "method": "sampling/createMessage"})
        reply = await h.peer.receive()
        assert reply == {
            "jsonrpc": "2.0",
            "id": 2,
            "error": {"code": -32603, "message": "internal error"},
        }
        assert "secret detail" not in h.peer.lines[-1].decode()

        await h.peer.send({"jsonrpc": "2.0", "id": 3, "method": "bad/result"})
        reply = await h.peer.receive()
        assert reply["error"]["code"] == -32603
    failures = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert any(r.exc_info and "secret detail" in str(r.exc_info[1]) for r in failures)


async def test_ping_from_the_server_is_answered_without_the_hooks() -> None:
    async with connected() as h:  # the default hooks would answer -32601
        await h.peer.send({"jsonrpc": "2.0", "id": "p-1", "method": "ping"})
        assert await h.peer.receive() == {"jsonrpc": "2.0", "id": "p-1", "result": {}}


async def test_server_cancellation_cancels_the_hook_and_no_answer_is_sent() -> None:
    entered = trio.Event()
    cancelled = trio.Event()

    async def handler(method: str, params: Any, contexts: list[Any]) -> dict[str, Any]:
        entered.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled.set()
            raise
        raise AssertionError("unreachable")

    async with connected(RecordingHooks(handler)) as h:
        await h.peer.send({"jsonrpc": "2.0", "id": 7, "method": "sampling/createMessage"})
        with trio.fail_after(WAIT):
            await entered.wait()
        await h.peer.send(
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}}
        )
        with trio.fail_after(WAIT):
            await cancelled.wait()
        await h.peer.send({"jsonrpc": "2.0", "id": 8, "method": "ping"})
        assert await h.peer.receive() == {"jsonrpc": "2.0", "id": 8, "result": {}}
        assert h.downstream.alive


async def test_a_slow_hook_does_not_block_the_reader() -> None:
    release = trio.Event()

    async def handler(method: str, params: Any, contexts: list[Any]) -> dict[str, Any]:
        await release.wait()
        return {"late": True}

    async with connected(RecordingHooks(handler)) as h:
        call = h.request("tools/list")
        message = await h.peer.receive()
        await h.peer.send({"jsonrpc": "2.0", "id": "s-1", "method": "roots/list"})
        await h.peer.answer(message["id"], {"tools": []})
        assert await call.wait() == {"tools": []}
        release.set()
        assert await h.peer.receive() == {"jsonrpc": "2.0", "id": "s-1", "result": {"late": True}}


async def test_duplicate_server_request_id_is_refused() -> None:
    release = trio.Event()

    async def handler(method: str, params: Any, contexts: list[Any]) -> dict[str, Any]:
        await release.wait()
        return {}

    async with connected(RecordingHooks(handler)) as h:
        await h.peer.send({"jsonrpc": "2.0", "id": 1, "method": "roots/list"})
        await h.peer.send({"jsonrpc": "2.0", "id": 1, "method": "roots/list"})
        reply = await h.peer.receive()
        assert reply["error"]["code"] == -32600
        release.set()
        assert await h.peer.receive() == {"jsonrpc": "2.0", "id": 1, "result": {}}


async def test_server_requests_with_unusable_ids_are_refused() -> None:
    async with connected() as h:
        await h.peer.send({"jsonrpc": "2.0", "id": [1], "method": "roots/list"})
        reply = await h.peer.receive()
        assert reply["id"] is None
        assert reply["error"]["code"] == -32600
        cancel = {"requestId": {"x": 1}}
        await h.peer.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel})
        await h.peer.send({"jsonrpc": "2.0", "id": 2, "method": "ping"})
        assert await h.peer.receive() == {"jsonrpc": "2.0", "id": 2, "result": {}}
        assert h.downstream.alive


async def test_a_hook_result_that_is_not_json_is_answered_internal_error() -> None:
    async def handler(method: str, params: Any, contexts: list[Any]) -> dict[str, Any]:
        return {"not json": object()}

    async with connected(RecordingHooks(handler)) as h:
        await h.peer.send({"jsonrpc": "2.0", "id": 1, "method": "roots/list"})
        reply = await h.peer.receive()
        assert reply == {
            "jsonrpc": "2.0",
            "id": 1,
            "error": {"code": -32603, "message": "internal error"},
        }
        assert h.downstream.alive


async def test_notifications_reach_the_hook_in_order_with_contexts() -> None:
    async with connected() as h:
        call = h.request("tools/call", {}, context="ctx")
        message = await h.peer.receive()
        for i in range(5):
            await h.peer.send(
                {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": i}}
            )
        await h.peer.send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        for i in range(5):
            assert await h.hooks.next_notification() == (
                "notifications/message",
                {"data": i},
                ["ctx"],
            )
        assert await h.hooks.next_notification() == (
            "notifications/tools/list_changed",
            None,
            ["ctx"],
        )
        await h.peer.answer(message["id"], {})
        await call.wait()


async def test_a_failing_notification_hook_is_logged_and_reading_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Failing(RecordingHooks):
        async def on_notification(self, method: str, params: Any, contexts: list[Any]) -> None:
            raise RuntimeError("hook bug")

    async with connected(Failing()) as h:
        call = h.request("tools/list")
        message = await h.peer.receive()
        await h.peer.send({"jsonrpc": "2.0", "method": "notifications/message"})
        await h.peer.answer(message["id"], {"ok": True})
        assert await call.wait() == {"ok": True}
    assert any(r.exc_info and "hook bug" in str(r.exc_info[1]) for r in caplog.records)


# -- broken peers and the end of the connection ---------------------------------------------


@pytest.mark.parametrize(
    "chunks",
    [
        [b"x" * 2000],
        [b'{"jsonrpc":"2.0","method":"n","params":{"p":"' + b"y" * 2000 + b'"}}\n'],
        [b"z" * 600, b"z" * 600, b"z" * 600],
    ],
    ids=["one-chunk-no-newline", "complete-long-line", "growing-without-newline"],
)
async def test_a_line_over_max_line_ends_the_connection(chunks: list[bytes]) -> None:
    async with connected(max_line=1024) as h:
        call = h.request("tools/list")
        await h.peer.receive()
        for chunk in chunks:
            await h.peer.send(chunk)
        assert isinstance(await call.wait_error(), DownstreamGone)
        await _assert_gone(h)


async def test_garbage_lines_are_logged_truncated_and_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with connected() as h:
        call = h.request("tools/list")
        message = await h.peer.receive()
        await h.peer.send(b"not json " + b"g" * 500 + b"\n")
        await h.peer.send(b"\xff\xfe\n")
        await h.peer.send(b"[" * 100_000 + b"\n")
        await h.peer.send(b"42\n")
        await h.peer.answer(message["id"], {"ok": True})
        assert await call.wait() == {"ok": True}
        assert h.downstream.alive
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    garbage = [w for w in warnings if "not json" in w]
    assert len(garbage) == 1
    assert "g" * 150 in garbage[0]
    assert "g" * 250 not in garbage[0]
    assert len(warnings) == 4


async def test_eof_fails_pending_requests_and_refuses_new_ones() -> None:
    async with connected() as h:
        calls = [h.request("tools/list"), h.request("tools/call", {})]
        for _ in calls:
            await h.peer.receive()
        await h.peer.send_stream.aclose()
        for call in calls:
            assert isinstance(await call.wait_error(), DownstreamGone)
        await _assert_gone(h)


async def test_close_fails_pending_requests_and_stops_run() -> None:
    async with connected() as h:
        call = h.request("tools/list")
        await h.peer.receive()
        await h.downstream.close()
        error = await call.wait_error()
        assert isinstance(error, DownstreamGone)
        assert "closed" in str(error)
        await _assert_gone(h)


async def test_cancelling_run_fails_pending_requests_and_cancels_hook_tasks() -> None:
    client, server = trio.testing.memory_stream_pair()
    peer = Peer(server, server)
    entered = trio.Event()
    hook_cancelled = trio.Event()

    async def handler(method: str, params: Any, contexts: list[Any]) -> dict[str, Any]:
        entered.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            hook_cancelled.set()
            raise
        raise AssertionError("unreachable")

    downstream = Downstream("fake", client, client, RecordingHooks(handler))
    async with trio.open_nursery() as outer:
        run_scope = trio.CancelScope()

        async def run_it(*, task_status: Any) -> None:
            with run_scope:
                await downstream.run(task_status=task_status)

        await outer.start(run_it)
        call = in_background(outer, downstream.request, "tools/list", None)
        await peer.receive()
        await peer.send({"jsonrpc": "2.0", "id": "s-1", "method": "roots/list"})
        with trio.fail_after(WAIT):
            await entered.wait()
        run_scope.cancel()
        assert isinstance(await call.wait_error(), DownstreamGone)
        with trio.fail_after(WAIT):
            await hook_cancelled.wait()
            await downstream.closed.wait()
        assert not downstream.alive


async def test_run_may_be_entered_once() -> None:
    async with connected() as h:
        with pytest.raises(RuntimeError):
            await h.downstream.run()


# -- initialize ------------------------------------------------------------------------------


async def test_initialize_checks_the_version_and_sends_initialized() -> None:
    async with connected() as h:
        call = in_background(
            h.nursery,
            h.downstream.initialize,
            client_info={"name": "svcgate", "version": "0"},
            capabilities={"sampling": {}},
        )
        message = await h.peer.receive()
        assert message["method"] == "initialize"
        assert message["params"] == {
            "protocolVersion": "2025-11-25",
            "capabilities": {"sampling": {}},
            "clientInfo": {"name": "svcgate", "version": "0"},
        }
        result = {
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "s", "version": "1"},
        }
        await h.peer.answer(message["id"], result)
        assert await call.wait() == result
        assert await h.peer.receive() == {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert h.downstream.initialize_result == result


@pytest.mark.parametrize("version", ["1999-01-01", None, 20251125])
async def test_initialize_refuses_a_protocol_version_the_gateway_does_not_speak(
    version: Any,
) -> None:
    async with connected() as h:
        call = in_background(h.nursery, h.downstream.initialize, client_info={}, capabilities={})
        message = await h.peer.receive()
        await h.peer.answer(message["id"], {"protocolVersion": version, "capabilities": {}})
        error = await call.wait_error()
        assert isinstance(error, DownstreamGone)
        assert repr(version) in str(error)
        assert "2025-11-25" in str(error)
        await _assert_gone(h)


async def test_initialize_error_answer_ends_the_connection() -> None:
    async with connected() as h:
        call = in_background(h.nursery, h.downstream.initialize, client_info={}, capabilities={})
        message = await h.peer.receive()
        error = {"code": -32602, "message": "unsupported"}
        await h.peer.send({"jsonrpc": "2.0", "id": message["id"], "error": error})
        gone = await call.wait_error()
        assert isinstance(gone, DownstreamGone)
        assert isinstance(gone.__cause__, DownstreamError)
        await _assert_gone(h)


async def test_initialize_timeout_ends_the_connection_without_cancelling_initialize(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client, server = trio.testing.memory_stream_pair()
    downstream = Downstream("fake", client, client, RecordingHooks())
    peer = Peer(server, server)
    async with trio.open_nursery() as nursery:
        await nursery.start(downstream.run)
        with pytest.raises(DownstreamGone, match="initialize within 30 s"):
            await downstream.initialize(client_info={}, capabilities={})
        with trio.fail_after(WAIT):
            await downstream.closed.wait()
        await client.send_stream.aclose()
        assert json.loads((await peer.receive_line()) or b"")["method"] == "initialize"
        assert await peer.receive_line() is None  # no notifications/cancelled


# -- the real probe server in a process -------------------------------------------------------


@asynccontextmanager
async def probe(
    hooks: RecordingHooks | None = None, env: dict[str, str] | None = None
) -> AsyncIterator[tuple[Downstream, trio.Process, RecordingHooks]]:
    hooks = hooks or RecordingHooks()
    process = await trio.lowlevel.open_process(
        [SYSTEM_PYTHON, str(PROBE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
    )
    try:
        assert process.stdin is not None and process.stdout is not None
        downstream = Downstream("probe", process.stdin, process.stdout, hooks)
        async with trio.open_nursery() as nursery:
            await nursery.start(downstream.run)
            yield downstream, process, hooks
            nursery.cancel_scope.cancel()
    finally:
        with trio.move_on_after(WAIT, shield=True):
            if process.returncode is None:
                process.kill()
            await process.wait()
            for pipe in (process.stdin, process.stdout):
                if pipe is not None:
                    await pipe.aclose()


async def _init(downstream: Downstream, version: str = "2025-11-25") -> dict[str, Any]:
    return await downstream.initialize(
        client_info={"name": "test", "version": "0"},
        capabilities={"sampling": {}, "roots": {}},
        protocol_version=version,
        timeout=WAIT,
    )


def _text(result: dict[str, Any]) -> str:
    content = result["content"]
    assert content[0]["type"] == "text"
    text = content[0]["text"]
    assert isinstance(text, str)
    return text


async def test_probe_serves_tools_prompts_and_resources_end_to_end() -> None:
    env = {
        "PROBE_NAME": "p1",
        "PROBE_EXTRA_TOOLS": "search, a.b,x",
        "PROBE_RESOURCE_URI": "probe://extra/doc",
    }
    async with probe(env=env) as (ds, _, _hooks):
        init = await _init(ds)
        assert init["protocolVersion"] == "2025-11-25"
        assert init["serverInfo"]["name"] == "p1"
        assert init["capabilities"]["tools"] == {"listChanged": True}
        assert {"prompts", "resources", "logging"} <= set(init["capabilities"])

        tools = {t["name"]: t for t in (await ds.request("tools/list", None))["tools"]}
        assert {"echo", "add", "sleep", "env", "sample", "roots", "log"} <= set(tools)
        assert {"add_tool", "crash", "annotated", "search", "a.b", "x"} <= set(tools)
        assert tools["annotated"]["annotations"] == {"readOnlyHint": True, "destructiveHint": False}

        echo = {"name": "echo", "arguments": {"text": "héllo"}}
        assert _text(await ds.request("tools/call", echo)) == "héllo"
        add = {"name": "add", "arguments": {"a": 2, "b": 3.5}}
        assert _text(await ds.request("tools/call", add)) == "5.5"
        extra = {"name": "a.b", "arguments": {"k": [1]}}
        assert json.loads(_text(await ds.request("tools/call", extra))) == {"k": [1]}
        annotated = await ds.request("tools/call", {"name": "annotated", "arguments": {}})
        assert _text(annotated) == "ok"
        with pytest.raises(DownstreamError) as unknown_tool:
            await ds.request("tools/call", {"name": "nope", "arguments": {}})
        assert unknown_tool.value.code == -32602

        prompts = (await ds.request("prompts/list", None))["prompts"]
        assert [p["name"] for p in prompts] == ["greet"]
        greeting = await ds.request("prompts/get", {"name": "greet", "arguments": {"name": "Ada"}})
        assert greeting["messages"] == [
            {"role": "user", "content": {"type": "text", "text": "Hello, Ada"}}
        ]

        resources = (await ds.request("resources/list", None))["resources"]
        assert {r["uri"] for r in resources} == {"probe://readme", "probe://extra/doc"}
        read = await ds.request("resources/read", {"uri": "probe://extra/doc"})
        assert read["contents"][0]["text"] == "from p1"
        with pytest.raises(DownstreamError) as missing:
            await ds.request("resources/read", {"uri": "probe://missing"})
        assert missing.value.code == -32002
        with pytest.raises(DownstreamError) as no_method:
            await ds.request("completion/complete", {})
        assert no_method.value.code == -32601


@pytest.mark.parametrize("version", ["2024-11-05", "2025-03-26", "2025-06-18"])
async def test_probe_negotiates_older_revisions(version: str) -> None:
    async with probe() as (ds, _, _hooks):
        assert (await _init(ds, version))["protocolVersion"] == version


async def test_probe_runs_calls_concurrently_and_a_cancellation_reaches_the_running_call() -> None:
    async with probe() as (ds, _, hooks), trio.open_nursery() as nursery:
        await _init(ds)
        first_progress = trio.Event()

        async def on_progress(params: dict[str, Any]) -> None:
            assert params["progressToken"] == "mine"
            first_progress.set()

        slow_params = {
            "name": "sleep",
            "arguments": {"seconds": 600, "steps": 6000},
            "_meta": {"progressToken": "mine"},
        }
        slow = in_background(
            nursery, ds.request, "tools/call", slow_params, on_progress=on_progress
        )
        with trio.fail_after(WAIT):
            await first_progress.wait()
        echo = {"name": "echo", "arguments": {"text": "meanwhile"}}
        assert _text(await ds.request("tools/call", echo)) == "meanwhile"

        slow.scope.cancel()
        method, params, _ = await hooks.next_notification()
        assert method == "notifications/message"
        assert params["data"] == "cancelled 2"  # initialize was 1
        assert slow.scope.cancelled_caught
        assert _text(await ds.request("tools/call", echo)) == "meanwhile"


async def test_probe_progress_is_relayed_with_the_original_token() -> None:
    async with probe() as (ds, _, _hooks):
        await _init(ds)
        seen: list[dict[str, Any]] = []

        async def on_progress(params: dict[str, Any]) -> None:
            seen.append(params)

        params = {
            "name": "sleep",
            "arguments": {"seconds": 0.03, "steps": 3},
            "_meta": {"progressToken": "tok-9"},
        }
        result = await ds.request("tools/call", params, on_progress=on_progress)
        assert _text(result) == "slept 0.03"
        assert seen == [{"progressToken": "tok-9", "progress": i, "total": 3} for i in (1, 2, 3)]


async def test_probe_sampling_and_roots_go_through_the_hooks() -> None:
    sample_result = {
        "role": "assistant",
        "content": {"type": "text", "text": "42"},
        "model": "test-model",
    }
    seen: list[tuple[str, Any, list[Any]]] = []

    async def handler(method: str, params: Any, contexts: list[Any]) -> dict[str, Any]:
        seen.append((method, params, contexts))
        if method == "sampling/createMessage":
            return sample_result
        raise DownstreamError.method_not_found(method)

    async with probe(RecordingHooks(handler)) as (ds, _, _hooks):
        await _init(ds)
        sample = {"name": "sample", "arguments": {"prompt": "meaning?"}}
        result = await ds.request("tools/call", sample, context="session-1")
        assert json.loads(_text(result)) == sample_result
        method, params, contexts = seen[0]
        assert method == "sampling/createMessage"
        assert params["messages"][0]["content"]["text"] == "meaning?"
        assert contexts == ["session-1"]

        roots = await ds.request("tools/call", {"name": "roots", "arguments": {}})
        assert roots["isError"] is True
        assert json.loads(_text(roots))["code"] == -32601


async def test_probe_log_and_list_changed_notifications_reach_the_hook() -> None:
    async with probe() as (ds, _, hooks):
        await _init(ds)
        log = {"name": "log", "arguments": {"level": "warning", "message": "careful"}}
        assert _text(await ds.request("tools/call", log, context="c1")) == "logged"
        method, params, contexts = await hooks.next_notification()
        assert (method, params) == (
            "notifications/message",
            {"level": "warning", "logger": "probe", "data": "careful"},
        )
        assert contexts == ["c1"]

        await ds.request("tools/call", {"name": "add_tool", "arguments": {"name": "dyn"}})
        method, _, _ = await hooks.next_notification()
        assert method == "notifications/tools/list_changed"
        names = {t["name"] for t in (await ds.request("tools/list", None))["tools"]}
        assert "dyn" in names
        dyn = await ds.request("tools/call", {"name": "dyn", "arguments": {"x": 1}})
        assert json.loads(_text(dyn)) == {"x": 1}


async def test_probe_env_tool_reports_its_environment() -> None:
    async with probe(env={"PROBE_SECRET_CANARY": "canary-1"}) as (ds, _, _hooks):
        await _init(ds)
        report = json.loads(_text(await ds.request("tools/call", {"name": "env", "arguments": {}})))
        assert report["env"]["PROBE_SECRET_CANARY"] == "canary-1"
        assert report["argv"] == [str(PROBE)]
        assert report["uid"] == os.getuid()
        assert report["cwd"] == os.getcwd()


async def test_a_process_dying_mid_request_fails_every_pending_request() -> None:
    async with probe() as (ds, process, _hooks), trio.open_nursery() as nursery:
        await _init(ds)
        running = trio.Event()

        async def on_progress(params: dict[str, Any]) -> None:
            running.set()

        slow_params = {
            "name": "sleep",
            "arguments": {"seconds": 600, "steps": 6000},
            "_meta": {"progressToken": 1},
        }
        slow = in_background(
            nursery, ds.request, "tools/call", slow_params, on_progress=on_progress
        )
        with trio.fail_after(WAIT):
            await running.wait()
        crash = in_background(nursery, ds.request, "tools/call", {"name": "crash"})
        assert isinstance(await crash.wait_error(), DownstreamGone)
        assert isinstance(await slow.wait_error(), DownstreamGone)
        with trio.fail_after(WAIT):
            await ds.closed.wait()
            assert await process.wait() == 3
        with pytest.raises(DownstreamGone):
            await ds.request("tools/list", None)
