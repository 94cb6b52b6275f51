"""A dedicated, long-lived thread that forks every sandbox.

Why: ``bwrap --die-with-parent`` uses ``PR_SET_PDEATHSIG``, and the kernel fires it when
the *thread* that forked bwrap exits, not the process. ``trio.run_process`` and
``trio.lowlevel.open_process`` fork from trio's worker threads, which retire after ~10 s
idle, so sandboxes spawned that way get SIGKILLed ~10 s after start. Forking from one thread
that lives exactly as long as the launcher gives the intended meaning: a sandbox dies when
the launcher (or the whole gateway process) goes away, and not before.

Resource handling:
    The thread is started by :meth:`SpawnerThread.start` and ended by
    :meth:`SpawnerThread.close`, which the launcher calls only after every sandbox has been
    stopped (closing it earlier would kill running sandboxes via PDEATHSIG). A job handed to
    the thread always runs to completion: :meth:`SpawnerThread.run` waits for it under a
    shield, because abandoning a half-finished ``fork`` would leak the child. Spawning takes
    milliseconds, so the shield never holds a cancellation for long.

Error handling:
    An exception raised by a job is re-raised in the awaiting task.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from typing import TypeVar

import outcome
import trio

T = TypeVar("T")


class SpawnerThread:
    """Runs blocking spawn jobs, one at a time, in a single long-lived thread."""

    def __init__(self, name: str = "svcg-sandbox-spawner") -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        # daemon: if the interpreter exits without close() (a crash path), do not hang on
        # this thread; the sandboxes then die by PDEATHSIG as they should.
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    @property
    def native_id(self) -> int | None:
        """The kernel thread id sandboxes' PDEATHSIG is tied to."""
        return self._thread.native_id

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop the thread after queued jobs; running sandboxes it forked will be killed."""
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` in the spawner thread and return its result (not cancellable)."""
        if not self._thread.is_alive():
            raise RuntimeError("spawner thread is not running")
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        box: list[outcome.Outcome[T]] = []

        def job() -> None:
            box.append(outcome.capture(fn))
            # The trio run may have ended if the awaiting task's run crashed meanwhile;
            # there is nobody left to tell.
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(done.set)

        self._jobs.put(job)
        with trio.CancelScope(shield=True):
            await done.wait()
        return box[0].unwrap()
