"""The rulebook (hvdtrain.core.rules): every combination a user can set that cannot run is refused
in one line naming the keys involved, before Horovod starts where the config alone decides; every
rule in the book is exercised here."""

from __future__ import annotations

import pytest

from hvdtrain.core import config as _config
from hvdtrain.core import rules
from hvdtrain.core.config import ConfigError
from hvdtrain.core.resolve import load_config

CONFIG_CASES = [
    (rules.adasum_with_exchange, ["comm.compression=powersgd", "comm.reduction=adasum"],
     ["comm.compression=powersgd", "comm.reduction=adasum"]),
    (rules.adasum_with_exchange, ["comm.local_sgd_steps=4", "comm.reduction=adasum"],
     ["comm.local_sgd_steps=4", "comm.reduction=adasum"]),
    (rules.adasum_with_elastic, ["comm.reduction=adasum", "train.elastic=true"],
     ["comm.reduction=adasum", "train.elastic=true"]),
    (rules.adasum_with_update_rewrites, ["comm.reduction=adasum", "optim.grad_clip_norm=1"],
     ["adasum", "optim.grad_clip_norm"]),
    (rules.local_sgd_with_compression, ["comm.local_sgd_steps=2", "comm.compression=topk"],
     ["comm.local_sgd_steps=2", "comm.compression=topk"]),
    (rules.local_sgd_with_compression, ["comm.local_sgd_steps=2", "train.fp16_allreduce=true"],
     ["comm.local_sgd_steps=2", "train.fp16_allreduce=true"]),
    (rules.local_sgd_with_compression, ["comm.local_sgd_steps=2", "comm.compression=fp16"],
     ["comm.local_sgd_steps=2", "comm.compression=fp16"]),
    (rules.error_feedback_with_loss_scaling, ["comm.compression=topk", "train.mixed_precision=fp16"],
     ["comm.compression=topk", "train.mixed_precision"]),
    (rules.overlap_with_exchange, ["comm.overlap=always", "comm.compression=powersgd"],
     ["comm.overlap=always", "comm.compression=powersgd"]),
    (rules.overlap_with_exchange, ["comm.overlap=always", "parallel.pipeline_stages=2"],
     ["comm.overlap=always", "parallel.pipeline_stages=2"]),
    (rules.elastic_with_tuning, ["train.elastic=true", "comm.autotune=true"],
     ["comm.autotune=true", "train.elastic=true", "segmentation fault"]),
    (rules.elastic_with_tuning, ["train.elastic=true", "comm.timeline=/tmp/t.json"],
     ["comm.timeline=/tmp/t.json", "train.elastic=true"]),
    (rules.pipeline_with_elastic, ["parallel.pipeline_stages=2", "train.elastic=true"],
     ["parallel.pipeline_stages", "train.elastic=true"]),
    (rules.pipeline_with_exchange, ["parallel.pipeline_stages=2", "comm.compression=powersgd"],
     ["parallel.pipeline_stages=2", "comm.compression=powersgd"]),
    (rules.pipeline_with_exchange, ["parallel.pipeline_stages=2", "comm.compression=topk"],
     ["parallel.pipeline_stages=2", "comm.compression=topk"]),
    (rules.pipeline_with_exchange, ["parallel.pipeline_stages=2", "comm.local_sgd_steps=4"],
     ["parallel.pipeline_stages=2", "comm.local_sgd_steps=4"]),
    (rules.pipeline_with_accumulation, ["parallel.pipeline_stages=2", "train.grad_accumulation=2"],
     ["train.grad_accumulation=2", "pipeline"]),
    (rules.pipeline_with_adasum, ["parallel.pipeline_stages=2", "comm.reduction=adasum"],
     ["comm.reduction='adasum'", "pipeline"]),
    (rules.pipeline_with_mixed_precision, ["parallel.pipeline_stages=2", "train.mixed_precision=fp16"],
     ["train.mixed_precision=fp16", "pipeline"]),
    (rules.pipeline_with_mixed_precision, ["parallel.pipeline_stages=2", "train.mixed_precision=bf16",
                                           "framework=tensorflow"],
     ["train.mixed_precision=bf16", "TensorFlow"]),
    (rules.pipeline_micro_batches, ["parallel.pipeline_stages=2", "parallel.micro_batches=128"],
     ["parallel.micro_batches=128", "train.batch_size=64"]),
    (rules.pipeline_with_finetune, ["parallel.pipeline_stages=2", "model.freeze_backbone_epochs=1"],
     ["model.freeze_backbone_epochs=1", "pipeline"]),
    (rules.adasum_with_finetune, ["comm.reduction=adasum", "optim.backbone_lr_factor=0.1"],
     ["optim.backbone_lr_factor=0.1", "adasum"]),
    (rules.sharded_optimizer_with, ["parallel.shard_optimizer=optimizer", "framework=tensorflow",
                                    "comm.compression=powersgd"],
     ["parallel.shard_optimizer=optimizer", "comm.compression=powersgd", "averaged gradient"]),
    (rules.sharded_optimizer_with, ["parallel.shard_optimizer=optimizer", "parallel.pipeline_stages=2"],
     ["parallel.shard_optimizer=optimizer", "parallel.pipeline_stages=2"]),
    (rules.sharded_optimizer_with, ["parallel.shard_optimizer=optimizer", "comm.compression=powersgd"],
     ["parallel.shard_optimizer=optimizer", "comm.compression=powersgd"]),
    (rules.sharded_optimizer_with, ["parallel.shard_optimizer=optimizer", "comm.local_sgd_steps=2"],
     ["parallel.shard_optimizer=optimizer", "comm.local_sgd_steps=2"]),
    (rules.sharded_optimizer_with, ["parallel.shard_optimizer=optimizer", "comm.reduction=adasum"],
     ["parallel.shard_optimizer=optimizer", "comm.reduction=adasum"]),
    (rules.sharded_optimizer_with, ["parallel.shard_optimizer=optimizer", "train.elastic=true"],
     ["parallel.shard_optimizer=optimizer", "train.elastic=true"]),
    (rules.sharded_optimizer_with, ["parallel.shard_optimizer=optimizer", "model.freeze_backbone_epochs=1"],
     ["parallel.shard_optimizer=optimizer", "model.freeze_backbone_epochs=1"]),
    (rules.overlap_with_exchange, ["parallel.shard_optimizer=optimizer", "comm.overlap=always"],
     ["parallel.shard_optimizer=optimizer", "comm.overlap=always"]),
    (rules.sharded_optimizer_with, ["parallel.shard_optimizer=gradients", "parallel.pipeline_stages=2"],
     ["parallel.shard_optimizer=gradients", "parallel.pipeline_stages=2", "each stage updates"]),
    (rules.sharded_optimizer_with, ["parallel.shard_optimizer=gradients", "comm.compression=topk"],
     ["parallel.shard_optimizer=gradients", "comm.compression=topk", "averaged gradient"]),
    (rules.sharded_optimizer_with, ["parallel.shard_optimizer=gradients", "comm.local_sgd_steps=2"],
     ["parallel.shard_optimizer=gradients", "comm.local_sgd_steps=2"]),
    (rules.sharded_optimizer_with, ["parallel.shard_optimizer=gradients", "comm.reduction=adasum"],
     ["parallel.shard_optimizer=gradients", "comm.reduction=adasum", "Adasum"]),
    (rules.sharded_optimizer_with, ["parallel.shard_optimizer=gradients", "train.elastic=true"],
     ["parallel.shard_optimizer=gradients", "train.elastic=true", "re-shard"]),
    (rules.sharded_optimizer_with, ["parallel.shard_optimizer=gradients", "model.freeze_backbone_epochs=1"],
     ["parallel.shard_optimizer=gradients", "model.freeze_backbone_epochs=1"]),
    (rules.overlap_with_exchange, ["parallel.shard_optimizer=gradients", "comm.overlap=always"],
     ["parallel.shard_optimizer=gradients", "comm.overlap=always"]),
    (rules.early_stopping_metric, ["train.early_stopping=3", "checkpoint.best_metric=null"],
     ["train.early_stopping=3", "train.early_stopping_metric", "train_loss", "val_accuracy"]),
    (rules.early_stopping_metric, ["train.early_stopping=3", "train.early_stopping_metric=samples_per_sec"],
     ["train.early_stopping_metric='samples_per_sec'", "every worker agrees on", "train_loss", "val_loss"]),
    (rules.early_stopping_metric, ["train.early_stopping=3", "checkpoint.best_metric=epoch_time_sec"],
     ["checkpoint.best_metric='epoch_time_sec'", "train.early_stopping", "val_accuracy"]),
    (rules.compile_with_pipeline, ["train.compile=default", "parallel.pipeline_stages=2"],
     ["train.compile=default", "parallel.pipeline_stages=2", "train.compile=none"]),
    (rules.compile_mode_with_tensorflow, ["train.compile=max-autotune", "framework=tensorflow"],
     ["train.compile=max-autotune", "torch.compile mode", "XLA", "train.compile=default"]),
    (rules.compile_mode_with_tensorflow, ["train.compile=reduce-overhead", "framework=tensorflow"],
     ["train.compile=reduce-overhead", "train.compile=default"]),
    (rules.global_batch_micro_batches, ["train.global_batch_size=30", "train.batch_size=4"],
     ["train.global_batch_size=30", "train.batch_size=4"]),
    (rules.reproducible_with, ["train.reproducible=world-size", "train.global_batch_size=32", "train.batch_size=4",
                               "comm.compression=powersgd"],
     ["train.reproducible=world-size", "comm.compression=powersgd"]),
    (rules.reproducible_with, ["train.reproducible=world-size"],
     ["train.reproducible=world-size", "train.global_batch_size"]),
]

