"""The adapter contract (:data:`hvdtrain.core.adapter.CORE_TOUCHES`) is what core touches on an adapter.

Every attribute or method that a module of ``hvdtrain/core`` reads, calls or sets on an adapter (an
object named ``adapter``, or any ``<something>.adapter``; ``getattr``/``hasattr``/``setattr`` with a
literal name count too) is parsed from the source and must equal the contract; the contract's
names are declared on :class:`~hvdtrain.core.adapter.FrameworkAdapter`, and both framework adapters
implement it: no abstract method left, and what the base leaves unset (``exchange``, ``model``...) is
set by their ``prepare``.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

import hvdtrain.core
from hvdtrain.core.adapter import CORE_TOUCHES, SET_BY_PREPARE, FrameworkAdapter

CORE = Path(hvdtrain.core.__file__).parent
REPO = CORE.parents[1]


def _is_adapter(node: ast.AST) -> bool:
    """``adapter`` or ``<anything>.adapter``."""
    return (isinstance(node, ast.Name) and node.id == "adapter") or \
        (isinstance(node, ast.Attribute) and node.attr == "adapter")


def touched(source: str) -> set[str]:
    """The names ``source`` touches on an adapter: ``adapter.x`` and ``getattr(adapter, "x")`` alike."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _is_adapter(node.value):
            names.add(node.attr)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2 and \
                _is_adapter(node.args[0]) and isinstance(node.args[1], ast.Constant):
            names.add(node.args[1].value)
    return names


def core_touches() -> dict[str, set[str]]:
    """Per name, the core modules that touch it on an adapter."""
    where: dict[str, set[str]] = {}
    for path in sorted(CORE.glob("*.py")):
        for name in touched(path.read_text()):
            where.setdefault(name, set()).add(path.name)
    return where


def test_the_parser_sees_reads_calls_writes_and_getattr():
    source = textwrap.dedent("""
        adapter.train_step(x)
        self.adapter.exchange.reduce(g)
        trainer.adapter.task_lr = True
        getattr(adapter, "model_buffers", None)
        other.exchange
        """)
    assert touched(source) == {"train_step", "exchange", "task_lr", "model_buffers"}


def test_the_contract_is_what_core_touches():
    where = core_touches()
    missing = {name: sorted(where[name]) for name in set(where) - set(CORE_TOUCHES)}
    stale = set(CORE_TOUCHES) - set(where)
    assert not missing, f"core touches these on an adapter but CORE_TOUCHES does not list them: {missing}"
    assert not stale, f"CORE_TOUCHES lists what no core module touches any more: {sorted(stale)}"


def test_the_contract_is_declared_on_the_base_class():
    declared = set(dir(FrameworkAdapter)) | set(FrameworkAdapter.__annotations__)
    assert set(CORE_TOUCHES) <= declared, sorted(set(CORE_TOUCHES) - declared)
    assert set(SET_BY_PREPARE) <= set(CORE_TOUCHES)


def _adapters() -> list[type]:
    classes = []
    for module, name in (("hvdtrain.torch.adapter", "TorchAdapter"),
                         ("hvdtrain.tensorflow.adapter", "TensorFlowAdapter")):
        pytest.importorskip(module.split(".")[1])
        classes.append(getattr(__import__(module, fromlist=[name]), name))
    return classes


def _assigned_in_prepare(cls: type) -> set[str]:
    """``self.x`` targets of the class's own ``prepare`` (tuple targets included)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.prepare)))
    names = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            for leaf in (target.elts if isinstance(target, ast.Tuple) else [target]):
                if isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name) and leaf.value.id == "self":
                    names.add(leaf.attr)
    return names


@pytest.mark.parametrize("index", [0, 1], ids=["torch", "tensorflow"])
def test_both_adapters_implement_the_contract(index):
    cls = _adapters()[index]
    assert issubclass(cls, FrameworkAdapter) and not cls.__abstractmethods__
    for name in CORE_TOUCHES:
        assert hasattr(cls, name) or name in SET_BY_PREPARE, f"{cls.__name__} lacks {name}"
    assert set(SET_BY_PREPARE) <= _assigned_in_prepare(cls), \
        f"{cls.__name__}.prepare leaves unset: {sorted(set(SET_BY_PREPARE) - _assigned_in_prepare(cls))}"
    assert cls.checkpoint_files, f"{cls.__name__}.checkpoint_files names no file load_state reads"


@pytest.mark.parametrize("path", ["hvdtrain/torch/adapter.py", "hvdtrain/tensorflow/adapter.py"])
def test_the_adapters_never_branch_on_the_kind_of_exchange(path):
    """Issue 39: the exchange plan decides and the framework's factory builds; an adapter reads no
    field of the plan that names the exchange (kind, adasum, overlap, fp16 on the wire) and tests no
    exchange's class, so a new exchange is a new class, not a new branch in each adapter."""
    tree = ast.parse((REPO / path).read_text())
    plan_fields = {"kind", "adasum", "overlap", "fp16_wire", "comm"}
    reads = sorted(f"{ast.unparse(node)} (line {node.lineno})" for node in ast.walk(tree)
                   if isinstance(node, ast.Attribute) and node.attr in plan_fields
                   and isinstance(node.value, ast.Attribute) and node.value.attr == "plan")
    class_tests = sorted(f"{ast.unparse(node)} (line {node.lineno})" for node in ast.walk(tree)
                         if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance"
                         and "exchange" in ast.unparse(node.args[0]).lower())
    assert not reads and not class_tests, reads + class_tests
