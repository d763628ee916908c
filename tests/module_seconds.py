"""Rewrite ``tests/module_seconds.json`` from the log of a run of the whole suite in one process.

    make test TEST_WORKERS=0 PYTEST_ARGS=--durations=0 | tee /tmp/suite.log
    python tests/module_seconds.py /tmp/suite.log

Every ``--durations`` line (setup, call and teardown) is added to its module.
"""

from __future__ import annotations

import collections
import json
import re
import sys
from pathlib import Path

FILE = Path(__file__).with_name("module_seconds.json")
LINE = re.compile(r"([0-9.]+)s (?:setup|call|teardown)\s+tests/(\S+?\.py)::")


def main(log: str) -> None:
    seconds: dict[str, float] = collections.defaultdict(float)
    for line in Path(log).read_text().splitlines():
        found = LINE.match(line)
        if found:
            seconds[found.group(2)] += float(found.group(1))
    if not seconds:
        sys.exit(f"{log}: no --durations lines (run pytest with --durations=0)")
    about = json.loads(FILE.read_text()).get("_about", "")
    table = {name: round(s, 1) for name, s in sorted(seconds.items(), key=lambda kv: -kv[1])}
    FILE.write_text(json.dumps({"_about": about, **table}, indent=1) + "\n")
    print(f"{FILE}: {len(table)} modules, {sum(table.values()):.0f} s")


if __name__ == "__main__":
    main(*sys.argv[1:])
