"""Sharded optimizer state in TensorFlow (``parallel.shard_optimizer``): memory per rank against data
parallelism, and the model that did not fit (issue 26).

``measure``: the BERT recipe (TensorFlow, AdamW; the embedded MiniLM unless ``--model DIR``) on NP
ranks, once per mode (none, optimizer, gradients; rounds alternate the order), each launch a real
``horovodrun`` job that appends one JSON line per run to OUT: per rank the bytes of parameters,
of the gradients the exchange leaves for the update (data parallelism and ``optimizer``: the whole
averaged gradient; ``gradients``: this rank's slice), of optimizer state (the slots), peak resident
memory of the whole process (``ru_maxrss``: loading the pretrained weights may set it) and of
training alone (``VmHWM`` reset when training starts, the model and optimizer state built), the
resident memory then, peak virtual size (``VmPeak``), samples/s and CPU-seconds per step after the
3rd step; ``summary OUT`` prints them per round with the ratios to data parallelism::

    python benchmarks/sharded_memory_tf.py measure runs/sharded_tf.jsonl --np 2

``fit``: a BERT-base-sized model (hidden 768, 12 layers, random weights written from a
``transformers.BertConfig``, the MiniLM's real tokenizer) under a per-process limit, then data
parallelism and ``--mode`` (``optimizer`` by default) run under it; the line records whether each
trained (exit status, each rank's last phase: where a killed rank died, the last error line, with
``--cgroup`` each worker's cgroup peak and OOM kills). The limit: with ``--cgroup`` each worker's
resident memory (a memory cgroup of its own, ``--limit-mb``; TensorFlow reserves address space far
beyond what it touches, so this is the limit that means memory); else its address space
(``prlimit --as``), by default halfway between the two modes' unlimited ``VmPeak`` (measured first,
each mode once, kept in ``WORK/probe.jsonl`` and reused). The TensorFlow model that did not fit::

    python benchmarks/sharded_memory_tf.py fit runs/sharded_tf_fit.jsonl --np 4 --samples 64 \
        --mode gradients --cgroup --limit-mb 3400

``phases``: each mode once with a checkpoint at the end of the epoch, each rank's peak resident
memory per phase of the run (imports, hvd.init, model and data, prepare, the initial broadcast, the
first step's trace, the steps, evaluation, the checkpoint's gather and save, rank 0's export)::

    python benchmarks/sharded_memory_tf.py phases runs/sharded_tf_phases.jsonl --np 2 --samples 32 --model bert-base

``worker`` is what the jobs run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from common import cpu_seconds

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MODES = ("none", "optimizer", "gradients")
COMMON = ["data.max_val_samples=16", "train.epochs=1", "train.log_every=0", "checkpoint.enabled=false",
          "train.tensorboard=false", "train.progress_bar=false", "train.threads=1", "text.max_length=64"]


def status_kib(field: str) -> int:
    """A field of ``/proc/self/status`` in KiB (``VmPeak``, ``VmRSS``, ``VmHWM``...)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return -1


def vm_peak_kib() -> int:
    """This process's peak virtual size (what ``prlimit --as`` limits)."""
    return status_kib("VmPeak")


def nbytes(variables) -> int:
    """Bytes of these variables' values."""
    import numpy as np

    return sum(int(np.prod(v.shape)) * np.dtype(str(v.dtype)).itemsize for v in variables)



PHASE_LINE = "sharded_memory_tf phase"  # what a worker prints as each phase begins (the log: where it died)
CGROUP_LINE = "sharded_memory_tf cgroup"  # the memory cgroup's figures after a limited worker's end


