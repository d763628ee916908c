"""Sharded optimizer state (ZeRO-1) and gradients (ZeRO-2) against data parallelism, PyTorch (issue 26):
memory per rank, throughput, and a model that does not fit one process's memory limit unsharded.

For each model (``minilm``: the bert-finetune recipe's MiniLM; ``bert-base``: a BERT-base-sized
classifier from ``transformers.BertConfig()``, nothing downloaded), each world size and each round,
one ``horovodrun --gloo`` (or ``--controller mpi``: ``--mpi``) launch of benchmarks/workers/sharded_memory.py per mode, interleaved
(none, optimizer, gradients, none, ...; AdamW, random token batches). Each launch reports per rank the
optimizer state bytes, the gradient bytes at the end of the backward pass and after the exchange,
peak RSS (``ru_maxrss``) and peak virtual size (``VmPeak``), and the global samples/s.

**The model that did not fit** (``--fit``): the bert-base launches on 2 ranks again, each worker
started as ``bash -c 'ulimit -v N; exec python ...'``, N (KiB) halfway between the largest VmPeak of a
data-parallel rank and of a ZeRO-2 rank measured above (or ``--limit-kib``): whether each mode
trains or fails, and how.

    .venv/bin/python benchmarks/sharded_memory.py --quick --json /tmp/sharded_memory.json
    .venv/bin/python benchmarks/sharded_memory.py --sizes 2,4 --rounds 2 --fit --json benchmarks/sharded_memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
WORKER = REPO / "benchmarks" / "workers" / "sharded_memory.py"
MODES = ("none", "optimizer", "gradients")
MIB = 1024 * 1024


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONPATH=str(REPO), TRANSFORMERS_OFFLINE="1",
               HF_HUB_OFFLINE="1")
    return env


#: Horovod's controller for the launches (``--controller``): horovodrun's own default is MPI where
#: Horovod was built with it, as here.
CONTROLLER = ["--gloo"]


def launch(out: Path, np_: int, model: str, mode: str, shape: list[str], limit_kib: int | None = None,
           label: str = "") -> subprocess.CompletedProcess:
    """One horovodrun job of the worker (under ``ulimit -v`` when ``limit_kib`` is given)."""
    worker = [str(BIN / "python"), str(WORKER), str(out), "--model", model, "--mode", mode, "--label", label, *shape]
    if limit_kib is not None:
        worker = ["bash", "-c", f"ulimit -v {limit_kib}; exec " + " ".join(worker)]
    cmd = [str(BIN / "horovodrun"), "-np", str(np_), "-H", f"localhost:{np_}", *CONTROLLER, *worker]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=REPO, timeout=1800)


def measure(out: Path, models: list[str], sizes: list[int], rounds: int, shape: list[str]) -> list[dict]:
    """Every (model, size): ``rounds`` rounds of the three modes, interleaved."""
    rows = []
    for model in models:
        for size in sizes:
            for r in range(rounds):
                for mode in MODES:
                    proc = launch(out, size, model, mode, shape, label=f"round{r + 1}")
                    if proc.returncode != 0:
                        raise SystemExit(f"{model} {mode} np{size} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
                    rows.append(json.loads(out.read_text().splitlines()[-1]))
                    print(f"  {model} np{size} round {r + 1} {mode}: {rows[-1]['samples_per_sec']:.2f} samples/s",
                          flush=True)
    return rows


def fit(out: Path, rows: list[dict], shape: list[str], limit_kib: int | None) -> dict:
    """bert-base on 2 ranks under a per-process ``ulimit -v``: which modes train."""
    peaks = {mode: max(rank["vm_peak_kib"] for row in rows if row["model"] == "bert-base"
                       and row["world_size"] == 2 and row["mode"] == mode for rank in row["ranks"]) for mode in MODES
             if any(row["model"] == "bert-base" and row["world_size"] == 2 and row["mode"] == mode for row in rows)}
    if limit_kib is None:
        limit_kib = (peaks["none"] + peaks["gradients"]) // 2
    result = {"limit_kib": limit_kib, "vm_peak_kib_unlimited": peaks, "modes": {}}
    for mode in MODES:
        proc = launch(out, 2, "bert-base", mode, shape, limit_kib=limit_kib, label="ulimit")
        text = proc.stdout + proc.stderr
        error = next((line.strip() for line in text.splitlines()
                      if "MemoryError" in line or "DefaultCPUAllocator" in line or "Cannot allocate" in line
                      or "std::bad_alloc" in line), None)
        result["modes"][mode] = {"trained": proc.returncode == 0, "returncode": proc.returncode,
                                 "error": None if proc.returncode == 0 else (error or text.strip()[-300:])}
        print(f"  ulimit -v {limit_kib} KiB, bert-base np2 {mode}: "
              f"{'trains' if proc.returncode == 0 else 'fails: ' + str(result['modes'][mode]['error'])[:160]}",
              flush=True)
    return result


def table(rows: list[dict]) -> str:
    """Markdown: one line per launch."""
    lines = ["| model | ranks | mode | round | samples/s | vs none | optimizer state/rank | grads end of backward | "
             "grads after exchange | peak RSS/rank (MiB) | VmPeak/rank (MiB) |", "|" + "---|" * 11]
    for row in rows:
        base = [r for r in rows if r["model"] == row["model"] and r["world_size"] == row["world_size"]
                and r["label"] == row["label"] and r["mode"] == "none"]
        ratio = row["samples_per_sec"] / base[0]["samples_per_sec"] if base else float("nan")
        ranks = row["ranks"]

        def span(key, scale):
            values = [r[key] / scale for r in ranks]
            return f"{min(values):,.1f}" if max(values) - min(values) < 0.05 else f"{min(values):,.1f}-{max(values):,.1f}"
        lines.append(f"| {row['model']} | {row['world_size']} | {row['mode']} | {row['label']} | "
                     f"{row['samples_per_sec']:.2f} | {ratio:.3f} | {span('optimizer_bytes', MIB)} MiB | "
                     f"{span('grad_bytes_end_of_backward', MIB)} MiB | {span('grad_bytes_after_exchange', MIB)} MiB | "
                     f"{span('peak_rss_kib', 1024)} | {span('vm_peak_kib', 1024)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 ranks, 1 round, 4 updates of 4 x 64 tokens")
    parser.add_argument("--models", default="minilm,bert-base")
    parser.add_argument("--sizes", default="2,4")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--fit", action="store_true", help="also the bert-base ulimit -v runs (needs bert-base at 2)")
    parser.add_argument("--limit-kib", type=int, default=None)
    parser.add_argument("--controller", choices=("gloo", "mpi"), default="gloo",
                        help="Horovod's controller: horovodrun --gloo or --mpi")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--work", type=Path, default=Path("/tmp/sharded_memory"))
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.rounds, args.steps, args.batch, args.seq = "2", 1, 4, 4, 64
    CONTROLLER[:] = [f"--{args.controller}"]
    shape = ["--steps", str(args.steps), "--batch", str(args.batch), "--seq", str(args.seq)]
    args.work.mkdir(parents=True, exist_ok=True)
    out = args.work / "launches.jsonl"
    rows = measure(out, args.models.split(","), [int(s) for s in args.sizes.split(",")], args.rounds, shape)
    result = {"shape": shape, "controller": args.controller, "launches": rows}
    if args.fit:
        result["fit"] = fit(out, rows, shape, args.limit_kib)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
