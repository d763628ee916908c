"""The framework-neutral parts of `hvdtrain bench` and the comm options: statistics, the timed
loop, scaling efficiency, the timeline reader, the HOROVOD_* variables and their validation."""

from __future__ import annotations

import json
import math
import os

import pytest

from hvdtrain.tools import timeline
from hvdtrain.tools.bench import (BenchResult, format_result, format_scaling, scaling_efficiency, summarize,
                                 t_quantile, timed_iterations)
from hvdtrain.core.config import ConfigError
from hvdtrain.core.resolve import load_config
from hvdtrain.core import rules
from hvdtrain.core.comm import horovod_comm_variables, overlap_gradients
from hvdtrain.launch import prepare_horovod_environment

from envguard import isolate_environ

# what prepare_horovod_environment writes to os.environ: the comm section's variables, and the Gloo
# controller for a process started without a launcher
HOROVOD_COMM_VARIABLES = ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_TIMELINE", "HOROVOD_CYCLE_TIME", "HOROVOD_AUTOTUNE",
                          "HOROVOD_AUTOTUNE_LOG", "HOROVOD_TIMELINE_MARK_CYCLES")
LONE_PROCESS_VARIABLES = ("HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS")


def test_summary_uses_student_t_interval():
    s = summarize([10.0, 12.0, 14.0])
    assert s.n == 3 and s.mean == 12.0 and s.median == 12.0 and (s.minimum, s.maximum) == (10.0, 14.0)
    assert s.ci95 == pytest.approx(4.303 * 2.0 / math.sqrt(3))
    assert summarize([5.0]).ci95 == math.inf
    with pytest.raises(ValueError):
        summarize([])


@pytest.mark.parametrize("dof, expected", [(1, 12.706), (4, 2.776), (11, 2.179), (60, 2.0), (1000, 1.96)])
def test_t_quantile(dof, expected):
    assert t_quantile(dof) == expected


def test_timed_iterations_counts_steps_and_rates():
    calls, now = [], [0.0]

    def step():
        calls.append(1)
        now[0] += 0.5

    rates = timed_iterations(step, samples_per_step=8, warmup_steps=3, steps_per_iter=4, iters=2, clock=lambda: now[0])
    assert len(calls) == 3 + 4 * 2
    assert rates == [16.0, 16.0]  # 4 steps x 8 samples in 2 s


def test_scaling_efficiency_and_table():
    assert scaling_efficiency({1: 100.0, 2: 180.0, 4: 300.0}) == {1: 1.0, 2: 0.9, 4: 0.75}
    results = [BenchResult("torch", "small_cnn", 8, n, {"image_size": 16, "channels": 1, "warmup_batches": 1,
                                                          "batches_per_iter": 2, "iters": 2},
                           {"reduction": "average"}, False, "none", [[100.0 * 0.9 ** (n - 1)] * 2] * n)
               for n in (1, 2)]
    table = format_scaling(results)
    assert "90.0%" in table and "100.0%" in table
    again = BenchResult.from_dict(json.loads(json.dumps(results[1].to_dict())))
    assert again == results[1] and again.total == pytest.approx(180.0)
    assert "Total samples/s on 2 worker(s): 180.0" in format_result(again)


TRACE = """[
{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "allreduce.fc.weight"}},
{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 0, "pid": 1},{"ph": "E", "ts": 100, "pid": 1},
{"ph": "B", "name": "ALLREDUCE", "ts": 1000, "pid": 1},{"ph": "B", "name": "GLOO_ALLREDUCE", "ts": 1100, "pid": 1},
{"ph": "E", "ts": 2900, "pid": 1},{"ph": "E", "ts": 3000, "pid": 1, "args": {"dtype": "float16", "shape": "[4, 250]"}},
{"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "allreduce.fc.bias"}},
{"ph": "B", "name": "ALLREDUCE", "ts": 2000, "pid": 2},{"ph": "E", "ts": 4000, "pid": 2, "args": {"dtype": "float32", "shape": "[10]"}},
{"ph": "i", "name": "CYCLE_START", "ts": 5000, "s": "g"},"""  # still being written: no closing bracket