class PhaseMarks:
    """Peak resident memory of this process per phase of a run: each :meth:`mark` closes the current
    phase with its peak RSS (``VmHWM`` since the previous mark), its RSS at the end, ``VmPeak`` then
    and its seconds, and resets the peak (Linux ``clear_refs``) for the next phase. A phase entered
    again (the steps after the first) adds to its row."""

    def __init__(self, first: str) -> None:
        self.rows: list[dict] = []
        self.phase, self.started = first, time.perf_counter()

    def mark(self, phase: str) -> None:
        """End the current phase; ``phase`` begins (nothing happens if it is the current one)."""
        if phase == self.phase:
            return
        now = time.perf_counter()
        row = {"phase": self.phase, "peak_rss_kib": status_kib("VmHWM"), "rss_end_kib": status_kib("VmRSS"),
               "vm_peak_kib": vm_peak_kib(), "sec": now - self.started}
        if self.rows and self.rows[-1]["phase"] == self.phase:
            last = self.rows[-1]
            row["peak_rss_kib"] = max(row["peak_rss_kib"], last["peak_rss_kib"])
            row["sec"] += last["sec"]
            self.rows[-1] = row
        else:
            self.rows.append(row)
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        self.phase, self.started = phase, now
        print(f"{PHASE_LINE} rank {os.environ.get('HOROVOD_RANK', '0')}: {phase}", file=sys.stderr, flush=True)


def instrument_phases(marks: PhaseMarks) -> None:
    """Mark the TensorFlow adapter's phases (hvd.init, prepare, the initial broadcast, the first
    train step: the trace, the steps, evaluation, the checkpoint's gather and save) in ``marks``."""
    from hvdtrain.tensorflow.adapter import TensorFlowAdapter

    def wrap(name: str, during, after: str | None) -> None:
        original = getattr(TensorFlowAdapter, name)
        calls = [0]

        def wrapped(self, *args, **kwargs):
            marks.mark(during(calls[0]))
            calls[0] += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                if after:
                    marks.mark(after)
        setattr(TensorFlowAdapter, name, wrapped)

    wrap("init", lambda n: "hvd.init", "model and data built")
    wrap("prepare", lambda n: "prepare (optimizer state, shards)", "before the broadcast")
    wrap("broadcast_state", lambda n: "initial broadcast", "before the first step")
    wrap("train_step", lambda n: "first step (trace)" if n == 0 else "steps", None)
    wrap("eval_step", lambda n: "evaluation", None)
    wrap("gather_state", lambda n: "checkpoint gather", "checkpoint save")
    wrap("save_state", lambda n: "checkpoint save", "after the checkpoint")


def worker(out: str, label: str, overrides: list[str]) -> None:
    """One training run of the BERT recipe (TensorFlow) in this Horovod job; rank 0 appends the line.
    With ``HVDTRAIN_BENCH_PHASES=1``: each rank's peak RSS per phase (:class:`PhaseMarks`)."""
    import horovod.tensorflow as hvd

    import hvdtrain
    from hvdtrain.core.callbacks import Callback

    marks = PhaseMarks("imports") if os.environ.get("HVDTRAIN_BENCH_PHASES") == "1" else None
    if marks is not None:
        import tensorflow  # noqa: F401  (in the imports' phase)
        instrument_phases(marks)
        marks.mark("config")

    class StepClock(Callback):
        """Wall time and this process's CPU time at the end of every step; at the start of training
        (the model and the optimizer state built) the resident memory, and the peak reset to it."""

        def __init__(self) -> None:
            self.times: list[tuple[float, float]] = []
            self.rss_at_start_kib = -1

        def on_train_begin(self, ctx, info) -> None:
            self.rss_at_start_kib = status_kib("VmRSS")
            if marks is None:  # (the phases reset the peak at their own marks)
                Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux: reset the peak RSS)

        def on_step_end(self, epoch, step, logs) -> None:
            self.times.append((time.perf_counter(), cpu_seconds(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt))

        def on_epoch_end(self, epoch, record) -> None:
            if marks is not None:
                marks.mark("export")  # next: the recipe's export on rank 0 (on_train_end)

    recipe = hvdtrain.get_recipe("bert-finetune")
    config = hvdtrain.load_config(recipe.defaults, overrides=overrides, recipe="bert-finetune",
                                  framework="tensorflow")
    clock = StepClock()
    trainer = hvdtrain.Trainer(config, callbacks=[clock])
    started = time.perf_counter()
    result = trainer.fit()
    if marks is not None:
        marks.mark("end")
    adapter = trainer.adapter
    params = nbytes(adapter.trainable)
    sharded = getattr(adapter.optimizer_state, "sharded", None)  # hvdtrain.tensorflow.exchanges.ShardedState's
    if sharded is None:
        optimizer = nbytes([v for v in adapter.optimizer.variables if len(v.shape) > 0])
        grads = params
    else:
        optimizer = sharded.state_bytes()
        whole = sum(g.padded * g.dtype.size for g in sharded.groups)
        grads = whole if sharded.mode == "optimizer" else whole // sharded.size
    steps = len(clock.times)  # after the 3rd step (the first ones trace the step): this rank's CPU time
    cpu_per_step = (clock.times[-1][1] - clock.times[2][1]) / (steps - 3) if steps > 3 else None
    # page faults (minor: memory first touched) per step: a new large buffer per step pays them
    faults_per_step = (clock.times[-1][2] - clock.times[2][2]) / (steps - 3) if steps > 3 else None
    mine = {"rank": hvd.rank(), "param_bytes": params, "grad_bytes": grads, "optimizer_bytes": optimizer,
            "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "vm_peak_kib": vm_peak_kib(),
            "cpu_sec_per_step": cpu_per_step, "minor_faults_per_step": faults_per_step,
            "rss_at_train_start_kib": clock.rss_at_start_kib,
            "train_peak_rss_kib": status_kib("VmHWM"), "phases": marks.rows if marks is not None else None}
    everyone = hvd.allgather_object(mine)  # distributed
    if hvd.rank() == 0:
        global_batch = config.train.batch_size * hvd.size()
        rate = (steps - 3) * global_batch / (clock.times[-1][0] - clock.times[2][0]) if steps > 3 else None
        row = {"label": label, "overrides": overrides, "world_size": hvd.size(), "ranks": everyone,
               "fit_sec": time.perf_counter() - started, "val_accuracy": result.final.get("val_accuracy"),
               "steps": steps, "samples_per_sec": rate}
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps({k: v for k, v in row.items() if k != "ranks"}))


