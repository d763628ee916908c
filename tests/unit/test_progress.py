"""The rank-0 progress bar: what it draws on a terminal, and that it stays quiet anywhere else."""

from __future__ import annotations

import io

import pytest

from hvdtrain.core.adapter import DistContext
from hvdtrain.core.resolve import load_config
from hvdtrain.observability.progress import CLEAR_LINE, ProgressBar, format_duration, render_bar


class Terminal(io.StringIO):
    """A text stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def _run_epoch(bar: ProgressBar, rank: int = 0, steps: int = 10, log_every: int = 0) -> None:
    config = load_config(overrides=[f"train.log_every={log_every}", "train.epochs=2"])
    bar.on_train_begin(DistContext(rank=rank, size=2), {"config": config, "steps_per_epoch": steps})
    for i in range(steps):
        bar.on_step_end(0, i, {"loss": 1.0 / (i + 1), "lr": 0.1, "samples_per_sec": 1234.0, "steps": steps})
    bar.on_epoch_end(0, {})


def test_render_bar_shows_progress_throughput_and_eta():
    text = render_bar(epoch=1, epochs=2, done=5, total=10, loss=0.12345, rate=1234.4, eta_sec=75, width=10)
    assert text == "epoch 1/2 [#####-----]  50% 5/10 loss 0.1235 1,234 samples/s ETA 1:15"
    assert format_duration(3725) == "1:02:05"


def test_terminal_gets_a_redrawn_bar_that_is_cleared_at_epoch_end():
    stream = Terminal()
    _run_epoch(ProgressBar(stream, min_interval=0.0))
    out = stream.getvalue()
    assert out.count("epoch 1/2 [") == 10
    assert "10/10" in out and "samples/s ETA" in out and "\n" not in out
    assert out.endswith(CLEAR_LINE)


def test_bar_clears_itself_before_the_loop_prints_a_log_line():
    stream = Terminal()
    _run_epoch(ProgressBar(stream, min_interval=0.0), log_every=5)
    frames = stream.getvalue().split(CLEAR_LINE)
    assert " 5/10 " not in stream.getvalue() and " 4/10 " in stream.getvalue()
    assert "" in frames[1:]  # an empty frame: the line was cleared for the log line


def test_quiet_when_not_a_terminal_or_not_rank_0():
    pipe = io.StringIO()
    _run_epoch(ProgressBar(pipe, min_interval=0.0))
    assert pipe.getvalue() == ""
    other_rank = Terminal()
    _run_epoch(ProgressBar(other_rank, min_interval=0.0), rank=1)
    assert other_rank.getvalue() == ""


# issue 10, item 11: Open MPI gives each worker a pseudo-terminal and forwards what it writes into
# the launcher's output (a log file): no bar there unless asked for.
@pytest.mark.parametrize("launcher", ["OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "PMI_RANK", "SLURM_PROCID"])
def test_no_bar_under_a_launcher_even_on_a_terminal(monkeypatch, launcher):
    monkeypatch.delenv("HVDTRAIN_PROGRESS_BAR", raising=False)
    monkeypatch.setenv(launcher, "0")
    stream = Terminal()
    _run_epoch(ProgressBar(stream, min_interval=0.0))
    assert stream.getvalue() == ""


def test_the_bar_can_be_asked_for_under_a_launcher_and_turned_off_on_a_terminal(monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    monkeypatch.setenv("HVDTRAIN_PROGRESS_BAR", "1")
    asked = Terminal()
    _run_epoch(ProgressBar(asked, min_interval=0.0))
    assert "epoch 1/2 [" in asked.getvalue()
    monkeypatch.delenv("OMPI_COMM_WORLD_RANK")
    monkeypatch.setenv("HVDTRAIN_PROGRESS_BAR", "0")
    refused = Terminal()
    _run_epoch(ProgressBar(refused, min_interval=0.0))
    assert refused.getvalue() == ""
