"""What every scenario shares: statistics, alternation, results, the table and JSON lines.

A scenario measures a *subject* (svcgate) against a *baseline* measured in the same run,
alternating the two round by round so that drift of the machine (another process, thermal
state, the page cache) hits both alike. Each round yields one number per side (a p50, a
p99, a throughput); the reported value is the median over rounds, and the ratio is
subject ÷ baseline of those medians.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
if str(TESTS) not in sys.path:
    # The bench reuses the test suite's launch helpers (gateway, identity provider, sandbox
    # staging), so both start the product the same way.
    sys.path.insert(0, str(TESTS))
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@dataclass(frozen=True)
class Goal:
    """A target: ``ratio`` (subject ÷ baseline) or ``value`` (absolute) <= or >= ``limit``."""

    on: str  # "ratio" | "value"
    op: str  # "<=" | ">="
    limit: float

    def met(self, ratio: float | None, value: float) -> bool | None:
        seen = ratio if self.on == "ratio" else value
        if seen is None:
            return None
        return seen <= self.limit if self.op == "<=" else seen >= self.limit

    def __str__(self) -> str:
        return f"{'x' if self.on == 'ratio' else ''}{self.op} {self.limit:g}"


@dataclass
class Row:
    """One reported number: the subject's median, and its baseline's when there is one."""

    scenario: str
    case: str
    metric: str  # "p50", "p99", "throughput", "time", "rss", ...
    unit: str  # "ms", "req/s", "MB", ...
    value: float
    subject: str = "svcgate"
    baseline: str | None = None
    baseline_value: float | None = None
    goal: Goal | None = None
    rounds: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if self.baseline_value is None or self.baseline_value == 0:
            return None
        return self.value / self.baseline_value

    @property
    def met(self) -> bool | None:
        return None if self.goal is None else self.goal.met(self.ratio, self.value)

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["goal"] = str(self.goal) if self.goal else None
        out["ratio"] = None if self.ratio is None else round(self.ratio, 4)
        out["met"] = self.met
        for key in ("value", "baseline_value"):
            if out[key] is not None:
                out[key] = round(out[key], 4)
        return out


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``samples``, nearest-rank."""
    ordered = sorted(samples)
    if not ordered:
        raise ValueError("no samples")
    index = min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))
    return ordered[index]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


@dataclass
class Latency:
    p50: float
    p99: float
    n: int


def latency(samples_s: Sequence[float]) -> Latency:
    """p50 and p99 in milliseconds of samples in seconds."""
    return Latency(
        percentile(samples_s, 0.5) * 1e3, percentile(samples_s, 0.99) * 1e3, len(samples_s)
    )


async def timed_calls(call: Callable[[], Awaitable[object]], count: int) -> list[float]:
    """Run ``call`` ``count`` times one after the other; the duration of each, in seconds."""
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - start)
    return samples


async def throughput(calls: Sequence[Callable[[], Awaitable[object]]], duration: float) -> float:
    """Completed calls per second with one worker per entry of ``calls``, each calling in a
    loop for ``duration`` seconds."""
    import trio

    done = 0
    deadline = trio.current_time() + duration

    async def worker(call: Callable[[], Awaitable[object]]) -> None:
        nonlocal done
        while trio.current_time() < deadline:
            await call()
            done += 1

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for call in calls:
            nursery.start_soon(worker, call)
    return done / (time.perf_counter() - start)


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        text = f"{value:,.0f}"
    elif abs(value) >= 100:
        text = f"{value:.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"
    return f"{text} {unit}".strip()


def table(rows: Sequence[Row]) -> str:
    """A Markdown table of ``rows`` (also how docs/benchmarks.md shows them)."""
    head = "| scenario | case | svcgate | baseline | baseline value | ratio | goal | met |"
    lines = [head, "|---|---|--:|---|--:|--:|---|---|"]
    for row in rows:
        met = {True: "yes", False: "**no**", None: ""}[row.met]
        lines.append(
            f"| {row.scenario} | {row.case} {row.metric} | {fmt(row.value, row.unit)} | "
            f"{row.baseline or ''} | {fmt(row.baseline_value, row.unit)} | "
            f"{'' if row.ratio is None else f'{row.ratio:.2f}x'} | "
            f"{row.goal or ''} | {met} |"
        )
    return "\n".join(lines)


def emit(row: Row, stream: Any = None) -> None:
    """Print ``row`` as one JSON line (prefixed ``BENCH``) as soon as it is measured."""
    print(
        "BENCH " + json.dumps(row.as_json(), sort_keys=True), file=stream or sys.stdout, flush=True
    )


def progress(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