#: Horovod's controller for the launches (``--controller``; horovodrun's own default is MPI where
#: Horovod was built with it, as here).
CONTROLLER = ["--gloo"]


def launch(out: Path, label: str, overrides: list[str], np_: int, limit_kib: int | None = None,
           timeout: float = 3600, phases: bool = False, cgroup: bool = False) -> subprocess.CompletedProcess:
    """A real ``horovodrun --gloo`` (or ``--mpi``) job running :func:`worker`, each worker under ``limit_kib``:
    ``prlimit --as`` (address space), or with ``cgroup`` a memory cgroup of its own
    (:func:`run_in_cgroup`: resident memory); ``phases``: each rank's peak RSS per phase."""
    command = [str(BIN / "python"), __file__, "worker", str(out), label, *overrides]
    if limit_kib is not None and cgroup:
        command = [str(BIN / "python"), __file__, "cgroup", str(limit_kib * 1024), *command]
    elif limit_kib is not None:
        command = [shutil.which("prlimit"), f"--as={limit_kib * 1024}", *command]
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           "HVDTRAIN_BENCH_PHASES": "1" if phases else "0"}
    return subprocess.run([str(BIN / "horovodrun"), "-np", str(np_), "-H", f"localhost:{np_}", *CONTROLLER, *command],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def memory_cgroups() -> tuple[Path, str, str]:
    """This process's memory cgroup folder, its limit file and its peak file: cgroup v2
    (``memory.max``, ``memory.peak``) or v1 (``memory.limit_in_bytes``, ``memory.max_usage_in_bytes``)."""
    v1 = Path("/sys/fs/cgroup/memory")
    if (v1 / "memory.limit_in_bytes").exists():
        return v1, "memory.limit_in_bytes", "memory.max_usage_in_bytes"
    return Path("/sys/fs/cgroup"), "memory.max", "memory.peak"


def run_in_cgroup(limit_bytes: int, command: list[str]) -> int:
    """Run ``command`` in a new memory cgroup limited to ``limit_bytes`` (resident memory and page
    cache: the kernel reclaims the cache first, then the OOM killer ends the process); print the
    cgroup's peak usage, limit hits and OOM kills; remove the cgroup; the command's exit status
    (128 + signal when killed)."""
    root, limit_file, peak_file = memory_cgroups()
    group = root / f"hvdtrain-fit-{os.getpid()}"
    group.mkdir()
    try:
        (group / limit_file).write_text(str(limit_bytes))
        child = subprocess.Popen(command, preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())))
        # horovodrun ends the other workers with SIGTERM when one fails: pass it on, then clean up
        signal.signal(signal.SIGTERM, lambda signum, frame: child.terminate())
        code = child.wait()
        figures = {"rank": os.environ.get("HOROVOD_RANK"), "limit_bytes": limit_bytes, "exit": code}
        for name in (peak_file, "memory.failcnt", "memory.oom_control", "memory.events"):
            if (group / name).exists():  # a number, or "key value" lines (oom_kill: the OOM killer's kills)
                lines = [line.split() for line in (group / name).read_text().splitlines() if line.strip()]
                figures[name] = int(lines[0][0]) if len(lines[0]) == 1 else {k: int(v) for k, v in lines}
        print(f"{CGROUP_LINE} {json.dumps(figures)}", file=sys.stderr, flush=True)
    finally:
        for _ in range(50):  # the last task leaves the cgroup asynchronously
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    return code if code >= 0 else 128 - code


