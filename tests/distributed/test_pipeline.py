"""Pipeline parallelism under real `horovodrun -np 4 -H localhost:4 --gloo` (2 stages x 2 replicas).

* exactness: one GPipe step of the pipeline adapter (2 micro-batches, with and without clipping by
  the global norm) has the loss and the gradient (read off an SGD update) of a one-process run on
  the global batch within 1e-5; evaluation sums equal the one-process model's; after more steps on
  replica-specific data each stage's parameters are bitwise identical on its replicas; a checkpoint
  the pipeline writes loads into the un-cut model and back into a pipeline; with
  comm.compression=fp16 (torch) the gradient is off by float16's rounding, not float32's: the
  compression reaches the stages' allreduce;
* the image recipe through the CLI, one scenario: kill-and-resume at the same layout ends bitwise
  equal to an uninterrupted run; the pipelined run's checkpoint resumes a data-parallel run and
  that run's checkpoint resumes a pipelined run;
* in TensorFlow the replicas of a stage draw different dropout masks, and a checkpoint restores
  every replica's stream;
* refused combinations stop before training and name the reason (those the config alone decides
  before any worker starts; fewer blocks than stages in-process, on the recipe's model).
"""

import json

import pytest

from jobs import REPO, assert_same_run, checkpoint_weights, horovodrun, hvdtrain_cli, run, run_metrics as metrics

WORKERS = REPO / "tests" / "distributed" / "workers"
PIPE = ["--set", "parallel.pipeline_stages=2", "--set", "parallel.micro_batches=2"]
TINY = ["--batch-size", "32", "--set", "data.max_train_samples=512", "--set", "data.max_val_samples=128",
        "--set", "train.log_every=0", "--set", "train.deterministic=true"]


def recipe(out, *extra):
    return [hvdtrain_cli(), "recipe", "image-classification", "--framework", "torch", "--output", out, *TINY, *extra]


@pytest.mark.distributed
@pytest.mark.parametrize("framework,clips", [("torch", ["none", "0.05", "none+fp16"]), ("tensorflow", ["0.05"])])
def test_two_stages_two_replicas_equal_one_process(tmp_path, framework, clips):
    report_path = tmp_path / "report.json"  # one launch runs every case (clip norm, +fp16) in turn
    horovodrun(["python", WORKERS / f"pipeline_{framework}.py", report_path, "2", ",".join(clips), tmp_path / "ckpt"],
               np=4, timeout=300)
    reports = json.loads(report_path.read_text())
    assert sorted(reports) == sorted(clips)
    for clip in clips:
        check_one_process_equality(reports[clip], clip)


def check_one_process_equality(r, case):
    clip, _, compression = case.partition("+")
    assert (r["world_size"], r["stages"], r["replicas"]) == (4, 2, 2)
    assert r["bounds"] == [2]
    assert r["updated_names"] == r["ref_names"]  # every parameter updated by exactly one stage
    assert abs(r["loss"] - r["ref_loss"]) <= 1e-5, r
    assert r["grad_max_abs"] > 1e-3
    if compression == "fp16":  # each replica's gradient travelled as float16 (relative rounding 2**-11)
        assert 1e-5 < r["grad_max_abs_error"] <= 2e-3 * r["grad_max_abs"], r
    else:
        assert r["grad_max_abs_error"] <= 1e-5, r
    if clip != "none":
        assert r["grad_norm"] > 0.05  # the clip was active
    assert r["eval_count"] == 16 and abs(r["eval_loss_sum"] - 16 * r["ref_loss"]) <= 1e-4
    assert r["eval_correct"] == r["ref_eval_correct"]
    assert r["stages_seen"] == [0, 1] and r["spread_after_steps"] == 0.0
    assert r["checkpoint_vs_trained"] == 0.0 and r["reloaded_vs_trained"] == 0.0
    assert r["reloaded_names"] == r["ref_names"] and r["optimizer_groups"] == 1


@pytest.mark.distributed
def test_kill_and_resume_is_bitwise_equal_and_checkpoints_round_trip_to_data_parallel(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    # 256 samples / 2 replicas / batch 32 = 4 steps per epoch; the kill at step 7 (epoch 2) leaves step 6
    same = ["--set", "checkpoint.every_steps=3", "--set", "data.max_train_samples=256"]
    run = ["--epochs", "2", *same, *PIPE]
    first = horovodrun(recipe(straight, *run), np=4)
    assert "hvdtrain: done" in first.stdout
    row = metrics(straight)[0]
    assert row["world_size"] == 4 and 0.0 <= row["val_accuracy"] <= 1.0, row
    pipelined = checkpoint_weights(straight / "checkpoints" / "epoch-0002", "torch")
    assert pipelined.keys() == {"features.0.weight", "features.0.bias", "features.2.weight", "features.2.bias",
                                "classifier.0.weight", "classifier.0.bias", "classifier.3.weight",
                                "classifier.3.bias"}

    # kill-and-resume at the same layout ends bitwise equal to the uninterrupted run
    crash = horovodrun(recipe(killed, *run), np=4, check=False, env={"HVDTRAIN_FAULT": "kill:rank=3:step=7"})
    assert crash.returncode != 0
    names = sorted(p.name for p in (killed / "checkpoints").iterdir())
    assert "step-00000006" in names and "epoch-0002" not in names, names
    resumed = horovodrun(recipe(killed, *run, "--resume"), np=4)
    assert "step-00000006" in resumed.stdout and "after" in resumed.stdout
    assert_same_run(pipelined, checkpoint_weights(killed / "checkpoints" / "epoch-0002", "torch"), straight, killed)

    # a pipelined run's checkpoint resumes a data-parallel run, and the other way round
    dp = horovodrun(recipe(straight, *same, "--epochs", "3", "--resume"), np=2)
    assert "resuming from" in dp.stdout and "epoch-0002" in dp.stdout
    back = horovodrun(recipe(straight, *same, "--epochs", "4", "--resume", *PIPE), np=4)
    assert "resuming from" in back.stdout and "epoch-0003" in back.stdout
    rows = metrics(straight)
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4]
    # the pipelined epoch 4 started from epoch 3's weights: its loss continues where epoch 3 ended
    assert rows[3]["train_loss"] < rows[0]["train_loss"], rows


