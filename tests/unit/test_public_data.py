"""The examples use only the public API, and the MNIST they train on is a public piece of hvdtrain.

``examples/`` is what a user copies: an import of the shipped recipes' internals there
(``hvdtrain_recipes.image_classification.common``, once ``recipes...``) would teach users to depend on
code that is not an API. What the example needs, the real MNIST set as NumPy arrays, is
``hvdtrain.load_mnist`` (``hvdtrain/data/mnist.py``, which the image recipe uses too).
"""

from __future__ import annotations

import ast
import json

import numpy as np
import pytest

import hvdtrain
from hvdtrain.data.index import DataError
from jobs import REPO


def _example_sources():
    for path in sorted((REPO / "examples").glob("*.py")):
        yield path.name, path.read_text()
    for path in sorted((REPO / "examples").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        yield path.name, "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))


def _imports(source: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add(node.module or "")
    return found


def test_the_examples_import_no_recipe_internals():
    sources = dict(_example_sources())
    assert {"my_recipe.py", "quickstart.ipynb"} <= set(sources)
    for name, source in sources.items():
        internal = sorted(m for m in _imports(source) if m.split(".")[0] in ("recipes", "hvdtrain_recipes"))
        assert internal == [], f"{name} imports {internal}"
        # beside hvdtrain.*: the framework packages' public pieces (build_optimizer, prepare, hvdtrain.keras),
        # and the notebook's report plots; never the core, data or launch internals
        inner = sorted(m for m in _imports(source) if m.startswith("hvdtrain.")
                       and m.split(".")[1] not in ("torch", "tensorflow", "keras", "reporting"))
        assert inner == [], f"{name} imports {inner}"


def test_load_mnist_is_public_and_gives_the_real_set():
    images, labels = hvdtrain.load_mnist("val")
    assert images.shape == (10000, 28, 28, 1) and images.dtype == np.uint8 and labels.dtype == np.int64
    assert sorted(np.unique(labels)) == list(range(10)) and 0.05 < (images > 0).mean() < 0.5  # real digits
    sub, sub_labels = hvdtrain.load_mnist("val", limit=100, seed=3)
    again, _ = hvdtrain.load_mnist("val", limit=100, seed=3)
    other, _ = hvdtrain.load_mnist("val", limit=100, seed=4)
    assert sub.shape == (100, 28, 28, 1) and np.array_equal(sub, again) and not np.array_equal(sub, other)
    rows = [i for i in range(len(images)) if any(np.array_equal(images[i], s) for s in sub[:3])]
    assert len(rows) >= 3 and np.array_equal(labels[rows[:1]], sub_labels[:1])  # a subset of the split, in order


@pytest.mark.parametrize("kwargs, named", [({"split": "test"}, "split='test'"), ({"limit": 0}, "limit=0")])
def test_load_mnist_names_a_bad_argument(kwargs, named):
    with pytest.raises(DataError, match=named):
        hvdtrain.load_mnist(**kwargs)
