"""Rewrite ``tests/module_seconds.json`` from the log of a run of the whole suite in one process.

    make test TEST_WORKERS=0 PYTEST_ARGS=--durations=0 | tee /tmp/suite.log
    python tests/module_seconds.py /tmp/suite.log

Every ``--durations`` line (setup, call and teardown) is added to its module. A log without them
(``make test`` as it is, in two workers) is read from the module summary that tests/conftest.py
prints at its end (``   412.3s module   tests/cluster/test_cluster.py ...``).

    HVDTRAIN_TEST_JOB_LOG=/tmp/jobs.jsonl make test
    python tests/module_seconds.py --jobs /tmp/jobs.jsonl

prints instead, per test, the commands it ran (tests/jobs.py's ``run``), their wall and CPU seconds,
largest CPU first: the jobs worth making smaller.
"""

from __future__ import annotations

import collections
import json
import re
import sys
from pathlib import Path

FILE = Path(__file__).with_name("module_seconds.json")
LINE = re.compile(r"([0-9.]+)s (?:setup|call|teardown)\s+tests/(\S+?\.py)::")
SUMMARY = re.compile(r"\s*([0-9.]+)s module\s+tests/(\S+?\.py)\s")


def main(log: str) -> None:
    seconds: dict[str, float] = collections.defaultdict(float)
    for line in Path(log).read_text().splitlines():
        found = LINE.match(line)
        if found:
            seconds[found.group(2)] += float(found.group(1))
    if not seconds:  # no --durations lines: the module summary of tests/conftest.py
        for line in Path(log).read_text().splitlines():
            found = SUMMARY.match(line)
            if found:
                seconds[found.group(2)] = float(found.group(1))
    if not seconds:
        sys.exit(f"{log}: no --durations lines and no module summary (run pytest with --durations=0)")
    kept = {k: v for k, v in json.loads(FILE.read_text()).items() if k.startswith("_")}  # _about, _docker_images
    table = {name: round(s, 1) for name, s in sorted(seconds.items(), key=lambda kv: -kv[1])}
    FILE.write_text(json.dumps({**kept, **table}, indent=1) + "\n")
    print(f"{FILE}: {len(table)} modules, {sum(table.values()):.0f} s")


def jobs(log: str, top: str = "40") -> None:
    per_test: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for line in Path(log).read_text().splitlines():
        job = json.loads(line)
        row = per_test[job["test"]]
        row[0] += 1
        row[1] += job["wall"]
        row[2] += job["cpu"]
    ranked = sorted(per_test.items(), key=lambda kv: -kv[1][2])
    print(f"{'cpu s':>8} {'wall s':>8} {'jobs':>4}  test")
    for test, (count, wall, cpu) in ranked[:int(top)]:
        print(f"{cpu:8.1f} {wall:8.1f} {count:4d}  {test}")
    print(f"{sum(r[2] for _, r in ranked):8.1f} {sum(r[1] for _, r in ranked):8.1f} "
          f"{sum(r[0] for _, r in ranked):4d}  all {len(ranked)} tests")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--jobs"]:
        jobs(*sys.argv[2:])
    else:
        main(*sys.argv[1:])
