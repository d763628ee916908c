"""The `hvdtrain` command line: listings, the environment block, and clear errors for bad input."""

import pytest

from jobs import hvdtrain_cli, run


def test_recipes_lists_both_frameworks():
    out = run([hvdtrain_cli(), "recipes"]).stdout
    assert "image-classification" in out and "tensorflow,torch" in out


def test_env_shows_horovod_build():
    out = run([hvdtrain_cli(), "env"]).stdout
    for line in ("[X] PyTorch", "[X] TensorFlow", "[X] MPI", "[X] Gloo", "horovod:        0.28.1"):
        assert line in out, out


@pytest.mark.parametrize("args,exit_code,needles", [
    (["recipe", "no-such-recipe"], 2, ["unknown recipe 'no-such-recipe'", "image-classification"]),
    (["recipe", "image-classification", "--framework", "jax"], 2, ["'jax' is not one of", "torch", "tensorflow"]),
    (["recipe", "image-classification", "--set", "train.epochz=2"], 2, ["train.epochz", "epochs"]),
    (["recipe", "image-classification", "--set", "optim.decay=step"], 2, ["'step'", "cosine, linear, constant"]),
    (["recipe", "image-classification", "--epochs", "0"], 2, ["train.epochs", ">= 1"]),
    (["recipe", "image-classification", "--set", "novalue"], 2, ["section.key=value"]),
    (["recipe", "image-classification", "--config", "missing.yaml"], 2, ["missing.yaml", "does not exist"]),
])
def test_bad_input_is_named_and_exits_nonzero(tmp_path, args, exit_code, needles):
    proc = run([hvdtrain_cli(), *args, "--output", tmp_path / "out"] if args[0] == "recipe" and len(args) > 2
               else [hvdtrain_cli(), *args], check=False)
    assert proc.returncode == exit_code, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_missing_data_directory(tmp_path):
    proc = run([hvdtrain_cli(), "recipe", "image-classification", "--data", tmp_path / "nope",
                "--output", tmp_path / "out"], check=False)
    assert proc.returncode == 1
    assert f"{tmp_path / 'nope'}" in proc.stderr and "does not exist" in proc.stderr
