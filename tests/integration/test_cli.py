"""The `hvdtrain` command line: listings and the environment block (bad input: tests/reliability/test_bad_input.py)."""

from jobs import hvdtrain_cli, run


def test_recipes_lists_both_frameworks():
    out = run([hvdtrain_cli(), "recipes"]).stdout
    assert "image-classification" in out and "tensorflow,torch" in out


def test_env_shows_horovod_build():
    out = run([hvdtrain_cli(), "env"]).stdout
    for line in ("[X] PyTorch", "[X] TensorFlow", "[X] MPI", "[X] Gloo", "horovod:        0.28.1"):
        assert line in out, out