WORLD_CASES = [
    (rules.stages_divide_world, ["parallel.pipeline_stages=4"], rules.World(6, mpi=True, gpu=True),
     ["parallel.pipeline_stages=4", "world size 6"]),
    (rules.adasum_needs_mpi, ["comm.reduction=adasum"], rules.World(2, mpi=False), ["adasum", "MPI"]),
    (rules.adasum_needs_mpi, ["comm.reduction=adasum"], rules.World(3, mpi=True), ["adasum", "power-of-2"]),
    (rules.fp16_needs_gpu, ["train.mixed_precision=fp16"], rules.World(1), ["train.mixed_precision", "GPU"]),
    (rules.elastic_with_launcher_tuning, ["train.elastic=true"],
     rules.World(2, environ={"HOROVOD_AUTOTUNE": "1"}), ["HOROVOD_AUTOTUNE=1", "train.elastic=true"]),
    (rules.elastic_with_launcher_tuning, ["train.elastic=true"],
     rules.World(2, environ={"HOROVOD_TIMELINE": "/tmp/t.json"}), ["HOROVOD_TIMELINE", "train.elastic=true"]),
    (rules.cuda_graphs_with_accumulation, ["train.compile=reduce-overhead", "train.grad_accumulation=2"],
     rules.World(2, gpu=True), ["train.compile=reduce-overhead", "train.grad_accumulation=2", "CUDA graphs"]),
    (rules.cuda_graphs_with_accumulation, ["train.compile=max-autotune", "train.grad_accumulation=4"],
     rules.World(1, gpu=True), ["train.compile=max-autotune", "train.grad_accumulation=4", "train.compile=default"]),
    (rules.global_batch_divides_world, ["train.global_batch_size=32", "train.batch_size=4"], rules.World(3),
     ["train.global_batch_size=32", "3 workers", "launch 1, 2, 4, 8 workers"]),
    (rules.global_batch_divides_world, ["train.global_batch_size=32", "train.batch_size=4",
                                        "train.grad_accumulation=2"], rules.World(2),
     ["train.grad_accumulation=2", "train.global_batch_size=32"]),
    (rules.global_batch_divides_world, ["train.global_batch_size=32", "train.batch_size=4",
                                        "parallel.pipeline_stages=2"], rules.World(4),
     ["train.global_batch_size=32", "parallel.pipeline_stages=2", "accumulates 4 micro-batches"]),
]


