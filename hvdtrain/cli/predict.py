"""`hvdtrain predict RUN_DIR TEXT...`: classify inputs with a run's exported model.

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
@click.argument("texts", nargs=-1, required=True)
@click.option("--recipe", default=None, help="Recipe whose predict hook to use (default: the run's, from "
              "RUN_DIR/config.yaml).")
def predict_command(run_dir, texts, recipe) -> None:
    """Print the label and its probability for each TEXT, one tab-separated line per text,
    using the model a run (for example of bert-finetune) exported to RUN_DIR/model."""
    import os

    from hvdtrain.core.registry import get_hook

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything needed is in the export folder
    try:
        predict = get_hook(run_recipe(run_dir, recipe), "predict")
        for prediction in predict(run_dir, list(texts)):
            click.echo(f"{prediction.label}\t{prediction.probability:.4f}\t{prediction.text}")
    except USER_ERRORS as exc:
        fail(exc)
