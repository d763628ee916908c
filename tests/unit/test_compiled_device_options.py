"""``hvdtrain.torch.compiled``'s per-device Inductor options: on CPU the compiled step's dropout
draws ATen's random numbers (``fallback_random``), so its masks, and its output, equal the eager
step's for the same seed (Inductor's own C++ Philox code draws other masks, and costs 0.24 s of a
1.18 s BERT step on one CPU thread: ``benchmarks/compile_speed.py``)."""

from __future__ import annotations

import pytest

from envguard import isolate_environ


def test_cpu_compiled_dropout_draws_the_eager_masks_and_modes_keep_their_options(monkeypatch):
    torch = pytest.importorskip("torch")
    isolate_environ(monkeypatch, ["TORCHINDUCTOR_CACHE_DIR", "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"])  # torch.compile sets them
    from torch._inductor import list_mode_options

    from hvdtrain.torch.compiled import DEVICE_OPTIONS, step_module

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(32, 4))
    x = torch.randn(16, 8)
    compiled = step_module(model, "default", "cpu")
    outputs = []
    for step in (model, compiled):
        torch.manual_seed(7)
        out = step(x)
        out.sum().backward()
        outputs.append((out.detach(), [p.grad.clone() for p in model.parameters()]))
        model.zero_grad()
    (eager, eager_grads), (fast, fast_grads) = outputs
    assert not torch.equal(eager, model.eval()(x).detach())  # dropout was on
    torch.testing.assert_close(fast, eager, rtol=1e-6, atol=1e-6)
    for a, b in zip(fast_grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    # a torch.compile mode and the device's options together: the mode's own options stay
    assert DEVICE_OPTIONS["cpu"] == {"fallback_random": True}
    assert "cuda" not in DEVICE_OPTIONS and list_mode_options("reduce-overhead") == {"triton.cudagraphs": True}
