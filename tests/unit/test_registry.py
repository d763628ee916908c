"""hvdtrain.core.registry: defining, registering and looking up recipes."""

from __future__ import annotations

import uuid

import pytest

import hvdtrain
from hvdtrain.core.config import RunConfig
from hvdtrain.core.registry import (RecipeError, RecipeSpec, define_recipe, get_builder, get_recipe,
                                    list_recipes, register_recipe, unregister_recipe)


@pytest.fixture
def name():
    """A recipe name no other test uses; unregistered afterwards."""
    value = f"test-recipe-{uuid.uuid4().hex[:10]}"
    yield value
    unregister_recipe(value)


def _builder(config, ctx):
    return ("built", config, ctx)


def test_define_register_get(name):
    defaults = {"train": {"epochs": 3}}
    spec = define_recipe(name, description="a test recipe", defaults=defaults)
    assert isinstance(spec, RecipeSpec)
    assert (spec.name, spec.description, spec.defaults, spec.builders) == (name, "a test recipe", defaults, {})

    def build_torch(config, ctx):
        return "torch-task"

    def build_tf(config, ctx):
        return "tf-task"

    assert register_recipe(name, framework="torch")(build_torch) is build_torch
    assert register_recipe(name, framework="tensorflow")(build_tf) is build_tf
    assert get_recipe(name) is spec
    assert spec.builders == {"torch": build_torch, "tensorflow": build_tf}
    assert get_builder(name, "torch") is build_torch
    assert get_builder(name, "tensorflow")(None, None) == "tf-task"
    assert name in list_recipes()


def test_public_api_exposes_the_registry(name):
    hvdtrain.define_recipe(name, defaults={"model": {"name": "x"}})

    @hvdtrain.register_recipe(name, framework="torch")
    def build(config, ctx):
        return 1

    assert hvdtrain.get_recipe(name).builders["torch"] is build
    assert name in hvdtrain.list_recipes()
    hvdtrain.unregister_recipe(name)
    assert name not in hvdtrain.list_recipes()


def test_define_copies_the_defaults_mapping(name):
    defaults = {"train": {"epochs": 3}}
    spec = define_recipe(name, defaults=defaults)
    defaults["optim"] = {"lr": 1.0}
    assert "optim" not in spec.defaults


def test_register_defines_the_recipe_on_first_use(name):
    register_recipe(name, framework="tensorflow")(_builder)
    spec = get_recipe(name)
    assert spec.name == name and spec.description == "" and spec.defaults == {}
    assert list(spec.builders) == ["tensorflow"]


def test_duplicate_define_names_the_recipe(name):
    define_recipe(name, description="first")
    with pytest.raises(RecipeError) as err:
        define_recipe(name, description="second")
    assert repr(name) in str(err.value)
    assert "already defined" in str(err.value)
    assert get_recipe(name).description == "first"


def test_duplicate_builder_names_the_recipe_and_framework(name):
    register_recipe(name, framework="torch")(_builder)

    def other(config, ctx):
        return None

    with pytest.raises(RecipeError) as err:
        register_recipe(name, framework="torch")(other)
    message = str(err.value)
    assert repr(name) in message
    assert "torch" in message
    assert "_builder" in message  # the builder already registered
    assert get_builder(name, "torch") is _builder


def test_unknown_recipe_lists_known_recipes(name):
    define_recipe(name)
    with pytest.raises(RecipeError) as err:
        get_recipe("no-such-recipe")
    message = str(err.value)
    assert "'no-such-recipe'" in message
    assert "image-classification" in message
    assert name in message
    with pytest.raises(RecipeError, match="no-such-recipe"):
        get_builder("no-such-recipe", "torch")


def test_unknown_framework_lists_available_ones(name):
    register_recipe(name, framework="torch")(_builder)
    with pytest.raises(RecipeError) as err:
        get_builder(name, "tensorflow")
    message = str(err.value)
    assert repr(name) in message and "'tensorflow'" in message
    assert "available frameworks: torch" in message


def test_recipe_without_builders_says_none(name):
    define_recipe(name)
    with pytest.raises(RecipeError, match="available frameworks: none"):
        get_builder(name, "torch")


@pytest.mark.parametrize("framework", ["jax", "mxnet", "Torch", ""])
def test_register_with_unsupported_framework(name, framework):
    with pytest.raises(RecipeError) as err:
        register_recipe(name, framework=framework)
    message = str(err.value)
    assert repr(framework) in message
    assert "torch" in message and "tensorflow" in message
    assert name not in list_recipes()


def test_unregister(name):
    define_recipe(name)
    unregister_recipe(name)
    with pytest.raises(RecipeError):
        get_recipe(name)
    unregister_recipe(name)  # unknown names are ignored
    define_recipe(name)      # and the name can be defined again
    assert get_recipe(name).name == name


def test_recipe_error_is_a_lookup_error():
    assert issubclass(RecipeError, LookupError)


def test_list_recipes_is_sorted_and_a_copy(name):
    define_recipe(name)
    recipes = list_recipes()
    assert list(recipes) == sorted(recipes)
    recipes.pop(name)
    assert name in list_recipes()


def test_builtin_image_classification_recipe():
    recipes = list_recipes()
    assert "image-classification" in recipes
    spec = get_recipe("image-classification")
    assert set(spec.builders) == {"torch", "tensorflow"}
    assert all(callable(b) for b in spec.builders.values())
    assert spec.description
    config = hvdtrain.load_config(spec.defaults, framework="tensorflow")
    assert isinstance(config, RunConfig)
    assert config.recipe == "image-classification"
    assert config.framework == "tensorflow"
    assert config.model.name == spec.defaults["model"]["name"]
    assert config.train.epochs == spec.defaults["train"]["epochs"]
