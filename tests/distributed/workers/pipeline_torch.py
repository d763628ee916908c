"""Worker for tests/distributed/test_pipeline.py (PyTorch): run under horovodrun -np 4 with
``parallel.pipeline_stages=2`` (2 stages x 2 replicas).

Usage: ``pipeline_torch.py REPORT_PATH MICRO_BATCHES CLIP_NORMS CHECKPOINT_DIR`` (CLIP_NORMS: one or
more comma-separated norms, ``none`` for no clipping, each optionally ``+fp16`` for
``comm.compression=fp16``; each is one case of the same launch). Rank 0
writes a JSON report, one entry per clip norm, with: the loss and the update (read off one SGD step)
against a one-process run on the global batch (with clipping by the global norm when asked), the
evaluation sums against the one-process model, the parameter spread across the replicas of each
stage after more steps on replica-specific data, and a checkpoint written by the pipeline loaded
into the un-cut model (and back into a second pipeline adapter).
"""

import json
import sys
from pathlib import Path

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F

from hvdtrain import ArrayDataset, TrainTask, load_adapter, load_config

LR, BATCH, FEATURES, CLASSES = 0.5, 8, 6, 3
report_path, micro, clips, ckpt_root = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), Path(sys.argv[4])


def make_model():
    torch.manual_seed(7)
    return torch.nn.Sequential(  # four blocks: the balanced cut puts two on each stage
        torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh()),
        torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh()),
        torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh()),
        torch.nn.Linear(16, CLASSES))


def metric_sums(out, y):
    return {"correct": (out.argmax(1) == y).sum()}


def make_adapter(config, perturbed_rank):
    adapter = load_adapter("torch", config.parallel.pipeline_stages)
    ctx = adapter.init(config)
    model = make_model()
    if ctx.rank == perturbed_rank:  # a different init on one rank: the broadcast (or the load) must fix it
        torch.nn.init.zeros_(model[2][0].weight)
    dummy = ArrayDataset(np.zeros((2, FEATURES), np.float32), np.zeros(2, np.int64))
    task = TrainTask(model, torch.optim.SGD(model.parameters(), lr=LR), F.cross_entropy, dummy, dummy,
                     metric_sums=metric_sums, pipeline_blocks=lambda: list(model))
    adapter.prepare(task, config)
    return adapter, ctx, model


