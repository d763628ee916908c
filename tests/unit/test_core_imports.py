"""The framework-neutral core imports neither torch nor TensorFlow, and a missing framework is a
clear error. Checked in fresh interpreters where those packages cannot be imported at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from hvdtrain.core.adapter import FrameworkMissingError, load_adapter

BLOCKED = ("torch", "tensorflow", "keras", "horovod")

BLOCKER = textwrap.dedent(f"""
    import importlib.abc
    import json
    import sys

    BLOCKED = {BLOCKED!r}
    ATTEMPTS = []

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                ATTEMPTS.append(name)
                raise ImportError(f"{{name}} is blocked in this test")
            return None

    sys.meta_path.insert(0, Blocker())

    def loaded_blocked():
        return sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
""")

CORE_SCRIPT = BLOCKER + textwrap.dedent("""
    import importlib
    import pkgutil

    import hvdtrain
    import hvdtrain.core

    modules = []
    for info in pkgutil.iter_modules(hvdtrain.core.__path__):
        importlib.import_module(f"hvdtrain.core.{info.name}")
        modules.append(info.name)

    recipes = hvdtrain.list_recipes()
    spec = hvdtrain.get_recipe("image-classification")
    config = hvdtrain.load_config(spec.defaults, overrides=["train.epochs=1"], framework="tensorflow")
    print(json.dumps({
        "modules": modules,
        "recipes": sorted(recipes),
        "builders": sorted(spec.builders),
        "framework": config.framework,
        "model": config.model.name,
        "loaded_blocked": loaded_blocked(),
    }))
""")

ADAPTER_SCRIPT = BLOCKER + textwrap.dedent("""
    from hvdtrain import FrameworkMissingError, load_adapter

    results = {}
    for framework in ("torch", "tensorflow"):
        try:
            load_adapter(framework)
        except FrameworkMissingError as exc:
            results[framework] = {"type": "FrameworkMissingError", "message": str(exc),
                                  "is_import_error": isinstance(exc, ImportError),
                                  "cause": type(exc.__cause__).__name__}
        except BaseException as exc:
            results[framework] = {"type": type(exc).__name__, "message": str(exc)}
        else:
            results[framework] = {"type": None}
    results["attempts"] = sorted(set(a.split(".")[0] for a in ATTEMPTS))
    print(json.dumps(results))
""")


def _run_blocked(script: str, repo_root) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(repo_root), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, "-c", script], cwd=repo_root, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(60)
def test_core_imports_without_any_framework(repo_root):
    result = _run_blocked(CORE_SCRIPT, repo_root)
    expected = {"adapter", "checkpoint", "config", "loop", "prefetch", "rank0", "registry",
                "schedule", "sharding", "task"}
    assert expected <= set(result["modules"])
    assert "image-classification" in result["recipes"]
    assert result["builders"] == ["tensorflow", "torch"]
    assert result["framework"] == "tensorflow"
    assert result["model"] == "auto"  # small_cnn up to 64 pixels, resnet50 above
    assert result["loaded_blocked"] == []


@pytest.mark.timeout(60)
def test_missing_framework_names_the_extra_to_install(repo_root):
    result = _run_blocked(ADAPTER_SCRIPT, repo_root)
    for framework in ("torch", "tensorflow"):
        outcome = result[framework]
        assert outcome["type"] == "FrameworkMissingError", outcome
        assert outcome["is_import_error"] is True
        assert outcome["cause"] in ("ImportError", "ModuleNotFoundError")
        assert f"hvdtrain[{framework}]" in outcome["message"]
        assert framework in outcome["message"]
        # the adapter really tried to import a blocked package and says which one failed
        assert "is blocked in this test" in outcome["message"]
    assert result["attempts"] and set(result["attempts"]) <= set(BLOCKED)


def test_framework_missing_error_is_an_import_error():
    assert issubclass(FrameworkMissingError, ImportError)


@pytest.mark.parametrize("framework", ["jax", "mxnet", "Torch", ""])
def test_unsupported_framework_names_the_supported_ones(framework):
    with pytest.raises(ValueError) as err:
        load_adapter(framework)
    assert not isinstance(err.value, FrameworkMissingError)
    message = str(err.value)
    assert repr(framework) in message
    assert "torch" in message and "tensorflow" in message
