"""Run hvdtrain's benchmark suite and write BENCHMARKS.md and its plot: the one command.

    .venv/bin/python benchmarks/run.py                 # all items, 5 rounds (about 7 minutes on 2 cores)
    .venv/bin/python benchmarks/run.py --only 1,4      # some items; the others keep their last results
    .venv/bin/python benchmarks/run.py --report-only   # re-render BENCHMARKS.md and the PNG from results.json

Every comparison runs both sides in this invocation, interleaved (A/B inside one job where both
can share it, alternating launches where they cannot), at least 5 rounds, one intra-op thread per
rank (2 ranks x 1 thread on 2 cores). Each ratio is the median of the per-round ratios. Results go
to benchmarks/results.json; :mod:`report` turns them into BENCHMARKS.md and benchmarks/benchmarks.png.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]

import analyze  # noqa: E402
import report  # noqa: E402

BIN = Path(sys.executable).parent
RESULTS = HERE / "results.json"
ITEMS = ("1", "3", "4", "5")  # 1 also yields item 2, 4 also item 7, 5 also item 6
#: glibc malloc: no memory given back to the kernel between steps (see :func:`job_env`); 32 MiB is
#: the largest mmap threshold glibc accepts on 64-bit
ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(4 << 30)}


def job_env() -> dict[str, str]:
    """The jobs' environment. Torch collectives wait in Horovod's own spin (``HVDTRAIN_TORCH_WAIT=spin``):
    each row sets hvdtrain's code against a loop written with Horovod as Horovod ships it, in the same
    process, and a process has one wait policy; hvdtrain's default backoff is measured on its own
    (benchmarks/torch_wait.py).

    glibc's allocator keeps freed memory (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``):
    with its defaults a torch step on the CPU gives its activations back to the kernel and faults
    them in again at the next step, 700 to 10,000 page faults per step, and which side of a
    comparison pays how many depends on the process's allocation history, not on the side's code
    (BENCHMARKS.md, "Your own script"); both sides of a row share one process, so one allocator
    setting applies to both."""
    env = dict(os.environ)
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=f"{REPO}{os.pathsep}{HERE}",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HVDTRAIN_TORCH_WAIT="spin",
               **ALLOCATOR)
    return env


def launch(cmd: list, log: Path) -> None:
    """Run one job; its output goes to ``log``; a failure raises with the log's tail."""
    cmd = [str(c) for c in cmd]
    started = time.perf_counter()
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=job_env(), cwd=REPO, timeout=900)
    print(f"  {' '.join(Path(c).name if '/' in c else c for c in cmd[:8])} ... {time.perf_counter() - started:.0f}s",
          flush=True)
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {' '.join(cmd)}\n{log.read_text()[-3000:]}")


def horovodrun(np_: int, script: str, *args) -> list:
    return [BIN / "horovodrun", "-np", np_, "-H", f"localhost:{np_}", "--gloo", sys.executable, HERE / script, *args]


