"""bert-finetune at dataset scale: start-up time, peak memory and throughput with the token cache,
against the tokenizer alone and against another checkout of hvdtrain (the code before the cache).

    # 1. the data: 1,000,000 rows (and its first 100,000) of shuffled, combined movie-review sentences
    .venv/bin/python benchmarks/text_cache.py data --rows 1000000
    # 2. time to first step (cold / cached), peak RSS per rank, the tokenizer alone; then throughput
    #    on the embedded default; BASELINE is a checkout of the code to compare with (e.g. /work/main)
    nohup nice .venv/bin/python benchmarks/text_cache.py run --baseline /work/main --rounds 2 \\
        > /tmp/text-bench.log 2>&1 &

Every figure is measured in this one invocation, the sides interleaved round by round, with the
load average recorded before and after each launch. Results: ``benchmarks/text_cache_results.json``
(and a Markdown table on stdout). All jobs: 2 ranks (``horovodrun -np 2 -H localhost:2 --gloo``),
torch, the embedded MiniLM (all-MiniLM-L6-v2), ``text.max_length=128``, batch 8 per rank.

* **time to first step**: from launching ``horovodrun`` until rank 0 prints the first step's line
  (``train.log_every=1``); the job is then stopped. ``ready_seconds``: until rank 0 prints that
  the task (data and model) is built. Cold: the token cache directory is empty;
  cached: the same command again.
* **peak RSS per rank**: the kernel's high-water mark (``VmHWM`` in ``/proc/PID/status``) of each
  training process, read until the job is stopped (after the first step).
* **tokenizer alone**: one process streams the CSV (``csv.reader``) and encodes it in chunks of
  8,192 rows with the batch encoder the cache uses (``encode_batch_fast``), every core
  (``tokenizers``' default): the floor for any cold start.
* **throughput**: the embedded default (MiniLM, ``max_length`` 64, batch 8 per rank, 1 epoch) on
  its first 480 training sentences (``--throughput-rows``; the full 2,000 take 10 minutes per run
  on a loaded machine) and 200 validation sentences, no checkpoint; samples/s from the run's
  ``metrics.jsonl``, both checkouts alternating.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BIN = Path(sys.executable).parent
DATA_DIR = Path("/tmp/hvdtrain-text-bench")
RESULTS = HERE / "text_cache_results.json"
SEED = 11


def generate(rows: int, out: Path) -> Path:
    """``rows`` rows: 1 to 4 embedded review sentences drawn at random and joined (so lengths vary),
    labelled by the sign of their summed sentiment scores."""
    sys.path.insert(0, str(REPO))
    from hvdtrain_recipes.bert_finetune.text_data import embedded_file

    with open(embedded_file(), newline="", encoding="utf-8") as f:
        source = [(text, float(score)) for _, score, text in list(csv.reader(f, delimiter="\t",
                                                                             quoting=csv.QUOTE_NONE))[1:]]
    rng = random.Random(SEED)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        for _ in range(rows):
            picked = rng.sample(source, rng.choice((1, 1, 2, 2, 3, 4)))
            score = sum(s for _, s in picked)
            writer.writerow([" ".join(t for t, _ in picked), "positive" if score > 0 else "negative"])
    os.replace(tmp, out)
    return out


def data_file(rows: int) -> Path:
    return DATA_DIR / f"reviews-{rows}.csv"


def encode_alone(path: Path, max_length: int) -> float:
    """Seconds for one process to stream ``path`` and encode every text (all cores)."""
    sys.path.insert(0, str(REPO))
    from hvdtrain_recipes.bert_finetune import pretrained, tokenized

    started = time.perf_counter()
    tokenizer = tokenized.load_tokenizer(pretrained.embedded_model_dir(), max_length)
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # the call the token cache makes
    chunk, tokens = [], 0
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        next(reader)
        for text, _ in reader:
            chunk.append(text)
            if len(chunk) == 8192:
                tokens += sum(len(e.ids) for e in encode(chunk))
                chunk = []
    tokens += sum(len(e.ids) for e in encode(chunk)) if chunk else 0
    return time.perf_counter() - started


def _descendants(pid: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                children.append(int(entry.name))
    return children + [d for c in children for d in _descendants(c)]


def _peak_kib(pid: int) -> int | None:
    try:
        cmdline = (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        if "bert-finetune" not in cmdline or "horovodrun" in cmdline or "python" not in cmdline:
            return None
        match = re.search(r"VmHWM:\s+(\d+) kB", (Path("/proc") / str(pid) / "status").read_text())
        return int(match.group(1)) if match else None
    except OSError:
        return None


def first_step(checkout: Path, data: Path, cache: Path, output: Path, timeout: float = 1800) -> dict:
    """Launch 2 ranks on ``data`` with the code in ``checkout``; stop after the first step."""
    cmd = [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", str(BIN / "hvdtrain"), "recipe",
           "bert-finetune", "--framework", "torch", "--data", str(data), "--max-length", "128",
           "--batch-size", "8", "--output", str(output), "--set", "train.log_every=1",
           "--set", "train.progress_bar=false", "--set", "train.tensorboard=false"]
    env = {**os.environ, "PYTHONPATH": str(checkout), "HVDTRAIN_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1",
           "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    load_before = os.getloadavg()
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True, cwd=str(checkout))
    peaks: dict[int, int] = {}
    lines: list[tuple[float, str]] = []  # (arrival time, line), filled by a reader thread
    reader = threading.Thread(target=lambda: [lines.append((time.perf_counter(), line)) for line in proc.stdout],
                              daemon=True)
    reader.start()
    seconds, deadline = None, None
    try:
        while time.perf_counter() - started < timeout:
            for pid in _descendants(proc.pid):
                peak = _peak_kib(pid)
                if peak is not None:
                    peaks[pid] = max(peaks.get(pid, 0), peak)
            if seconds is None:
                hit = next((t for t, line in list(lines) if re.search(r"step 1/\d+", line)), None)
                if hit is not None:
                    seconds = hit - started
                    deadline = time.perf_counter() + 2.0  # read the high-water marks a little after the step
            if deadline is not None and time.perf_counter() > deadline:
                break
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        reader.join(timeout=5)
    log = [line.rstrip() for _, line in lines]
    ready = next((t - started for t, line in lines if re.search(r"on \d+ worker\(s\):", line)), None)
    return {"seconds": seconds, "ready_seconds": ready, "peak_rss_mib": sorted(round(v / 1024) for v in peaks.values()),
            "load_before": load_before, "load_after": os.getloadavg(),
            "log_tail": [line for line in log if "hvdtrain" in line or "bert-finetune" in line][-6:]
            if seconds else log[-30:]}


def throughput(checkout: Path, output: Path, train_rows: int) -> dict:
    """samples/s of the embedded default (2 ranks, torch, 1 epoch; ``train_rows`` of its training
    sentences, 200 validation sentences, no checkpoint), from the run's ``metrics.jsonl``."""
    cmd = [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", str(BIN / "hvdtrain"), "recipe",
           "bert-finetune", "--framework", "torch", "--output", str(output), "--set", "train.progress_bar=false",
           "--set", "train.tensorboard=false", "--set", f"data.max_train_samples={train_rows}",
           "--set", "data.max_val_samples=200", "--set", "checkpoint.enabled=false"]
    env = {**os.environ, "PYTHONPATH": str(checkout), "PYTHONUNBUFFERED": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1",
           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    load_before = os.getloadavg()
    shutil.rmtree(output, ignore_errors=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(checkout), timeout=1800)
    metrics = output / "metrics.jsonl"
    record = json.loads(metrics.read_text().splitlines()[-1]) if metrics.is_file() else {}
    return {"samples_per_sec": record.get("samples_per_sec"), "val_accuracy": record.get("val_accuracy"),
            "load_before": load_before, "load_after": os.getloadavg(),
            "log_tail": [] if record else (proc.stdout + proc.stderr).splitlines()[-30:]}


def median(values):
    values = sorted(v for v in values if v is not None)
    return values[len(values) // 2] if len(values) % 2 else (sum(values[len(values) // 2 - 1:len(values) // 2 + 1])
                                                            / 2 if values else None)


def run(args) -> dict:
    baseline = Path(args.baseline).resolve()
    big, small = data_file(args.rows), data_file(args.baseline_rows)
    work = Path(args.work)
    results: dict = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     "cores": os.cpu_count(), "rows": args.rows, "baseline_rows": args.baseline_rows,
                     "baseline": str(baseline), "rounds": []}
    for round_number in range(args.rounds):
        shutil.rmtree(work, ignore_errors=True)
        one = {"round": round_number + 1}
        sizes = [(n, d) for n, d in (("small", small), ("big", big)) if n in args.sizes.split(",")]
        sizes = sizes if round_number < args.big_rounds else [(n, d) for n, d in sizes if n == "small"]
        if not args.skip_baseline:
            one["baseline_small"] = first_step(baseline, small, work / "cache-baseline", work / "out-baseline")
            print(json.dumps({"baseline_small": one["baseline_small"]}), flush=True)
        for name, data in sizes:
            one[f"cold_{name}"] = first_step(REPO, data, work / f"cache-{name}", work / f"out-{name}")
            print(json.dumps({f"cold_{name}": one[f"cold_{name}"]}), flush=True)
            one[f"cached_{name}"] = first_step(REPO, data, work / f"cache-{name}", work / f"out-{name}")
            print(json.dumps({f"cached_{name}": one[f"cached_{name}"]}), flush=True)
            if args.skip_encode:
                continue
            load_before = os.getloadavg()
            seconds = float(subprocess.run([sys.executable, __file__, "encode", str(data)], capture_output=True,
                                           text=True, check=True).stdout.split()[-1])
            one[f"encode_{name}"] = {"seconds": seconds, "load_before": load_before, "load_after": os.getloadavg()}
            print(json.dumps({f"encode_{name}": one[f"encode_{name}"]}), flush=True)
        results["rounds"].append(one)
        Path(args.results).write_text(json.dumps(results, indent=1) + "\n")
    if args.throughput_rounds:
        results["throughput"] = []
        for _ in range(args.throughput_rounds):
            pair = {"baseline": throughput(baseline, work / "tp-baseline", args.throughput_rows),
                    "cache": throughput(REPO, work / "tp-new", args.throughput_rows)}
            print(json.dumps({"throughput": pair}), flush=True)
            results["throughput"].append(pair)
            Path(args.results).write_text(json.dumps(results, indent=1) + "\n")
    Path(args.results).write_text(json.dumps(results, indent=1) + "\n")
    return results


