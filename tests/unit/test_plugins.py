"""User recipes from outside hvdtrain: recipe files and the ``hvdtrain.recipes`` entry-point group.
(Both are run for real under horovodrun in tests/distributed/test_user_recipes.py.)"""

from __future__ import annotations

import sys
import textwrap
import uuid

import pytest
from click.testing import CliRunner

from hvdtrain.cli import main
from hvdtrain.core import plugins, registry
from hvdtrain.core.registry import RecipeError, get_recipe, list_recipes, unregister_recipe

from envguard import CLI_VARIABLES, isolate_environ

RECIPE_SOURCE = '''
import hvdtrain

hvdtrain.define_recipe({name!r}, description="from a file", defaults={{"train": {{"epochs": 3}}}})


@hvdtrain.register_recipe({name!r}, framework="torch")
def build(config, ctx):
    return "task"
'''


@pytest.fixture
def names():
    made = []
    yield lambda: made.append(f"plugin-test-{uuid.uuid4().hex[:8]}") or made[-1]
    for name in made:
        unregister_recipe(name)


def test_recipe_file_registers_its_recipe_once(tmp_path, names):
    name = names()
    path = tmp_path / "my_recipe.py"
    path.write_text(RECIPE_SOURCE.format(name=name))
    assert plugins.resolve_recipe_name(str(path)) == name
    assert plugins.resolve_recipe_name(f"{path}:{name}") == name
    assert plugins.load_recipe_file(path) == [name]  # loading again does not redefine it
    spec = get_recipe(name)
    assert spec.defaults == {"train": {"epochs": 3}} and spec.builders["torch"](None, None) == "task"


def test_file_with_two_recipes_needs_a_name(tmp_path, names):
    first, second = sorted([names(), names()])
    path = tmp_path / "two.py"
    path.write_text(RECIPE_SOURCE.format(name=first) + RECIPE_SOURCE.format(name=second))
    with pytest.raises(RecipeError, match=f"several recipes .*{first}.*{second}.*two.py:NAME"):
        plugins.resolve_recipe_name(str(path))
    with pytest.raises(RecipeError, match=f"defines no recipe 'nope'; it defines: {first}, {second}"):
        plugins.resolve_recipe_name(f"{path}:nope")


@pytest.mark.parametrize("source,needle", [
    ("import hvdtrain\n", "registered no recipe"),
    ("x = 1\nraise RuntimeError('broken on purpose')\n", "RuntimeError: broken on purpose (at "),
])
def test_bad_recipe_files_are_named(tmp_path, source, needle):
    path = tmp_path / f"bad_{uuid.uuid4().hex[:6]}.py"
    path.write_text(source)
    with pytest.raises(RecipeError) as err:
        plugins.load_recipe_file(path)
    assert str(path) in str(err.value) and needle in str(err.value)


def test_cli_names_a_missing_recipe_file(tmp_path, monkeypatch):
    isolate_environ(monkeypatch, CLI_VARIABLES)  # the CLI sets TF_CPP_MIN_LOG_LEVEL in this process
    result = CliRunner().invoke(main, ["recipe", str(tmp_path / "nope.py")])
    assert result.exit_code == 2
    assert f"recipe file {tmp_path / 'nope.py'} does not exist" in result.output


def _install_plugin(root, dist, entries, modules):
    """A minimal installed distribution: a dist-info folder with entry_points.txt, plus modules."""
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[hvdtrain.recipes]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()))
    for module, source in modules.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source))


def test_entry_point_recipes_are_listed_and_broken_ones_explained(tmp_path, names, monkeypatch):
    good, broken = names(), names()
    module = f"plugin_{uuid.uuid4().hex[:8]}"
    _install_plugin(tmp_path, f"hvdtrain_{module}", {good: module, broken: f"{module}_broken"},
                    {module: RECIPE_SOURCE.format(name=good), f"{module}_broken": "raise ImportError('needs foo')\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    monkeypatch.setattr(registry, "_entry_point_errors", {})
    with pytest.warns(RuntimeWarning, match=f"recipe '{broken}' from entry point"):
        recipes = list_recipes()
    assert good in recipes and recipes[good].description == "from a file"
    assert broken not in recipes
    with pytest.raises(RecipeError, match=f"'{broken}' from entry point '{module}_broken'.*ImportError: needs foo"):
        get_recipe(broken)
    sys.modules.pop(module, None)