def _overrides(args: argparse.Namespace, mode: str, output: Path) -> list[str]:
    model = [f"model.name={args.model}"] if args.model else []
    return [*COMMON, *model, f"data.max_train_samples={args.samples}", f"train.batch_size={args.batch}",
            "optim.name=adamw", f"parallel.shard_optimizer={mode}", f"output={output}"]


def measure(args: argparse.Namespace) -> None:
    """Every mode, ``args.rounds`` times, the order alternating."""
    modes = tuple(args.modes.split(","))
    for round_ in range(args.rounds):
        for mode in modes if round_ % 2 == 0 else modes[::-1]:
            output = Path(args.work) / f"measure-{mode}"
            shutil.rmtree(output, ignore_errors=True)
            job = launch(Path(args.out), f"{mode}-np{args.np}-r{round_ + 1}", _overrides(args, mode, output), args.np)
            if job.returncode:
                sys.exit(f"{mode}: the job failed ({job.returncode}):\n{job.stdout[-3000:]}\n{job.stderr[-3000:]}")


def phases(args: argparse.Namespace) -> None:
    """Each mode once (``--modes``) with a checkpoint at the epoch's end, each rank's peak RSS per
    phase (:class:`PhaseMarks`) appended to OUT and printed as a table (MiB, rank 0 / rank 1 ...)."""
    if args.model == "bert-base":
        args.model = str(bert_base_dir(Path(args.work) / "bert-base-sized"))
    out = Path(args.out)
    for mode in args.modes.split(","):
        output = Path(args.work) / f"phases-{mode}"
        shutil.rmtree(output, ignore_errors=True)
        overrides = [*_overrides(args, mode, output), "checkpoint.enabled=true"]
        job = launch(out, f"phases-{mode}-np{args.np}", overrides, args.np, phases=True)
        if job.returncode:
            sys.exit(f"{mode}: the job failed ({job.returncode}):\n{job.stdout[-3000:]}\n{job.stderr[-3000:]}")
        print_phases(json.loads(out.read_text().splitlines()[-1]), mode)


def print_phases(row: dict, mode: str) -> None:
    """One ``phases`` line as a table."""
    print(f"{mode}: phase, peak RSS MiB per rank (RSS at its end), VmPeak MiB per rank, seconds (rank 0)")
    names = list(dict.fromkeys(p["phase"] for r in row["ranks"] for p in r["phases"]))
    for name in names:  # (rank 0 alone saves the checkpoint)
        per_rank = [next((p for p in r["phases"] if p["phase"] == name), None) for r in row["ranks"]]
        rss = " / ".join(f"{p['peak_rss_kib'] / 1024:,.0f} ({p['rss_end_kib'] / 1024:,.0f})" if p else "-"
                         for p in per_rank)
        vm = " / ".join(f"{p['vm_peak_kib'] / 1024:,.0f}" if p else "-" for p in per_rank)
        print(f"  {name:<34} {rss}   {vm}   {(per_rank[0] or per_rank[-1])['sec']:.1f}")


