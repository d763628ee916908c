"""``train.nonfinite=error`` on a GPU reads its finite check once per window of updates, not per
update (no host synchronisation in the step; measured on an H200 with benchmarks/gpu/steps.py
--profile). The GPU only chooses the deferred check; its logic runs here on CPU tensors: a NaN
update is found when the window is due, named by how many updates ago it came, the optimizer step
the loop reports is the bad one, and an epoch that ends inside a window is checked before its
evaluation and checkpoint."""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")

from hvdtrain.core.adapter import NonFiniteGradientError  # noqa: E402
from hvdtrain.core.errors import TrainingError  # noqa: E402
from hvdtrain.torch import TorchAdapter  # noqa: E402
from hvdtrain.torch.finite import DeferredFiniteCheck  # noqa: E402
from envguard import isolate_environ  # noqa: E402


@pytest.fixture(autouse=True)
def _inductor_cache(monkeypatch):
    """torch's first optimizer step in a process sets TORCHINDUCTOR_CACHE_DIR itself."""
    isolate_environ(monkeypatch, ("TORCHINDUCTOR_CACHE_DIR",))


class OneProcess:
    """The exchange of a world of one: the gradient every rank applies is this process's own."""

    def reduce(self, grads):
        return grads

    def stepping(self):
        return contextlib.nullcontext()

    def after_update(self):
        pass

    def sync_replicas(self):
        pass


def adapter(window):
    model = torch.nn.Linear(3, 1)
    a = TorchAdapter()
    a.model, a.params, a.exchange = model, list(model.parameters()), OneProcess()
    a.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    a.control, a.scaler, a.grad_clip_norm, a.nonfinite = None, None, None, "error"
    a.finite_check = None if window is None else DeferredFiniteCheck(torch.device("cpu"), window)
    return a


def update(a, bad=False):
    loss = a.model(torch.ones(2, 3)).sum() * (float("nan") if bad else 1.0)
    loss.backward()
    a._apply_update()


@contextlib.contextmanager
def no_host_reads(monkeypatch):
    """Any tensor read on the host (bool, int, float, item) fails inside this block."""
    with monkeypatch.context() as m:
        for name in ("__bool__", "__int__", "__float__", "item"):
            m.setattr(torch.Tensor, name, lambda *_: pytest.fail("the update read a tensor on the host"))
        yield


def test_per_update_check_stops_at_the_bad_update():
    a = adapter(window=None)
    update(a)
    with pytest.raises(NonFiniteGradientError) as caught:
        update(a, bad=True)
    assert caught.value.updates_ago == 0


def test_deferred_check_reads_nothing_until_its_window_is_due_then_names_the_bad_update(monkeypatch):
    a = adapter(window=4)
    with no_host_reads(monkeypatch):
        update(a)
        update(a, bad=True)  # update 2: applied (the run stops at the check; nothing is saved)
        update(a)
    with pytest.raises(NonFiniteGradientError, match="found it 2 updates later") as caught:
        update(a)  # update 4: the window is due
    assert caught.value.updates_ago == 2


def test_deferred_check_with_finite_updates_never_stops():
    a = adapter(window=2)
    for _ in range(5):
        update(a)
    a.sync_replicas()  # the end of an epoch: nothing to report


def test_an_epoch_that_ends_inside_a_window_is_checked_before_evaluation_and_checkpoint():
    a = adapter(window=50)
    update(a)
    update(a, bad=True)
    update(a)
    with pytest.raises(TrainingError, match="not finite 1 updates before the end of this epoch"):
        a.sync_replicas()
