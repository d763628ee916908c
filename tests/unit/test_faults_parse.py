"""HVDTRAIN_FAULT parsing and matching (hvdtrain/core/faults.py)."""

import pytest

from hvdtrain.core.faults import Fault, parse_faults


def test_parse_several_faults():
    assert parse_faults("kill:rank=1:step=10, slow:rank=0:step=11:ms=150") == [
        Fault("kill", rank=1, step=10), Fault("slow", rank=0, step=11, ms=150)]
    assert parse_faults(None) == [] and parse_faults("") == []


@pytest.mark.parametrize("text, message", [("explode", "unknown fault 'explode'"),
                                           ("kill:when=3", "bad field 'when=3'"),
                                           ("slow:ms=fast", "bad field 'ms=fast'")])
def test_bad_fault_is_named(text, message):
    with pytest.raises(ValueError, match=message):
        parse_faults(text)


def test_slow_fires_from_its_step_on_and_others_only_at_it():
    slow, kill = Fault("slow", rank=0, step=5), Fault("kill", rank=0, step=5)
    assert [slow.matches("slow", 0, s) for s in (4, 5, 9)] == [False, True, True]
    assert [kill.matches("kill", 0, s) for s in (4, 5, 9)] == [False, True, False]
    assert not slow.matches("slow", 1, 7) and not slow.matches("kill", 0, 7)


def test_size_limits_a_fault_to_a_job_of_that_many_workers():
    """``slow:...:size=1``: a survivor slowed only while it is alone, not after the host rejoins."""
    (slow,) = parse_faults("slow:rank=0:step=5:size=1")
    assert slow == Fault("slow", rank=0, step=5, size=1)
    assert [slow.matches("slow", 0, 7, size) for size in (1, 2, None)] == [True, False, True]


def test_fault_injection_callback_poisons_the_weight_and_raises_on_its_rank_and_step(monkeypatch):
    from types import SimpleNamespace

    from hvdtrain.core import faults

    monkeypatch.setenv("HVDTRAIN_FAULT", "nan:rank=1:step=3,raise:rank=1:step=5")  # read at on_train_begin
    monkeypatch.setattr(faults, "_FAULTS", [])
    callback = faults.FaultInjection()
    callback.on_train_begin(SimpleNamespace(rank=1, size=2), {})
    weights = []
    for step in range(5):
        logs = {"global_step": step, "weight": 0.5}
        callback.on_step_begin(0, step, logs)
        weights.append(logs["weight"])
    assert weights[:3] + weights[4:] == [0.5] * 4 and weights[3] != weights[3]  # NaN at step 3 only
    with pytest.raises(faults.InjectedFault, match="rank 1 at step 5"):
        callback.on_step_begin(0, 5, {"global_step": 5, "weight": 0.5})

    callback.on_train_begin(SimpleNamespace(rank=0, size=2), {})  # another rank (or after an elastic re-form)
    logs = {"global_step": 3, "weight": 0.5}
    callback.on_step_begin(0, 3, logs)
    callback.on_step_begin(0, 5, {"global_step": 5, "weight": 0.5})
    assert logs["weight"] == 0.5