def table(results: dict) -> str:
    """A Markdown table of the medians over the rounds."""
    rounds = results["rounds"]
    rows = [("item", "median", "rounds", "load (1 min) before/after")]

    def add(label, key, field, unit, fmt="{:.1f}"):
        values = [r[key][field] for r in rounds if key in r]
        if field == "peak_rss_mib":
            values = [max(v) if v else None for v in values]
        med = median(values)
        loads = "; ".join(f"{r[key]['load_before'][0]:.1f}/{r[key]['load_after'][0]:.1f}" for r in rounds if key in r)
        rows.append((label, (fmt.format(med) + unit) if med is not None else "did not finish",
                     ", ".join(fmt.format(v) if v is not None else "-" for v in values), loads))

    for name, n in (("small", results["baseline_rows"]), ("big", results["rows"])):
        if name == "small":
            add(f"{n:,} rows: before the cache, first step", "baseline_small", "seconds", " s")
            add(f"{n:,} rows: before the cache, peak RSS of the larger rank", "baseline_small", "peak_rss_mib",
                " MiB", "{:.0f}")
        add(f"{n:,} rows: tokenizer alone, one process", f"encode_{name}", "seconds", " s")
        add(f"{n:,} rows: cold cache, first step", f"cold_{name}", "seconds", " s")
        add(f"{n:,} rows: cached, first step", f"cached_{name}", "seconds", " s")
        add(f"{n:,} rows: cold cache, peak RSS of the larger rank", f"cold_{name}", "peak_rss_mib", " MiB", "{:.0f}")
        add(f"{n:,} rows: cached, peak RSS of the larger rank", f"cached_{name}", "peak_rss_mib", " MiB", "{:.0f}")
    for side in ("baseline", "cache"):
        values = [t[side]["samples_per_sec"] for t in results.get("throughput", [])]
        if values:
            loads = "; ".join(f"{t[side]['load_before'][0]:.1f}/{t[side]['load_after'][0]:.1f}"
                              for t in results["throughput"])
            rows.append((f"embedded default throughput, {'before the cache' if side == 'baseline' else 'with it'}",
                         f"{median(values):.1f} samples/s", ", ".join(f"{v:.1f}" for v in values), loads))
    return "\n".join("| " + " | ".join(r) + " |" + ("\n|---|---|---|---|" if i == 0 else "")
                     for i, r in enumerate(rows)) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    data = sub.add_parser("data", help="write the benchmark CSVs under /tmp/hvdtrain-text-bench")
    data.add_argument("--rows", type=int, default=1_000_000)
    data.add_argument("--baseline-rows", type=int, default=100_000)
    encode = sub.add_parser("encode", help="time the tokenizer alone on FILE")
    encode.add_argument("file")
    encode.add_argument("--max-length", type=int, default=128)
    bench = sub.add_parser("run", help="run the measurements")
    bench.add_argument("--baseline", required=True, help="checkout of the code to compare with")
    bench.add_argument("--rows", type=int, default=1_000_000)
    bench.add_argument("--baseline-rows", type=int, default=100_000)
    bench.add_argument("--rounds", type=int, default=2)
    bench.add_argument("--big-rounds", type=int, default=2, help="rounds that include the big file")
    bench.add_argument("--throughput-rounds", type=int, default=2)
    bench.add_argument("--throughput-rows", type=int, default=480, help="training sentences of the throughput runs")
    bench.add_argument("--skip-baseline", action="store_true")
    bench.add_argument("--skip-encode", action="store_true", help="leave out the tokenizer-alone timing")
    bench.add_argument("--sizes", default="small,big", help="which files: small (--baseline-rows), big (--rows)")
    bench.add_argument("--results", default=str(RESULTS), help="where the results go")
    bench.add_argument("--work", default="/tmp/hvdtrain-text-bench/work")
    report = sub.add_parser("table", help="print the Markdown table of the last results")
    report.add_argument("results", nargs="?", default=str(RESULTS))
    args = parser.parse_args()
    if args.command == "data":
        for rows in (args.rows, args.baseline_rows):
            print(generate(rows, data_file(rows)))
    elif args.command == "encode":
        print(f"{encode_alone(Path(args.file), args.max_length):.3f}")
    elif args.command == "run":
        print(table(run(args)))
    else:
        print(table(json.loads(Path(args.results).read_text())))


if __name__ == "__main__":
    main()