def case(name, ckpt_dir):
    """One case's report (on rank 0; None elsewhere): ``name`` is a clip norm, ``+fp16`` compresses."""
    clip, _, compression = name.partition("+")
    config = load_config(overrides=["train.seed=0", "train.threads=1", "parallel.pipeline_stages=2",
                                    f"parallel.micro_batches={micro}", "optim.momentum=0.0",
                                    f"optim.grad_clip_norm={clip}", f"train.batch_size={BATCH}",
                                    f"comm.compression={compression or 'none'}"])
    adapter, ctx, model = make_adapter(config, perturbed_rank=3)  # stage 1 of replica 1
    adapter.broadcast_state()
    my_stage = adapter.pipeline.stage  # this rank's stage: its own parameters, the cut
    own = {n: p for n, p in model.named_parameters() if n in my_stage.own_names}
    initial = {n: p.detach().clone() for n, p in own.items()}

    rng = np.random.default_rng(1234)
    replicas = ctx.replicas
    x_all = rng.standard_normal((replicas * BATCH, FEATURES)).astype(np.float32)
    y_all = rng.integers(0, CLASSES, replicas * BATCH).astype(np.int64)
    mine = slice(ctx.replica * BATCH, (ctx.replica + 1) * BATCH)
    eval_sums = adapter.allreduce_sums(adapter.eval_step(x_all[mine], y_all[mine]))  # before the update
    adapter.set_learning_rate(LR)
    loss = adapter.train_step(x_all[mine], y_all[mine])
    update = {n: ((initial[n] - p.detach()) / LR).double().numpy() for n, p in own.items()}
    losses = hvd.allgather_object((ctx.replica, loss))
    updates = hvd.allgather_object(update)

    for step in range(4):  # replica-specific data: the stage's allreduce must keep its replicas equal
        x = rng.standard_normal((BATCH, FEATURES)).astype(np.float32) + ctx.replica
        y = rng.integers(0, CLASSES, BATCH).astype(np.int64)
        adapter.train_step(x, y)
    flats = hvd.allgather_object((ctx.rank, adapter.pipeline.placement.stage,
                                  torch.cat([p.detach().reshape(-1) for p in own.values()])))

    # checkpoint: the pipeline writes the un-cut format (rank 0), a second pipeline adapter reads it back
    adapter.gather_state()
    if ctx.rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        assert adapter.pipeline.state_is_finite()
        adapter.save_state(ckpt_dir)
    hvd.allreduce(torch.zeros(1), name="saved")
    second, _, model2 = make_adapter(config, perturbed_rank=1)  # stage 1's root: the load must win
    if ctx.rank == 0:
        second.load_state(ckpt_dir)
    second.broadcast_state()
    second_own = second.pipeline.stage.own_names
    reloaded = hvd.allgather_object({n: p.detach() for n, p in model2.named_parameters() if n in second_own})
    trained = hvd.allgather_object({n: p.detach() for n, p in own.items()})

    if ctx.rank == 0:
        reference = make_model()
        logits = reference(torch.from_numpy(x_all))
        ref_loss = F.cross_entropy(logits, torch.from_numpy(y_all))
        ref_loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in reference.named_parameters()}
        total = torch.nn.utils.get_total_norm(list(grads.values()))
        if clip != "none":
            coef = min(1.0, float(clip) / (float(total) + 1e-6))
            grads = {n: g * coef for n, g in grads.items()}
        got = {}
        for u in updates:
            got.update(u)
        errors = [float(np.abs(got[n] - grads[n].double().numpy()).max()) for n in grads]
        by_stage = {}
        for rank, stage, flat in flats:
            by_stage.setdefault(stage, []).append(flat)
        spread = max(float((f - fs[0]).abs().max()) for fs in by_stage.values() for f in fs)
        saved = torch.load(ckpt_dir / "model.pt", weights_only=True)
        plain = make_model()
        plain.load_state_dict(saved)  # the non-pipelined model loads the pipeline's checkpoint
        trained_all, reloaded_all = {}, {}
        for part in trained:
            trained_all.update(part)
        for part in reloaded:
            reloaded_all.update(part)
        optimizer = torch.optim.SGD(plain.parameters(), lr=LR)
        optimizer.load_state_dict(torch.load(ckpt_dir / "optimizer.pt", weights_only=True))
        report = {
            "world_size": ctx.size, "replicas": replicas, "stages": adapter.pipeline.placement.layout.stages,
            "bounds": my_stage.bounds, "loss": float(np.mean([l for _, l in losses])), "ref_loss": float(ref_loss),
            "grad_max_abs_error": max(errors), "grad_max_abs": max(float(g.abs().max()) for g in grads.values()),
            "grad_norm": float(total), "updated_names": sorted(got), "ref_names": sorted(grads),
            "eval_loss_sum": eval_sums["loss_sum"], "eval_count": eval_sums["count"], "eval_correct": eval_sums["correct"],
            "ref_eval_correct": float((logits.argmax(1) == torch.from_numpy(y_all)).sum()),
            "spread_after_steps": spread, "stages_seen": sorted(by_stage),
            "checkpoint_vs_trained": max(float((plain.state_dict()[n] - t).abs().max()) for n, t in trained_all.items()),
            "reloaded_vs_trained": max(float((reloaded_all[n] - t).abs().max()) for n, t in trained_all.items()),
            "reloaded_names": sorted(reloaded_all), "optimizer_groups": len(optimizer.param_groups),
        }
        return report
    return None


reports = {name: case(name, ckpt_root / name) for name in clips}
if hvd.rank() == 0:
    Path(report_path).write_text(json.dumps(reports))
