"""The per-source failure budget of the data plane (THREATS A7), with a fake clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from svcgate.ratelimit import FailureLimiter


def test_a_source_is_blocked_after_its_burst_and_refills_over_time() -> None:
    limiter = FailureLimiter(burst=5, rate=1)
    for _ in range(5):
        assert not limiter.blocked("a", 0.0)
        limiter.failed("a", 0.0)
    assert limiter.blocked("a", 0.0)
    assert not limiter.blocked("b", 0.0)  # other sources are untouched
    assert not limiter.blocked("a", 1.0)  # one failure refilled after a second
    limiter.failed("a", 1.0)
    assert limiter.blocked("a", 1.5)


def test_full_buckets_are_forgotten_and_memory_is_bounded() -> None:
    limiter = FailureLimiter(burst=3, rate=10, max_sources=100)
    for i in range(1000):
        limiter.failed(f"10.0.{i // 256}.{i % 256}", 0.0)
    assert len(limiter) == 100
    assert not limiter.blocked("10.0.0.0", 100.0)
    assert len(limiter) == 100  # blocked() forgets only what it looked at and found full


def test_bad_parameters_are_refused() -> None:
    for kwargs in ({"burst": 0}, {"rate": 0}, {"max_sources": 0}):
        with pytest.raises(ValueError, match="required"):
            FailureLimiter(**kwargs)


@given(st.lists(st.floats(min_value=0, max_value=0.5), min_size=1, max_size=300))
def test_failures_never_exceed_burst_plus_refill(gaps: list[float]) -> None:
    """Whatever the timing, a source gets at most burst + rate * elapsed failed attempts."""
    limiter = FailureLimiter(burst=10, rate=2)
    now, attempts = 0.0, 0
    for gap in gaps:
        now += gap
        if not limiter.blocked("x", now):
            attempts += 1
            limiter.failed("x", now)
    assert attempts <= 10 + 2 * now + 1
