"""A smoke run of the benchmarks: ``python -m bench --quick`` runs every scenario at tiny
sizes and reports rows for each (the numbers are not judged here: the benchmark is not
part of the suite's pass/fail, its ability to run is). The peer proxies are skipped: they
are installed from PyPI into a separate environment on first use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.root

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ("1 ", "2 ", "3 ", "4 ", "5 ", "6 ")


def test_every_scenario_runs_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl"
    markdown = tmp_path / "table.md"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--quick",
            "--no-peers",
            "--json",
            str(out),
            "--markdown",
            str(markdown),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["machine"]["quick"] is True
    rows = lines[1:]
    for prefix in SCENARIOS:
        assert [r for r in rows if r["scenario"].startswith(prefix)], f"no rows for {prefix}"
    for row in rows:
        assert row["value"] is not None and row["value"] >= 0, row
        if row["baseline_value"] is not None:
            assert row["ratio"] is not None
    # Every row was printed as a JSON line as it was measured, and the table at the end.
    printed = [line for line in done.stdout.splitlines() if line.startswith("BENCH ")]
    assert len(printed) == len(rows)
    assert markdown.read_text().startswith("| scenario |")
