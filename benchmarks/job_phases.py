"""CPU-seconds of one tiny 2-rank `horovodrun` job of the image recipe, by phase and by process.

Each rank runs the ``hvdtrain recipe`` CLI under a probe that reads its own CPU time (user+sys from
/proc/self/stat, which load distorts far less than wall time) at every phase boundary: imports,
``hvd.init``, the recipe's build, ``prepare``, the first step, the rest of the epoch, the start of
the exit handlers, and, from a small parent process around the rank, everything after that (the
interpreter's teardown) and the rank's child processes (the data decoding workers). The launcher's
share is the job's total (this process's children) less the ranks'::

    .venv/bin/python benchmarks/job_phases.py torch|tensorflow [SOURCE_ROOT]

SOURCE_ROOT (default: this checkout) is put first on PYTHONPATH, so two trees can be compared
(``git archive REV | tar -x -C /tmp/rev`` gives one), interleaved, in one sitting.
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TICK = os.sysconf("SC_CLK_TCK")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _own_cpu() -> float:
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rank_parent(prefix: str, command: list[str]) -> int:
    """Run one rank; write its whole CPU time (teardown and waited-for children included)."""
    code = subprocess.call(command)
    Path(f"{prefix}.{os.environ.get('HOROVOD_RANK', 'x')}.total").write_text(f"{_children_cpu():.3f}\n")
    return code


def rank(prefix: str, cli_args: list[str]) -> None:
    """The hvdtrain CLI with phase marks (its own CPU time at each boundary)."""
    marks = [("interpreter start", _own_cpu())]

    def mark(name: str) -> None:
        marks.append((name, _own_cpu()))

    def dump() -> None:  # registered first: the last exit handler to run
        mark("exit handlers (hvdtrain's, Horovod's, the framework's)")
        marks.append(("children", _children_cpu()))
        Path(f"{prefix}.{os.environ.get('HOROVOD_RANK', 'x')}.json").write_text(json.dumps(marks))

    atexit.register(dump)
    import hvdtrain
    import hvdtrain.core.loop as loop
    import hvdtrain.trainer as trainer
    from hvdtrain.cli import main
    mark("import hvdtrain + its CLI")

    load_adapter = loop.load_adapter

    def probed_adapter(*args, **kwargs):
        adapter = load_adapter(*args, **kwargs)
        mark("import the framework + adapter")
        init, prepare = adapter.init, adapter.prepare

        def probed_init(config):
            context = init(config)
            mark("hvd.init")
            return context

        def probed_prepare(task, config):
            mark("build the recipe's model and data")
            prepare(task, config)
            mark("prepare: optimizer, broadcast")

        adapter.init, adapter.prepare = probed_init, probed_prepare
        return adapter

    class Probe(hvdtrain.Callback):
        steps = 0

        def on_train_begin(self, ctx, info):
            mark("plan the start, callbacks")

        def on_step_end(self, epoch, step, logs):
            Probe.steps += 1
            if Probe.steps == 1:
                mark("first step")

        def on_epoch_end(self, *args, **kwargs):
            mark(f"rest of the epoch ({Probe.steps} steps), evaluation, checkpoint")

    default_callbacks = trainer.default_callbacks
    loop.load_adapter = probed_adapter
    trainer.default_callbacks = lambda config: [*default_callbacks(config), Probe()]
    main(args=cli_args, prog_name="hvdtrain")


def job(framework: str, root: str) -> None:
    """Launch the probed job and print the phases."""
    out = Path(tempfile.mkdtemp(prefix="job_phases_"))
    prefix = str(out / "probe")
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]), "TF_CPP_MIN_LOG_LEVEL": "2",
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env = {k: v for k, v in env.items() if not k.startswith("HOROVOD_")}
    me = str(Path(__file__).resolve())
    cli = ["recipe", "image-classification", "--framework", framework, "--output", str(out / "run"), "--epochs", "1",
           "--batch-size", "32", "--set", "data.max_train_samples=128", "--set", "data.max_val_samples=64",
           "--set", "train.log_every=0"]
    started, before = time.monotonic(), _children_cpu()
    proc = subprocess.run([str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, me,
                           "--rank-parent", prefix, sys.executable, me, "--rank", prefix, *cli],
                          env=env, capture_output=True, text=True)
    total = _children_cpu() - before
    if proc.returncode:
        sys.exit(f"the job failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    print(f"{framework} ({root}): wall {time.monotonic() - started:.1f} s, job {total:.2f} CPU-s")
    ranks = 0.0
    for r in (0, 1):
        marks = json.loads(Path(f"{prefix}.{r}.json").read_text())
        whole = float(Path(f"{prefix}.{r}.total").read_text())
        children = marks.pop()[1]
        ranks += whole
        print(f"  rank {r}: {whole:.2f} CPU-s")
        previous = 0.0
        for name, cpu in marks:
            print(f"    {cpu - previous:6.2f}  {name}")
            previous = cpu
        print(f"    {whole - previous - children:6.2f}  interpreter teardown")
        print(f"    {children:6.2f}  child processes (data decoding workers)")
    print(f"  launcher (horovodrun, its helper processes, the rendezvous): {total - ranks:.2f} CPU-s")


if __name__ == "__main__":
    if sys.argv[1] == "--rank-parent":
        sys.exit(rank_parent(sys.argv[2], sys.argv[3:]))
    elif sys.argv[1] == "--rank":
        rank(sys.argv[2], sys.argv[3:])
    else:
        job(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else str(REPO))
