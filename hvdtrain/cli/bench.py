"""`hvdtrain bench`: synthetic training throughput, per worker and in total, and scaling efficiency.

Under a launcher every worker runs it (``horovodrun -np 2 -H localhost:2 hvdtrain bench ...``);
with ``--np 1,2,4`` it starts ``horovodrun`` itself at each world size and prints the scaling table.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import click

from hvdtrain.cli.common import USER_ERRORS, fail, main
from hvdtrain.core.config import FRAMEWORKS, ConfigError
from hvdtrain.core.resolve import load_config

def _world_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise ConfigError(f"--np {text!r}: expected positive worker counts separated by commas, e.g. 1,2,4")
    return sorted(set(sizes))


def _hvdtrain_command() -> list[str]:
    script = Path(sys.executable).parent / "hvdtrain"
    if script.exists():
        return [str(script)]
    found = shutil.which("hvdtrain")
    return [found] if found else [sys.executable, "-c", "from hvdtrain.cli import main; main()"]


def _launch_each(sizes: list[int], controller: str, args: list[str]) -> list:
    """Run this benchmark under ``horovodrun -np N`` for each N; return the results."""
    from hvdtrain.tools.bench import BenchResult, format_result

    horovodrun = Path(sys.executable).parent / "horovodrun"
    launcher = str(horovodrun) if horovodrun.exists() else (shutil.which("horovodrun") or "horovodrun")
    results = []
    with tempfile.TemporaryDirectory(prefix="hvdtrain-bench-") as tmp:
        for n in sizes:
            out = Path(tmp) / f"np{n}.json"
            cmd = [launcher, "-np", str(n), "-H", f"localhost:{n}", f"--{controller}",
                   *_hvdtrain_command(), "bench", *args, "--json", str(out), "--quiet"]
            click.echo(f"hvdtrain bench: {n} worker(s): {' '.join(cmd)}")
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0 or not out.is_file():
                raise RuntimeError(f"the benchmark at {n} worker(s) failed (exit {proc.returncode}):\n"
                                   f"{(proc.stdout + proc.stderr)[-3000:]}")
            result = BenchResult.from_dict(json.loads(out.read_text()))
            click.echo(format_result(result) + "\n")
            results.append(result)
    return results


@main.command("bench")
@click.option("--framework", type=click.Choice(FRAMEWORKS), default="torch", show_default=True)
@click.option("--model", default="resnet50", show_default=True,
              help="Image model of the recipe (image-classification: small_cnn, resnet18, resnet34, resnet50, resnet101).")
@click.option("--recipe", default="image-classification", show_default=True,
              help="Recipe whose bench_model hook builds the model (see `hvdtrain recipes`).")
@click.option("--batch-size", type=int, default=32, show_default=True, help="Batch size per worker.")
@click.option("--image-size", type=click.IntRange(8, 4096), default=224, show_default=True,
              help="Square image side of the synthetic batch.")
@click.option("--channels", type=click.IntRange(1, 16), default=3, show_default=True)
@click.option("--num-warmup-batches", type=click.IntRange(0), default=10, show_default=True)
@click.option("--num-batches-per-iter", type=click.IntRange(1), default=10, show_default=True)
@click.option("--num-iters", type=click.IntRange(1), default=10, show_default=True)
@click.option("--fp16-allreduce", is_flag=True, default=None, help="Compress gradients to float16 for the allreduce.")
@click.option("--threads", type=int, default=None, help="Intra-op threads per worker (default: cores / local workers).")
@click.option("--timeline", "--timeline-file", "timeline", type=click.Path(dir_okay=False), default=None,
              help="Write Horovod's timeline to FILE on rank 0 (comm.timeline); after horovodrun spell it "
              "--timeline-file.")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="YAML or TOML config file (optim, train, comm sections apply).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override any config key, e.g. --set comm.fusion_threshold_mb=32 (repeatable).")
@click.option("--np", "world_sizes", default=None, metavar="N[,N...]",
              help="Launch horovodrun at each of these world sizes on this host and print scaling efficiency.")
@click.option("--controller", type=click.Choice(("gloo", "mpi")), default="gloo", show_default=True,
              help="With --np: horovodrun's controller.")
@click.option("--json", "json_file", type=click.Path(dir_okay=False), default=None,
              help="Also write the result (every rank's samples/s per iteration) as JSON (rank 0).")
@click.option("--quiet", is_flag=True, hidden=True)
def bench_command(framework, model, recipe, batch_size, image_size, channels, num_warmup_batches, num_batches_per_iter,
                  num_iters, fp16_allreduce, threads, timeline, config_file, overrides, world_sizes, controller,
                  json_file, quiet) -> None:
    """Synthetic training benchmark: a fixed random batch through hvdtrain's adapter (warm-up, then
    timed iterations); prints samples/s per worker (mean and 95% interval) and in total."""
    from hvdtrain.tools.bench import BenchSettings, format_result, format_scaling, run_bench
    from hvdtrain.launch import under_launcher

    try:
        config = load_config(None, config_file, overrides, recipe=recipe, framework=framework, model__name=model,
                             train__batch_size=batch_size, train__threads=threads,
                             train__fp16_allreduce=fp16_allreduce or None, comm__timeline=timeline)
        if world_sizes is not None:
            if under_launcher():
                raise ConfigError("--np starts horovodrun itself; run `hvdtrain bench --np ...` without a launcher")
            sizes = _world_sizes(world_sizes)
            args = [f"--framework={framework}", f"--model={model}", f"--recipe={recipe}", f"--batch-size={batch_size}",
                    f"--image-size={image_size}", f"--channels={channels}",
                    f"--num-warmup-batches={num_warmup_batches}", f"--num-batches-per-iter={num_batches_per_iter}",
                    f"--num-iters={num_iters}"]
            args += ["--fp16-allreduce"] if fp16_allreduce else []
            args += [f"--threads={threads}"] if threads else []
            args += [f"--timeline-file={Path(timeline).absolute()}"] if timeline else []
            args += [f"--config={Path(config_file).absolute()}"] if config_file else []
            args += [f"--set={o}" for o in overrides]
            results = _launch_each(sizes, controller, args)
            click.echo(format_scaling(results))
            if json_file:
                Path(json_file).write_text(json.dumps([r.to_dict() for r in results], indent=1))
            return
        settings = BenchSettings(image_size, channels, num_warmup_batches, num_batches_per_iter, num_iters)
        result, rank = run_bench(config, settings)
    except USER_ERRORS as exc:
        fail(exc)
        return
    if rank == 0:
        if not quiet:
            click.echo(format_result(result))
        if json_file:
            Path(json_file).parent.mkdir(parents=True, exist_ok=True)
            Path(json_file).write_text(json.dumps(result.to_dict(), indent=1))