# what needs the job (its world size) is refused by every rank of a real job; what the built model
# decides (fewer blocks than stages) by the cut every rank makes, in-process below on the recipe's
# real model; what the config alone decides by the same CLI before any launcher or framework starts
# (workers, options, reason): each job as small as its refusal allows (a worker costs its start-up)
REFUSED_BY_THE_JOB = [
    (2, ["--set", "parallel.pipeline_stages=3"], "parallel.pipeline_stages=3 does not divide the world size 2"),
    (4, ["--set", "parallel.pipeline_stages=2", "--set", "comm.compression=powersgd"],
     "parallel.pipeline_stages=2 cannot be combined with comm.compression=powersgd"),
]
REFUSED_BY_THE_CONFIG = [
    (["--set", "parallel.pipeline_stages=2", "--set", "train.elastic=true"], "train.elastic=true"),
    (["--set", "parallel.pipeline_stages=2", "--set", "train.grad_accumulation=2"],
     "train.grad_accumulation=2 is not supported with pipeline stages"),
    (["--set", "parallel.pipeline_stages=2", "--set", "comm.local_sgd_steps=4"],
     "parallel.pipeline_stages=2 cannot be combined with comm.local_sgd_steps=4"),
]


def assert_refused(proc, out, reason):
    assert proc.returncode != 0
    assert reason in proc.stdout + proc.stderr
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())


@pytest.mark.distributed
@pytest.mark.parametrize("np_,extra,reason", REFUSED_BY_THE_JOB, ids=["world-size", "powersgd"])
def test_refused_combinations_name_the_reason(tmp_path, np_, extra, reason):
    out = tmp_path / "run"
    assert_refused(horovodrun(recipe(out, "--epochs", "1", *extra), np=np_, check=False, timeout=180), out, reason)


def test_fewer_blocks_than_stages_is_refused_by_the_cut_of_the_recipes_model():
    """The refusal a 3-rank job with parallel.pipeline_stages=3 met on every rank (the image
    recipe's small_cnn has 2 blocks), made by the cut each rank's stage makes in ``prepare``
    (hvdtrain.torch.stage: Cut.of), in-process on the same model and the CLI's config."""
    from types import SimpleNamespace

    import hvdtrain
    from hvdtrain.core.config import ConfigError
    from hvdtrain.core.gpipe import Cut
    from hvdtrain_recipes.image_classification.torch_models import build_model, pipeline_blocks

    config = hvdtrain.load_config(hvdtrain.get_recipe("image-classification").defaults, recipe="image-classification",
                                  framework="torch", overrides=["parallel.pipeline_stages=3"])
    model = build_model("small_cnn", 1, (28, 28), 10)  # what model.name=auto builds at 28x28 (common.model_name)
    task = SimpleNamespace(model=model, export=None, pipeline_blocks=lambda: pipeline_blocks(model))
    with pytest.raises(ConfigError, match="the model has only 2 blocks, fewer than the 3 stages"):
        Cut.of(task, config, 0, lambda block: sum(p.numel() for p in block.parameters()),
               lambda block: block.state_dict(keep_vars=True).values())


@pytest.mark.parametrize("extra,reason", REFUSED_BY_THE_CONFIG, ids=["elastic", "accumulation", "local-sgd"])
def test_refused_before_any_worker_starts(tmp_path, extra, reason):
    out = tmp_path / "run"
    assert_refused(run(recipe(out, "--epochs", "1", *extra), check=False, timeout=180), out, reason)


@pytest.mark.distributed
def test_tensorflow_replicas_draw_their_own_dropout_masks_and_resume_them(tmp_path):
    report_path = tmp_path / "report.json"
    horovodrun(["python", WORKERS / "pipeline_dropout_tensorflow.py", report_path, tmp_path / "ckpt"], np=4,
               timeout=300)
    rows = {(r["stage"], r["replica"]): r for r in json.loads(report_path.read_text())}
    assert sorted(rows) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for stage in (0, 1):
        first, second = rows[stage, 0], rows[stage, 1]
        assert first["seed_states"], "the stage owns a Dropout layer"
        assert first["outputs"][0] != first["outputs"][1]  # a new mask on every call
        assert first["outputs"] != second["outputs"], f"stage {stage}: both replicas drew the same dropout masks"
    for row in rows.values():  # a checkpoint holds replica 0's streams; every replica gets its own back
        assert row["reloaded_seed_states"] == row["seed_states"], row
