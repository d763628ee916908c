"""The import graph of hvdtrain/ and hvdtrain_recipes/ has no cycle, and its layers point one way.

Read from the source (every import statement, those inside functions too: a lazy import that
closes a loop is still a loop), not from what happens to be imported at run time. An import
``from package.module import name`` is an arrow to ``package.module``; ``from package import
module`` to that module; ``import package`` to the package's ``__init__``. A module imported by
name, ``importlib.import_module("a.b")`` or ``__import__("a.b")``, is an arrow too, when the name is
a literal there, a module-level constant, or a loop over a literal or constant tuple of names (a
name computed at run time, such as the adapter a config names, is not seen).

The layers (docs/concepts/architecture.md) and what each may import, checked for project and
third-party packages alike (:data:`FORBIDDEN`): ``hvdtrain/core`` imports nothing above it (no
launch, tools, observability, data, framework adapter, entry point, the ``hvdtrain`` package, torch
or TensorFlow); the library never imports the recipes.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("hvdtrain", "hvdtrain_recipes")


def _modules() -> dict[str, Path]:
    found = {}
    for root in ROOTS:
        for path in (REPO / root).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        constants, loops = _constants(tree)
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Call):
                targets = _named_imports(node, constants, loops)
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in node.names:
                    targets.append(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
            for target in targets:
                while target not in modules and "." in target:  # a name inside a module: the module
                    target = target.rpartition(".")[0]
                if target in modules and target != name:
                    graph[name].add(target)
    return graph


def _strings(node: ast.AST | None, constants: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The names a literal, a constant's name or a literal tuple/list of them stands for."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return (node.value,)
    if isinstance(node, ast.Name):
        return constants.get(node.id, ())
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return tuple(s for element in node.elts for s in _strings(element, constants))
    return ()


def _constants(tree: ast.Module) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
    """Module-level string constants (and tuples of them), and loop variables over such tuples."""
    constants: dict[str, tuple[str, ...]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            constants[node.targets[0].id] = _strings(node.value, constants)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            constants[node.target.id] = _strings(node.value, constants)
    loops: dict[str, tuple[str, ...]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name):
            names = _strings(node.iter, constants)
            if names:
                loops[node.target.id] = loops.get(node.target.id, ()) + names
    return constants, loops


def _named_imports(call: ast.Call, constants: dict[str, tuple[str, ...]],
                   loops: dict[str, tuple[str, ...]]) -> list[str]:
    """What ``importlib.import_module(NAME)`` / ``import_module(NAME)`` / ``__import__(NAME)`` imports."""
    func = call.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if called not in ("import_module", "__import__") or not call.args:
        return []
    arg = call.args[0]
    if isinstance(arg, ast.Name) and arg.id in loops:
        return list(loops[arg.id])
    return list(_strings(arg, constants))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_anywhere():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


CONFIG = ("hvdtrain.core.config", "hvdtrain.core.config_error", "hvdtrain.core.config_files",
          "hvdtrain.core.config_loader", "hvdtrain.core.config_schema")


def test_config_is_a_leaf():
    """The config's modules (its face, schema, files, loader and error) import only each other."""
    graph = import_graph()
    assert set(CONFIG) <= set(graph)
    assert {module: graph[module] - set(CONFIG) for module in CONFIG} == {module: set() for module in CONFIG}


def test_layers_point_one_way():
    graph = import_graph()
    for module, imported in graph.items():
        if module.startswith("hvdtrain."):
            assert not any(t.startswith("hvdtrain_recipes") for t in imported), (module, imported)  # library never imports recipes
        if module.startswith("hvdtrain.core."):
            assert not any(t.startswith(("hvdtrain.torch", "hvdtrain.tensorflow", "hvdtrain.cli"))
                           for t in imported), (module, imported)
            assert "hvdtrain" not in imported, f"{module} imports the hvdtrain package upward"


# -- the layers (docs/concepts/architecture.md) -------------------------------------------------

RECIPES = ROOTS[1]
FRAMEWORKS = ("torch", "torchvision", "tensorflow", "keras", "tf_keras")
ENTRY = ("hvdtrain.cli", "hvdtrain.api", "hvdtrain.trainer", "hvdtrain.reporting")
# layer -> what its modules must not import (hvdtrain's packages and third-party ones)
FORBIDDEN = {
    "hvdtrain.core": ("hvdtrain.launch", "hvdtrain.tools", "hvdtrain.observability", "hvdtrain.data",
                      "hvdtrain.torch", "hvdtrain.tensorflow", *ENTRY, *FRAMEWORKS),
    "hvdtrain.launch": ("hvdtrain.observability", "hvdtrain.data", "hvdtrain.torch", "hvdtrain.tensorflow",
                        *ENTRY, *FRAMEWORKS),
    "hvdtrain.data": ("hvdtrain.launch", "hvdtrain.tools", "hvdtrain.observability", "hvdtrain.torch",
                      "hvdtrain.tensorflow", *ENTRY, *FRAMEWORKS),
    "hvdtrain.observability": ("hvdtrain.torch", "hvdtrain.tensorflow", *ENTRY, *FRAMEWORKS),
    "hvdtrain.tools": ("hvdtrain.launch", "hvdtrain.observability", *ENTRY),
    "hvdtrain.torch": ("hvdtrain.tensorflow", *ENTRY, "tensorflow", "keras", "tf_keras"),
    "hvdtrain.tensorflow": ("hvdtrain.torch", *ENTRY, "torch", "torchvision"),
    "hvdtrain": (RECIPES,),  # the whole library: recipes are found by entry point or a user's file
}


def all_imports(path: Path) -> set[str]:
    """Every module name ``path`` imports (project and third-party), by statement or by name."""
    tree = ast.parse(path.read_text(), str(path))
    constants, loops = _constants(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Call):
            found.update(_named_imports(node, constants, loops))
    return found


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def layer_violations() -> list[str]:
    """``module -> imported`` for every arrow :data:`FORBIDDEN` rules out."""
    graph, modules = import_graph(), _modules()
    wrong = []
    for module in sorted(graph):
        imported = graph[module] | all_imports(modules[module])
        for layer, forbidden in FORBIDDEN.items():
            if _under(module, layer):
                wrong += [f"{module} -> {target}" for target in sorted(imported)
                          if any(_under(target, f) for f in forbidden)]
    return sorted(set(wrong))


def test_every_layer_edge_the_architecture_page_draws():
    assert layer_violations() == []


def test_the_core_imports_not_even_the_hvdtrain_package():
    graph = import_graph()
    assert [m for m in graph if _under(m, "hvdtrain.core") and "hvdtrain" in graph[m]] == []


def test_named_imports_are_seen():
    tree = ast.parse(
        "import importlib\n"
        "NAMES = ('pkg.a', 'pkg.b')\n"
        "ONE = 'pkg.c'\n"
        "def f(x):\n"
        "    for m in NAMES:\n"
        "        importlib.import_module(m)\n"
        "    importlib.import_module(ONE)\n"
        "    __import__('pkg.d')\n"
        "    importlib.import_module(x)\n")
    constants, loops = _constants(tree)
    seen = {name for node in ast.walk(tree) if isinstance(node, ast.Call)
            for name in _named_imports(node, constants, loops)}
    assert seen == {"pkg.a", "pkg.b", "pkg.c", "pkg.d"}
