"""``python -m bench``: run every scenario, print a table and JSON lines (docs/benchmarks.md).

Options:
  --quick          tiny sizes, one round (the test suite's smoke run; numbers mean nothing)
  --only 1,3       run only these scenarios (by number)
  --no-peers       skip mcp-proxy and fastmcp's proxy (scenario 1); they are installed into
                   a separate virtual environment on first use, which needs PyPI
  --json FILE      also write every row as one JSON object per line to FILE
  --markdown FILE  also write the table to FILE

Every row is printed as it is measured (``BENCH {...}`` on stdout, progress on stderr); the
table follows at the end. Exit status: 0 when every scenario ran (goals missed or met: they
are reported, not enforced), 1 when a scenario failed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

from bench.common import Row, progress, table

SCENARIOS = {
    1: ("warm", "warm tools/call vs direct SDK server and peer proxies"),
    2: ("listing", "tools/list on 10 servers x 50 tools"),
    3: ("cold", "cold start of 1 and 5 servers; 50 concurrent first requests"),
    4: ("egress", "egress proxy: plain HTTP and intercepted HTTPS"),
    5: ("control", "control plane at scale: audit, profiles, token check"),
    6: ("memory", "memory per warm profile and per idle sandbox"),
}


def machine() -> dict[str, object]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="")
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    wanted = [int(n) for n in args.only.split(",") if n.strip()] or list(SCENARIOS)
    unknown = [n for n in wanted if n not in SCENARIOS]
    if unknown:
        parser.error(f"no scenario {unknown}; there are {sorted(SCENARIOS)}")
    if os.geteuid() != 0:
        parser.error("run as root: the gateway creates namespaces and sandboxes")
    info = {**machine(), "quick": args.quick, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    progress(f"machine: {json.dumps(info)}")
    rows: list[Row] = []
    failed: list[str] = []
    for number in wanted:
        module_name, title = SCENARIOS[number]
        progress(f"scenario {number}: {title}")
        started = time.monotonic()
        try:
            module = importlib.import_module(f"bench.{module_name}")
            if module_name == "warm":
                found = module.run(args.quick, peers=not args.no_peers)
            else:
                found = module.run(args.quick)
        except Exception:  # noqa: BLE001  # report it, run the other scenarios
            failed.append(f"{number} {module_name}")
            traceback.print_exc()
            continue
        if not found:
            failed.append(f"{number} {module_name} (no rows)")
        rows.extend(found)
        progress(f"scenario {number} done in {time.monotonic() - started:.0f} s")
    text = table(rows)
    print(text)
    if args.json:
        with args.json.open("w") as out:
            out.write(json.dumps({"machine": info}) + "\n")
            for row in rows:
                out.write(json.dumps(row.as_json(), sort_keys=True) + "\n")
    if args.markdown:
        args.markdown.write_text(text + "\n")
    missed = [row for row in rows if row.met is False]
    progress(
        f"{len(rows)} rows; goals met {sum(r.met is True for r in rows)}, missed {len(missed)}"
    )
    if failed:
        progress(f"FAILED scenarios: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
