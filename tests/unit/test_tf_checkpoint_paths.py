"""Issue 22, item 7: a TensorFlow checkpoint stores variables by position and their paths; a load
whose paths differ (a recipe or library change reordered or renamed same-shape variables) is
refused naming the first mismatch, never silently permuted. Keras's automatic numbering (the same
model built after another one in the process is ``sequential_1/dense_2``) is not a change."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from hvdtrain.tensorflow.adapter import TensorFlowAdapter  # noqa: E402
from hvdtrain.tensorflow.checkpoint import canonical_paths  # noqa: E402


def _adapter(names: tuple[str, str]) -> TensorFlowAdapter:
    """A TensorFlow adapter holding a two-layer model of same-shape layers named ``names`` and a
    built SGD-with-momentum optimizer (what save_state/load_state read and write)."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, name=names[0]),
                              keras.layers.Dense(4, name=names[1])])
    optimizer = keras.optimizers.SGD(momentum=0.9)
    optimizer.build(model.trainable_variables)
    for i, variable in enumerate(list(model.variables) + list(optimizer.variables)):
        variable.assign(np.full(variable.shape, i + 1, dtype=variable.dtype))
    adapter = TensorFlowAdapter()
    adapter.model, adapter.optimizer = model, optimizer
    return adapter


def _values(adapter: TensorFlowAdapter) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in list(adapter.model.variables) + list(adapter.optimizer.variables)]


def test_same_shape_variables_under_other_paths_are_refused_naming_the_paths(tmp_path):
    saved = _adapter(("encoder", "head"))
    saved.save_state(tmp_path)
    swapped = _adapter(("head", "encoder"))  # the recipe now builds the same shapes in another order
    for variable in list(swapped.model.variables) + list(swapped.optimizer.variables):
        variable.assign(np.zeros(variable.shape, dtype=variable.dtype))
    before = _values(swapped)
    with pytest.raises(ValueError) as refused:
        swapped.load_state(tmp_path)
    message = str(refused.value)
    assert "encoder/kernel" in message and "head/kernel" in message and "model_variables.npz" in message
    assert "\n" not in message
    assert all(np.array_equal(a, b) for a, b in zip(_values(swapped), before))  # nothing was loaded


def test_the_same_model_built_after_another_loads_bitwise(tmp_path):
    saved = _adapter(("encoder", "head"))
    saved.save_state(tmp_path)
    _adapter(("encoder", "head"))  # the process built one before: Keras numbers the next one on
    again = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4), keras.layers.Dense(4)])
    del again
    loaded = _adapter(("encoder", "head"))
    assert loaded.optimizer.variables[0].path != saved.optimizer.variables[0].path  # sgd_N, not sgd
    for variable in list(loaded.model.variables) + list(loaded.optimizer.variables):
        variable.assign(np.zeros(variable.shape, dtype=variable.dtype))
    loaded.load_state(tmp_path)
    assert all(np.array_equal(a, b) for a, b in zip(_values(loaded), _values(saved)))


def test_canonical_paths_drop_only_the_automatic_numbering():
    first = ["sequential/dense/kernel", "sequential/dense_1/kernel", "sgd/sequential_dense_kernel_momentum"]
    later = ["sequential_1/dense_2/kernel", "sequential_1/dense_3/kernel", "sgd_1/sequential_1_dense_2_kernel_momentum"]
    assert canonical_paths(first) == canonical_paths(later)
    reordered = ["sequential/dense_1/kernel", "sequential/dense/kernel", "sgd/sequential_dense_kernel_momentum"]
    assert canonical_paths(reordered) != canonical_paths(first)
    # a Dropout layer's seed generator: the folder is numbered, its state variable's name is not
    # (tests/distributed/test_pipeline.py's dropout masks resumed a second model built in one process)
    saved = ["seed_generator/seed_generator_state", "seed_generator_1/seed_generator_state"]
    again = ["seed_generator_2/seed_generator_state", "seed_generator_3/seed_generator_state"]
    assert canonical_paths(saved) == canonical_paths(again)
