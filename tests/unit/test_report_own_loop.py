"""Issue 61, item 8: ``hvdtrain report`` and ``hvdtrain predict`` on the output of your own loop
(``hvdtrain.torch.prepare``, recipe ``own-loop``): the report draws the rows your script saved and
names the workers from the checkpoint's manifest; without rows, and for predict, one line saying
what is needed. The output is laid out as examples/own_loop_torch.py leaves it under 2 workers
(tests/distributed/test_prepare.py and test_torchrun.py run the real thing)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hvdtrain.cli import main

ROWS = [{"epoch": 1, "step": 4, "lr": 0.00098, "loss": 2.2973, "val_loss": 2.2889, "val_accuracy": 0.1465},
        {"epoch": 2, "step": 8, "lr": 0.00096, "loss": 2.1012, "val_loss": 2.0547, "val_accuracy": 0.3301}]


def own_loop_output(path, rows=ROWS):
    """What run.save() leaves: config.yaml (recipe own-loop), checkpoints/epoch-N/manifest.json, metrics.jsonl."""
    path.mkdir()
    (path / "config.yaml").write_text("recipe: own-loop\nframework: torch\nmodel:\n  name: small_cnn\n"
                                      "train:\n  epochs: 1\n  batch_size: 32\n")
    for row in rows or ROWS:
        folder = path / "checkpoints" / f"epoch-{row['epoch']:04d}"
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text(json.dumps({"recipe": "own-loop", "world_size": 2, **row}))
    if rows:
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_report_reads_an_own_loop_run(tmp_path):
    pytest.importorskip("matplotlib")
    from hvdtrain import reporting

    out = own_loop_output(tmp_path / "run")
    result = CliRunner().invoke(main, ["report", str(out)])
    assert result.exit_code == 0, result.output
    lines = dict(line.split(None, 1) if "  " not in line else [p.strip() for p in line.split("  ", 1)]
                 for line in result.output.splitlines() if not line.startswith("wrote "))
    assert lines["workers"] == "2" and lines["model"] == "your own (prepare())"  # not the config's default model
    assert lines["epochs"] == "2" and lines["final loss"] == "2.1012" and "training time" not in lines
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    reporting._draw_loss(ax, reporting.load_run(out))
    curves = {line.get_label(): list(line.get_ydata()) for line in ax.lines}
    plt.close(fig)
    assert curves["train loss (epoch)"] == [2.2973, 2.1012]  # your loop's "loss", as the training loss


@pytest.mark.parametrize("where, message", [
    ("run", r"^hvdtrain: error: \S+/run has no metrics.jsonl: this run was trained by your own script \(own-loop\), "
            r"which saved no metrics yet; pass them as `run.save\("),
    ("run/checkpoints", r"^hvdtrain: error: \S+/run/checkpoints is a run's checkpoints folder: report the run, "
                        r"`hvdtrain report \S+/run`$"),
])
def test_report_names_what_an_own_loop_folder_lacks_in_one_line(tmp_path, where, message):
    out = own_loop_output(tmp_path / "run", rows=None if where == "run" else ROWS)
    result = CliRunner().invoke(main, ["report", str(tmp_path / where)])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    import re

    assert re.match(message, result.output.strip()), result.output
    assert not (out / "report").exists()


def test_predict_on_an_own_loop_run_says_what_it_needs(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # what the command sets for itself
    out = own_loop_output(tmp_path / "run")
    result = CliRunner().invoke(main, ["predict", str(out), "digit.png"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output.strip() == (
        f"hvdtrain: error: {out} was trained by your own script (own-loop): hvdtrain predict needs a recipe run "
        f"(--recipe NAME); load the checkpoint with run.load({str(out)!r}) in your script and call your model")