@pytest.mark.parametrize("rule, overrides, parts", CONFIG_CASES,
                         ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CONFIG_CASES)])
def test_config_rules_refuse_at_load_naming_the_keys(rule, overrides, parts):
    unchecked = _config.load_config(overrides=overrides)  # the sections' own checks pass
    message = rule(unchecked)
    assert message and "\n" not in message
    for part in parts:
        assert part in message, (part, message)
    with pytest.raises(ConfigError) as info:  # what a user meets: refused when the config is resolved
        load_config(overrides=overrides)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("rule, overrides, world, parts", WORLD_CASES,
                         ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(WORLD_CASES)])
def test_job_rules_refuse_naming_the_keys(rule, overrides, world, parts):
    config = _config.load_config(overrides=overrides)
    if rule is not rules.fp16_needs_gpu:  # a config-only rule must not already refuse it
        assert rules.refusal(config) is None
    message = rules.refusal(config, world)
    assert message == rule(config, world) and "\n" not in message
    for part in parts:
        assert part in message, (part, message)
    with pytest.raises(ConfigError, match="^" + message[:30].replace("(", r"\(").replace(".", r"\.")):
        rules.check(config, world)


def test_every_rule_in_the_book_is_exercised():
    assert set(rules.CONFIG_RULES) == {case[0] for case in CONFIG_CASES}
    assert set(rules.WORLD_RULES) == {case[0] for case in WORLD_CASES}
    for rule in (*rules.CONFIG_RULES, *rules.WORLD_RULES):
        assert rule.__doc__, rule.__name__