def test_timeline_reader(tmp_path):
    path = tmp_path / "timeline.json"
    path.write_text(TRACE)
    events = timeline.load_events(path)
    acts = timeline.activities(events)
    ops = timeline.collectives(acts)
    assert [(a.tensor, a.name, a.nbytes) for a in ops] == [("allreduce.fc.weight", "ALLREDUCE", 2000),
                                                          ("allreduce.fc.bias", "ALLREDUCE", 40)]
    inner = [a for a in acts if a.name == "GLOO_ALLREDUCE"][0]
    assert inner.depth == 1 and inner.duration == pytest.approx(0.0018)
    assert timeline.covered_seconds([(a.start, a.end) for a in ops]) == pytest.approx(0.003)
    assert timeline.cycle_marks(events) == [0.005]
    assert timeline.collectives(acts, prefix="allreduce.fc.b")[0].tensor == "allreduce.fc.bias"
    path.write_text("not json")
    with pytest.raises(ValueError, match="not a Horovod timeline"):
        timeline.load_events(path)


def test_comm_config_becomes_horovod_variables(tmp_path, monkeypatch):
    config = load_config(None, overrides=["comm.fusion_threshold_mb=32", "comm.cycle_time_ms=2.5",
                                          "comm.autotune=true", f"comm.autotune_log={tmp_path}/tune/log.csv",
                                          f"comm.timeline={tmp_path}/trace/t.json", "comm.timeline_mark_cycles=true"])
    assert horovod_comm_variables(config.comm) == {
        "HOROVOD_FUSION_THRESHOLD": str(32 * 1024 * 1024), "HOROVOD_CYCLE_TIME": "2.5", "HOROVOD_AUTOTUNE": "1",
        "HOROVOD_AUTOTUNE_LOG": f"{tmp_path}/tune/log.csv", "HOROVOD_TIMELINE": f"{tmp_path}/trace/t.json",
        "HOROVOD_TIMELINE_MARK_CYCLES": "1"}
    isolate_environ(monkeypatch, (*HOROVOD_COMM_VARIABLES, *LONE_PROCESS_VARIABLES))  # the code sets them itself
    prepare_horovod_environment(config)
    assert os.environ["HOROVOD_TIMELINE"] == f"{tmp_path}/trace/t.json" and (tmp_path / "trace").is_dir()
    assert (tmp_path / "tune").is_dir()


def test_unset_comm_options_leave_launcher_variables_alone(monkeypatch):
    isolate_environ(monkeypatch, (*HOROVOD_COMM_VARIABLES, *LONE_PROCESS_VARIABLES))
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "1234")
    config = load_config(None)
    assert horovod_comm_variables(config.comm) == {}
    prepare_horovod_environment(config)
    assert os.environ["HOROVOD_FUSION_THRESHOLD"] == "1234"


@pytest.mark.parametrize("override, message", [
    ("comm.reduction=sum", "comm.reduction: 'sum' is not allowed; choose one of: average, adasum"),
    ("comm.fusion_threshold_mb=-1", "comm.fusion_threshold_mb: -1.0 is out of range"),
    ("comm.cycle_time_ms=0", "comm.cycle_time_ms: 0.0 is out of range; it must be > 0.0"),
    ("comm.autotune=maybe", "comm.autotune: expected true or false"),
])
def test_bad_comm_values_are_named(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        load_config(None, overrides=[override])


def test_adasum_needs_mpi_and_a_power_of_two():
    config = load_config(None, overrides=["comm.reduction=adasum"])
    assert rules.adasum_needs_mpi(config, rules.World(1)) is None
    assert rules.adasum_needs_mpi(config, rules.World(4, mpi=True)) is None
    assert "MPI controller" in rules.adasum_needs_mpi(config, rules.World(2))
    assert "power-of-2" in rules.adasum_needs_mpi(config, rules.World(3, mpi=True))
    assert rules.adasum_needs_mpi(load_config(None), rules.World(3)) is None


@pytest.mark.parametrize("setting, gpu, workers, threads, cores, flat_buffer, expected", [
    ("auto", False, 2, 1, 2, True, False),  # every core busy, a flat buffer: one allreduce after the backward pass
    ("auto", False, 2, 1, 2, False, True),  # every core busy, Horovod's grouped allreduce the alternative: overlap
    ("auto", False, 1, 1, 2, True, True),  # a spare core for Horovod's background thread: overlap
    ("auto", True, 8, 16, 16, True, True),  # GPUs: overlap
    ("always", False, 2, 1, 2, True, True),
    ("never", True, 1, 1, 16, False, False),
])
def test_overlap_decision(setting, gpu, workers, threads, cores, flat_buffer, expected):
    comm = load_config(None, overrides=[f"comm.overlap={setting}"]).comm
    assert overlap_gradients(comm, gpu, workers, threads, cores, flat_buffer) is expected