def bert_base_dir(directory: Path) -> Path:
    """A BERT-base-sized model folder (random weights from a ``transformers.BertConfig``) with the
    embedded MiniLM's tokenizer (real WordPiece, vocabulary 30522)."""
    import torch
    import transformers

    from hvdtrain_recipes.bert_finetune import pretrained

    if (directory / "config.json").is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(pretrained.embedded_model_dir() / pretrained.TOKENIZER_FILE, directory / pretrained.TOKENIZER_FILE)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                     intermediate_size=3072, max_position_embeddings=512)
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(directory)
    return directory


MEMORY_ERRORS = ("MemoryError", "bad_alloc", "ResourceExhausted", "Cannot allocate", "OOM", "out of memory",
                 "Resource temporarily unavailable", "failed to allocate", "Failed to allocate")


def _last_error(job: subprocess.CompletedProcess) -> str:
    """Why a job failed: its first out-of-memory line, else its last error line."""
    lines = (job.stdout + job.stderr).splitlines()
    memory = [ln for ln in lines if any(word in ln for word in MEMORY_ERRORS)]
    errors = [ln for ln in lines if "Error" in ln or "error" in ln or "Killed" in ln]
    return (memory[:1] or errors[-1:] or [""])[0][-300:]


def fit(args: argparse.Namespace) -> None:
    """Data parallelism against ``--mode`` sharding under one per-process limit: address space
    (``prlimit --as``), or with ``--cgroup`` resident memory (a memory cgroup per worker, the limit
    ``--limit-mb``); each run's record names every rank's last phase (where a killed rank died)."""
    args.model = args.model or str(bert_base_dir(Path(args.work) / "bert-base-sized"))
    modes = ("none", args.mode)
    out = Path(args.out)
    limit = args.limit_mb * 1024 if args.limit_mb else None
    if args.cgroup and limit is None:
        sys.exit("fit --cgroup needs --limit-mb (a resident-memory limit per worker, MiB)")
    peaks = {}
    if limit is None:  # each mode's unlimited peak virtual size first: the limit lies between them
        probe = Path(args.work) / "probe.jsonl"
        probed = {json.loads(line)["label"] for line in probe.read_text().splitlines()} if probe.exists() else set()
        for mode in modes:
            if f"probe-{mode}" in probed:
                continue
            job = launch(probe, f"probe-{mode}", _overrides(args, mode, Path(args.work) / f"probe-{mode}"), args.np)
            if job.returncode:
                sys.exit(f"probe {mode} failed ({job.returncode}):\n{job.stdout[-3000:]}\n{job.stderr[-3000:]}")
        for line in probe.read_text().splitlines():
            row = json.loads(line)
            peaks[row["label"].split("-", 1)[1]] = max(r["vm_peak_kib"] for r in row["ranks"])
        limit = (peaks["none"] + peaks[args.mode]) // 2
    result = {"label": f"fit-np{args.np}", "model": args.model, "limit_kib": limit,
              "limit": "cgroup memory" if args.cgroup else "prlimit --as", "unlimited_vm_peak_kib": peaks,
              "samples": args.samples, "runs": {}}
    for mode in modes:
        shutil.rmtree(Path(args.work) / f"fit-{mode}", ignore_errors=True)
        job = launch(Path(args.work) / "fit-runs.jsonl", f"fit-{mode}",
                     _overrides(args, mode, Path(args.work) / f"fit-{mode}"), args.np, limit_kib=limit,
                     phases=True, cgroup=args.cgroup)
        log = job.stdout + job.stderr
        (Path(args.work) / f"fit-{mode}.log").write_text(log)  # the failure's whole story
        last_phase: dict[str, str] = {}
        cgroups = []
        for line in log.splitlines():  # horovodrun prefixes each line with [rank]<stream>:
            if PHASE_LINE in line:
                rank, _, phase = line.split(PHASE_LINE + " rank ", 1)[1].partition(": ")
                last_phase[rank] = phase
            elif CGROUP_LINE in line:
                cgroups.append(json.loads(line.split(CGROUP_LINE, 1)[1]))
        result["runs"][mode] = {"returncode": job.returncode, "trained": job.returncode == 0,
                                "last_phase": last_phase, "cgroups": cgroups,
                                "last_error": _last_error(job) if job.returncode else ""}
    with open(out, "a") as f:
        f.write(json.dumps(result) + "\n")
    print(json.dumps(result, indent=1))


