"""`hvdtrain bench` and the `comm` options under real `horovodrun -np 2 -H localhost:2`.

* torch bench (Gloo) with comm.overlap=always, comm.fusion_threshold_mb=0, comm.cycle_time_ms=40 and
  cycle marks: rank 0 alone prints the per-worker and total lines; the JSON holds both ranks' rates;
  Horovod's timeline shows every gradient reduced on its own (no fusion-buffer copies) and cycles
  >= 40 ms apart.
* TensorFlow bench (Gloo) with fp16 compression and autotune: every gradient allreduce in the
  timeline is float16 (half the bytes), gradients are fused (default threshold), and Horovod
  started the autotune log.
* `hvdtrain recipe --timeline-file` with comm.overlap=never: a parseable timeline in which every torch
  parameter's gradient is part of one grouped allreduce per step.
* Adasum (MPI, both frameworks): the run learns MNIST and parameters are identical on both ranks;
  under Gloo it is refused with a message naming MPI.
* `hvdtrain bench --np 1,2` prints a scaling table.
"""

import json
import statistics

import pytest

from jobs import REPO, hvdtrain_cli, horovodrun, run
from hvdtrain.tools import timeline

TINY_BENCH = ["--model", "small_cnn", "--image-size", "16", "--channels", "1", "--batch-size", "8",
              "--num-warmup-batches", "1", "--num-batches-per-iter", "2", "--num-iters", "3", "--threads", "1",
              "--set", "model.num_classes=10"]
WORKER = REPO / "tests" / "distributed" / "workers" / "comm_options.py"


def gradient_allreduces(path, exclude=("hvdtrain.",)):
    acts = timeline.activities(timeline.load_events(path))
    ops = [a for a in timeline.collectives(acts) if a.name == "ALLREDUCE"
           and not any(a.tensor.startswith("allreduce." + e) for e in exclude)]
    return acts, ops


@pytest.mark.distributed
def test_torch_bench_no_fusion_and_slow_cycles(tmp_path):
    out, trace = tmp_path / "bench.json", tmp_path / "timeline.json"
    proc = horovodrun([hvdtrain_cli(), "bench", "--framework", "torch", *TINY_BENCH, "--json", out,
                       "--timeline-file", trace, "--set", "comm.overlap=always", "--set", "comm.fusion_threshold_mb=0",
                       "--set", "comm.cycle_time_ms=40", "--set", "comm.timeline_mark_cycles=true"], timeout=300)
    assert proc.stdout.count("Samples/s per worker:") == 1
    assert proc.stdout.count("Total samples/s on 2 worker(s):") == 1
    result = json.loads(out.read_text())
    assert result["world_size"] == 2 and len(result["rank_rates"]) == 2
    assert all(len(rates) == 3 and min(rates) > 0 for rates in result["rank_rates"])
    assert result["comm"]["fusion_threshold_mb"] == 0

    acts, ops = gradient_allreduces(trace)
    assert len({a.tensor for a in ops}) == 8  # SmallCNN: 2 conv + 2 linear layers, weight and bias each
    assert all(a.args["dtype"] == "float32" for a in ops)
    assert not [a for a in acts if a.name == "MEMCPY_IN_FUSION_BUFFER"], "fusion threshold 0 still fused"
    marks = timeline.cycle_marks(timeline.load_events(trace))
    gaps = [b - a for a, b in zip(marks, marks[1:])]
    assert len(gaps) > 10 and statistics.median(gaps) >= 0.036, statistics.median(gaps)


