"""`hvdtrain predict RUN_DIR INPUT...`: classify inputs (texts, image files) with a run's exported model.

The recipe that trained the run (``RUN_DIR/config.yaml``'s ``recipe``, or ``--recipe``) does the
work through its ``predict`` hook in the recipe registry; hvdtrain itself imports no recipe.
"""

from __future__ import annotations

from pathlib import Path

import click
import yaml

from hvdtrain.cli.common import USER_ERRORS, fail, main

DEFAULT_RECIPE = "bert-finetune"


def run_recipe(run_dir: str, recipe: str | None) -> str:
    """``recipe``, else the recipe named in the run's saved config, else bert-finetune."""
    if recipe:
        return recipe
    for folder in (Path(run_dir), Path(run_dir).parent):
        saved = folder / "config.yaml"
        if saved.is_file():
            try:
                name = (yaml.safe_load(saved.read_text()) or {}).get("recipe")
            except yaml.YAMLError:
                name = None
            if isinstance(name, str):
                return name
    return DEFAULT_RECIPE


@main.command("predict")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.argument("inputs", nargs=-1, required=True)
@click.option("--recipe", default=None, help="Recipe whose predict hook to use (default: the run's, from "
              "RUN_DIR/config.yaml).")
def predict_command(run_dir, inputs, recipe) -> None:
    """Print the label and its probability for each INPUT (a text for bert-finetune, an image
    file for image-classification), one tab-separated line per input, using the model the run
    exported to RUN_DIR/model."""
    import os

    from hvdtrain.core.own_loop import RECIPE as OWN_LOOP
    from hvdtrain.core.registry import RecipeError, get_hook

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything needed is in the export folder
    try:
        name = run_recipe(run_dir, recipe)
        if name == OWN_LOOP:  # no recipe exported a model: the script that trained it knows how to load it
            raise RecipeError(f"{run_dir} was trained by your own script (own-loop): hvdtrain predict needs a recipe "
                              f"run (--recipe NAME); load the checkpoint with run.load({run_dir!r}) in your script "
                              f"and call your model")
        predict = get_hook(name, "predict")
        for prediction in predict(run_dir, list(inputs)):
            shown = getattr(prediction, "input", None) or getattr(prediction, "text", "")
            click.echo(f"{prediction.label}\t{prediction.probability:.4f}\t{shown}")
    except USER_ERRORS as exc:
        fail(exc)