def run_item(item: str, rounds: int, raw: Path, log: Path) -> list[dict]:
    """Run one item's jobs and return its table rows."""
    if item == "1":  # also item 2 (DDP in the torch job), Keras fit (TensorFlow job), prepare() (own job)
        rows = []
        for framework in ("torch", "tensorflow"):
            out = raw / f"overhead_{framework}.json"
            launch(horovodrun(2, "workers/overhead.py", framework, out, "--rounds", 2 * rounds,
                              "--ddp" if framework == "torch" else "--keras-fit"), log)
            rows += analyze.overhead(json.loads(out.read_text()))
        out = raw / "own_loop.json"
        launch(horovodrun(2, "own_loop_overhead.py", 2 * rounds, 4096, out), log)
        return rows + [analyze.own_loop(json.loads(out.read_text()))]
    if item == "3":
        runs = {1: [], 2: []}
        for r in range(rounds):
            for n in ((1, 2) if r % 2 == 0 else (2, 1)):
                out = raw / f"scaling_np{n}_{r}.json"
                launch(horovodrun(n, "workers/scaling.py", out), log)
                runs[n].append(json.loads(out.read_text()))
        return [analyze.scaling(runs)]
    if item == "4":
        out, trace = raw / "allreduce.json", raw / "allreduce_timeline.json"
        trace.unlink(missing_ok=True)
        launch(horovodrun(2, "workers/allreduce.py", out, trace, "--rounds", 2 * rounds), log)
        return analyze.allreduce(json.loads(out.read_text()), trace)
    if item == "5":
        out = raw / "pipeline.json"
        launch(horovodrun(2, "workers/pipeline.py", out, "--rounds", rounds, "--workdir", raw), log)
        return analyze.pipeline(json.loads(out.read_text()))
    raise ValueError(f"unknown item {item!r}; choose from {', '.join(ITEMS)}")


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    mem = next((int(line.split()[1]) // 1024 // 1024 for line in open("/proc/meminfo") if line.startswith("MemTotal")), 0)
    versions = {}
    for name in ("torch", "tensorflow", "horovod", "numpy"):
        try:
            versions[name] = __import__("importlib.metadata").metadata.version(
                name if name != "tensorflow" else "tensorflow-cpu")
        except Exception:
            versions[name] = "?"
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": mem, "python": platform.python_version(),
            "os": f"{platform.system()} {platform.release()}", "versions": versions}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds per comparison (>= 5 for the report)")
    parser.add_argument("--only", default=",".join(ITEMS), help=f"comma-separated items among {','.join(ITEMS)} "
                        "(1 includes 2, 4 includes 7, 5 includes 6)")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--keep", default=None, help="keep raw job outputs and logs in this folder")
    args = parser.parse_args()
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {"rows": []}
    if not args.report_only:
        items = [i.strip() for i in args.only.split(",") if i.strip()]
        unknown = [i for i in items if i not in ITEMS]
        if unknown:
            sys.exit(f"benchmarks/run.py: unknown item(s) {', '.join(unknown)}; choose from {', '.join(ITEMS)}")
        raw = Path(args.keep or tempfile.mkdtemp(prefix="hvdtrain-benchmarks-"))
        raw.mkdir(parents=True, exist_ok=True)
        log = raw / "jobs.log"
        started = time.time()
        load_before = os.getloadavg()
        covered = {"1": ("1", "2"), "3": ("3",), "4": ("4", "7"), "5": ("5", "6")}
        replaced = {prefix for item in items for prefix in covered[item]}
        rows = [r for r in results.get("rows", []) if r["item"].split("-")[0] not in replaced]
        for item in items:
            print(f"item {item}:", flush=True)
            try:
                rows += [{**row, "machine": report.short_machine(machine())}
                         for row in run_item(item, args.rounds, raw, log)]
            except Exception as exc:  # keep going; the report says what failed
                print(f"  failed: {str(exc)[:2000]}", flush=True)
                rows.append({"item": item, "title": f"item {item}", "error": str(exc)[-800:]})
        partial = sorted(items) != sorted(ITEMS)
        command = "python benchmarks/run.py" + (f" --only {','.join(items)}" if partial else "")
        results = {"date": datetime.date.today().isoformat(), "machine": machine(), "rounds": args.rounds,
                   "command": command, "kept_from_earlier": sorted({r["item"] for r in rows} - {
                       r["item"] for item in items for r in rows if r["item"].split("-")[0] in covered[item]}),
                   "minutes": round((time.time() - started) / 60, 1),
                   "load_average": {"before": load_before, "after": os.getloadavg()},
                   "rows": sorted(rows, key=lambda r: r["item"])}
        RESULTS.write_text(json.dumps(results, indent=1))
        print(f"raw outputs and job log: {raw}")
    report.write(results, REPO / "BENCHMARKS.md", HERE / "benchmarks.png")
    print(f"wrote {REPO / 'BENCHMARKS.md'} and {HERE / 'benchmarks.png'}")


if __name__ == "__main__":
    main()
