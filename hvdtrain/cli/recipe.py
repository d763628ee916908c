"""`hvdtrain recipe NAME`: train a recipe (every worker under horovodrun/mpirun runs this)."""

from __future__ import annotations

import click

from hvdtrain.cli.common import USER_ERRORS, fail, main
from hvdtrain.core.config import FRAMEWORKS, load_config
from hvdtrain.core.registry import get_recipe, list_recipes


@main.command("recipe")
@click.argument("name")
@click.option("--framework", type=click.Choice(FRAMEWORKS), default=None,
              help="Framework to train with (default: torch, or the config file's).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="YAML or TOML config file (sections: data, model, optim, train, checkpoint).")
@click.option("--data", default=None, help="Dataset location (default: the recipe's embedded data).")
@click.option("--epochs", type=int, default=None, help="Number of epochs.")
@click.option("--batch-size", type=int, default=None, help="Batch size per worker.")
@click.option("--lr", type=float, default=None, help="Base learning rate for one worker (scaled by world size).")
@click.option("--output", default=None, help="Output directory (default: runs/latest).")
@click.option("--resume", is_flag=True, default=None, help="Continue from the latest checkpoint in --output.")
@click.option("--fp16-allreduce", is_flag=True, default=None, help="Compress gradients to float16 for the allreduce.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override any config key, e.g. --set optim.warmup_epochs=1 (repeatable).")
def recipe_command(name, framework, config_file, data, epochs, batch_size, lr, output, resume, fp16_allreduce,
                   overrides) -> None:
    """Train recipe NAME (see `hvdtrain recipes`)."""
    from hvdtrain.core.loop import train

    try:
        spec = get_recipe(name)
        config = load_config(spec.defaults, config_file, overrides, recipe=name, framework=framework,
                             output=output, data__path=data, train__epochs=epochs,
                             train__batch_size=batch_size, optim__lr=lr, checkpoint__resume=resume or None,
                             train__fp16_allreduce=fp16_allreduce or None)
        train(config)
    except USER_ERRORS as exc:
        fail(exc)


@main.command("recipes")
def recipes_command() -> None:
    """List the recipes and their frameworks."""
    for name, spec in list_recipes().items():
        click.echo(f"{name:24s} {','.join(sorted(spec.builders)):20s} {spec.description}")