@pytest.mark.distributed
def test_tensorflow_bench_fp16_fused_autotune(tmp_path):
    out, trace, tune_log = tmp_path / "bench.json", tmp_path / "timeline.json", tmp_path / "autotune.csv"
    horovodrun([hvdtrain_cli(), "bench", "--framework", "tensorflow", *TINY_BENCH, "--json", out, "--fp16-allreduce",
                "--timeline-file", trace, "--set", "comm.autotune=true", "--set", f"comm.autotune_log={tune_log}"],
               timeout=300)
    result = json.loads(out.read_text())
    assert result["fp16_allreduce"] and result["world_size"] == 2
    acts, ops = gradient_allreduces(trace)
    assert len({a.tensor for a in ops}) == 8
    assert {a.args["dtype"] for a in ops} == {"float16"}
    params = (1 * 32 * 9 + 32) + (32 * 64 * 9 + 64) + (64 * 8 * 8 * 128 + 128) + (128 * 10 + 10)
    assert sum(a.nbytes for a in ops) / (len(ops) / 8) == 2 * params  # bytes per step: 2 per parameter
    assert [a for a in acts if a.name == "MEMCPY_IN_FUSION_BUFFER"], "default fusion threshold did not fuse"
    assert tune_log.read_text().startswith("hierarchical_allreduce,")


@pytest.mark.distributed
def test_recipe_timeline_file(tmp_path):
    trace = tmp_path / "trace" / "timeline.json"
    horovodrun([hvdtrain_cli(), "recipe", "image-classification", "--framework", "torch", "--output", tmp_path / "run",
                "--epochs", "1", "--timeline-file", trace, "--set", "data.max_train_samples=256",
                "--set", "data.max_val_samples=64", "--set", "train.log_every=0", "--set", "comm.overlap=never",
                "--set", "checkpoint.enabled=false", "--set", "train.tensorboard=false"], timeout=300)
    json.loads(trace.read_text())  # complete JSON once the job has ended
    # without overlap torch reduces its flat gradient buffer (comm.flat_gradients): one in-place
    # allreduce per update, all 8 gradients in it, named by hvdtrain
    _, ops = gradient_allreduces(trace, exclude=("hvdtrain.zero", "hvdtrain.sums", "hvdtrain.coll"))
    flat = [a for a in ops if a.tensor == "allreduce.hvdtrain.flat.grads"]
    assert len(flat) >= 2, sorted({a.tensor for a in ops})  # 256 samples / 2 ranks / batch 64 = 2 updates
    assert {(a.args["dtype"], a.args["shape"]) for a in flat} == {("float32", "[1625866]")}  # every parameter of the CNN
    assert not [a for a in ops if "features.0.weight" in a.tensor]  # no per-gradient or fused-group allreduce


@pytest.mark.distributed
@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_adasum_learns_and_keeps_ranks_identical(tmp_path, framework):
    report = tmp_path / "report.json"
    horovodrun(["python", WORKER, report, framework, f"output={tmp_path / 'run'}", "comm.reduction=adasum",
                "optim.lr_scaling=none", "train.epochs=1", "train.batch_size=32", "data.max_train_samples=2000",
                "data.max_val_samples=500", "train.log_every=0", "train.threads=1", "checkpoint.enabled=false",
                "train.tensorboard=false", "train.progress_bar=false"],
               controller="mpi", timeout=400)
    data = json.loads(report.read_text())
    assert data["world_size"] == 2
    assert data["fingerprints"][0] == data["fingerprints"][1]
    assert data["history"][-1]["val_accuracy"] >= 0.8, data["history"]


@pytest.mark.distributed
def test_adasum_under_gloo_is_refused():
    proc = horovodrun([hvdtrain_cli(), "bench", "--framework", "torch", *TINY_BENCH,
                       "--set", "comm.reduction=adasum"], check=False, timeout=300)
    assert proc.returncode != 0
    assert "comm.reduction: 'adasum' needs Horovod's MPI controller" in proc.stdout + proc.stderr


@pytest.mark.distributed
def test_bench_scaling_table(tmp_path):
    out = tmp_path / "scaling.json"
    proc = run([hvdtrain_cli(), "bench", "--framework", "torch", *TINY_BENCH, "--np", "1,2", "--json", out],
               timeout=300)
    assert "scaling efficiency" in proc.stdout
    rows = json.loads(out.read_text())
    assert [r["world_size"] for r in rows] == [1, 2]
    assert all(r["total"] > 0 for r in rows)