def summary(args: argparse.Namespace) -> None:
    """Per round: each mode's samples/s (after the 3rd step) and its ratio to data parallelism's in
    the same round, CPU-seconds per step (mean over ranks) and the ratio, peak RSS per rank (MiB)."""
    rows = [json.loads(line) for line in Path(args.out).read_text().splitlines() if line.strip()]
    rounds: dict[str, dict[str, dict]] = {}
    for row in rows:
        mode, _, rest = row["label"].partition("-np")  # none-np2-r1: mode none, round r1
        rounds.setdefault(rest.partition("-")[2] or "r1", {})[mode] = row
    for round_, modes in rounds.items():
        base = modes.get("none")
        for mode, row in modes.items():
            cpu = [r["cpu_sec_per_step"] for r in row["ranks"] if r.get("cpu_sec_per_step") is not None]
            cpu_mean = sum(cpu) / len(cpu) if cpu else None
            faults = [r["minor_faults_per_step"] for r in row["ranks"] if r.get("minor_faults_per_step") is not None]
            line = {"round": round_, "mode": mode, "samples_per_sec": row.get("samples_per_sec"),
                    "cpu_sec_per_step": cpu_mean,
                    "minor_faults_per_step": round(sum(faults) / len(faults)) if faults else None,
                    "peak_rss_mib": [round(r["peak_rss_kib"] / 1024) for r in row["ranks"]],
                    "train_peak_rss_mib": [round(r.get("train_peak_rss_kib", 0) / 1024) for r in row["ranks"]],
                    "rss_at_train_start_mib": [round(r.get("rss_at_train_start_kib", 0) / 1024) for r in row["ranks"]],
                    "grad_mib": row["ranks"][0]["grad_bytes"] / 2**20,
                    "optimizer_mib": row["ranks"][0]["optimizer_bytes"] / 2**20}
            if base is not None and row.get("samples_per_sec") and base.get("samples_per_sec"):
                line["rate_of_none"] = row["samples_per_sec"] / base["samples_per_sec"]
                base_cpu = [r["cpu_sec_per_step"] for r in base["ranks"] if r.get("cpu_sec_per_step")]
                if cpu_mean and base_cpu:
                    line["cpu_of_none"] = cpu_mean / (sum(base_cpu) / len(base_cpu))
            print(json.dumps(line))


def main() -> None:
    if sys.argv[1:2] == ["worker"]:
        worker(sys.argv[2], sys.argv[3], sys.argv[4:])
        return
    if sys.argv[1:2] == ["cgroup"]:  # cgroup LIMIT_BYTES COMMAND...: what fit --cgroup runs per worker
        sys.exit(run_in_cgroup(int(sys.argv[2]), sys.argv[3:]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("measure", "fit", "summary", "phases"))
    parser.add_argument("out", help="JSON lines file the results are appended to")
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--controller", choices=("gloo", "mpi"), default="gloo",
                        help="Horovod's controller: horovodrun --gloo or --mpi")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--modes", default=",".join(MODES), help="measure: these modes, comma-separated")
    parser.add_argument("--model", default=None, help="model folder (measure: the embedded MiniLM by default; "
                        "phases: 'bert-base' for the BERT-base-sized model fit uses)")
    parser.add_argument("--samples", type=int, default=64, help="training samples (steps = samples / np / batch)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--limit-mb", type=int, default=None, help="fit: this limit per worker (MiB)")
    parser.add_argument("--cgroup", action="store_true",
                        help="fit: limit each worker's resident memory (a memory cgroup each), not its address space")
    parser.add_argument("--mode", default="optimizer", choices=MODES[1:], help="fit: the sharded mode tried")
    parser.add_argument("--work", default="runs/sharded_memory_tf", help="scratch folder for outputs and the model")
    args = parser.parse_args()
    CONTROLLER[:] = [f"--{args.controller}"]
    Path(args.work).mkdir(parents=True, exist_ok=True)
    {"measure": measure, "fit": fit, "summary": summary, "phases": phases}[args.what](args)


if __name__ == "__main__":
    main()