@pytest.mark.parametrize("overrides", [
    [],
    ["parallel.pipeline_stages=2", "comm.compression=fp16"],
    ["parallel.pipeline_stages=2", "train.fp16_allreduce=true", "train.mixed_precision=bf16"],
    ["comm.compression=powersgd", "train.fp16_allreduce=true", "train.grad_accumulation=2"],
    ["comm.local_sgd_steps=4", "comm.local_sgd_average_optimizer=true", "comm.overlap=never"],
    ["train.elastic=true", "comm.compression=topk"],
    ["comm.reduction=adasum", "comm.compression=fp16"],
    ["comm.overlap=always", "comm.compression=fp16"],
    ["train.early_stopping=3"],
    ["parallel.shard_optimizer=optimizer", "comm.compression=fp16", "optim.grad_clip_norm=1",
     "train.grad_accumulation=2", "optim.backbone_lr_factor=0.1"],
    ["parallel.shard_optimizer=gradients", "comm.compression=fp16", "optim.grad_clip_norm=1",
     "train.grad_accumulation=2", "optim.backbone_lr_factor=0.1", "train.mixed_precision=bf16"],
    ["framework=tensorflow", "parallel.shard_optimizer=optimizer", "comm.compression=fp16", "optim.grad_clip_norm=1",
     "train.grad_accumulation=2", "optim.backbone_lr_factor=0.1", "train.mixed_precision=bf16"],
    ["train.early_stopping=2", "train.early_stopping_metric=val_loss", "checkpoint.best_metric=null"],
    ["train.early_stopping=2", "train.early_stopping_metric=train_loss", "train.early_stopping_mode=min"],
    ["train.compile=max-autotune", "comm.compression=powersgd", "train.grad_accumulation=2"],
    ["train.compile=default", "framework=tensorflow", "comm.local_sgd_steps=2"],
    ["train.compile=reduce-overhead", "parallel.shard_optimizer=optimizer", "comm.compression=fp16"],
])
def test_combinations_that_run_are_allowed(overrides):
    config = load_config(overrides=overrides)
    assert rules.refusal(config, rules.World(4, mpi=True, environ={})) is None


def test_the_fp16_alias_means_comm_compression_fp16():
    assert load_config(overrides=["train.fp16_allreduce=true"]).comm.compression == "fp16"
    assert rules.fp16_allreduce(load_config(overrides=["comm.compression=fp16"]))
    plain = load_config()
    assert not rules.fp16_allreduce(plain) and plain.comm.compression == "none"
    # with PowerSGD or top-k the alias keeps its meaning: their factors / values travel as float16
    powersgd = load_config(overrides=["comm.compression=powersgd", "train.fp16_allreduce=true"])
    assert powersgd.comm.compression == "powersgd" and rules.fp16_allreduce(powersgd)


def test_task_rules():
    class Task:
        pipeline_blocks = None
        export = None

    config = load_config(overrides=["parallel.pipeline_stages=2"])
    assert "TrainTask.pipeline_blocks" in rules.task_refusal(Task(), config)
    Task.pipeline_blocks, Task.export = (lambda: []), (lambda out: None)
    assert "checkpoint.enabled=true" in rules.task_refusal(Task(), load_config(
        overrides=["parallel.pipeline_stages=2", "checkpoint.enabled=false"]))
    assert rules.task_refusal(Task(), config) is None
    assert rules.task_refusal(Task(), load_config()) is None


def test_check_job_reads_the_place_in_the_job():
    from hvdtrain.core.adapter import DistContext

    config = load_config(overrides=["comm.reduction=adasum"])
    with pytest.raises(ConfigError, match="MPI controller"):
        rules.check_job(config, DistContext(rank=0, size=2, mpi=False))
    rules.check_job(config, DistContext(rank=0, size=2, mpi=True))
