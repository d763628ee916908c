"""`hvdtrain recipe NAME`: train a recipe (every worker under horovodrun/mpirun runs this).

NAME is a registered recipe (built-in or from an installed package's ``hvdtrain.recipes`` entry
point) or a user's recipe file, ``path/to/my_recipe.py`` (``path.py:name`` if it defines several).
"""

from __future__ import annotations

import sys

import click

from hvdtrain.cli.common import USER_ERRORS, fail, main
from hvdtrain.core.config import FRAMEWORKS, describe_keys
from hvdtrain.core.redact import redact_values
from hvdtrain.core.preemption import EXIT_PREEMPTED, Preempted
from hvdtrain.core.resolve import load_config
from hvdtrain.core.plugins import resolve_recipe_name
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
@click.option("--resume", is_flag=False, flag_value="yes", default=None, metavar="[auto]",
              help="Continue from the latest checkpoint in --output; '--resume auto' continues when --output "
              "holds this run's checkpoints and starts when it is unused (a requeued Slurm job, a restarted pod).")
@click.option("--fp16-allreduce", is_flag=True, default=None, help="Compress gradients to float16 for the allreduce.")
@click.option("--timeline", "--timeline-file", "timeline", type=click.Path(dir_okay=False), default=None,
              help="Write Horovod's timeline (Chrome trace JSON) to FILE on rank 0 (comm.timeline). After "
              "horovodrun spell it --timeline-file (horovodrun rejects --timeline as ambiguous).")
@click.option("--model", default=None, help="Model (model.name): an architecture, or for text recipes a "
              "Hugging Face model directory or hub name.")
@click.option("--text-column", default=None, help="Text recipes: column/key holding the text (text.text_column).")
@click.option("--text-pair-column", default=None, help="Text recipes: column/key holding the second text of "
              "sentence-pair tasks (text.text_pair_column).")
@click.option("--label-column", default=None, help="Text recipes: column/key holding the label (text.label_column).")
@click.option("--max-length", type=int, default=None, help="Text recipes: truncate to N tokens (text.max_length).")
@click.option("--elastic", is_flag=True, default=None, help="Horovod elastic training (train.elastic); launch "
              "with horovodrun --min-np/--max-np --host-discovery-script.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override any config key, e.g. --set optim.warmup_epochs=1 (repeatable).")
@click.option("--keys", "show_keys", is_flag=True, help="List every config key of recipe NAME (its own sections "
              "included) with its value after --config/--set, help, and allowed values; then exit.")
def recipe_command(name, framework, config_file, data, epochs, batch_size, lr, output, resume, fp16_allreduce,
                   timeline, model, text_column, text_pair_column, label_column, max_length, elastic,
                   overrides, show_keys) -> None:
    """Train recipe NAME (see `hvdtrain recipes`), or the recipe in the Python file NAME (my_recipe.py).
    `hvdtrain recipe NAME --keys` lists the recipe's config keys."""
    from hvdtrain.trainer import train

    try:
        name = resolve_recipe_name(name)
        spec = get_recipe(name)
        config = load_config(spec.defaults, config_file, overrides, recipe=name, framework=framework,
                             output=output, data__path=data, train__epochs=epochs,
                             train__batch_size=batch_size, optim__lr=lr, checkpoint__resume=_resume_mode(resume),
                             train__fp16_allreduce=fp16_allreduce or None, model__name=model,
                             text__text_column=text_column, text__label_column=label_column,
                             text__text_pair_column=text_pair_column,
                             text__max_length=max_length, comm__timeline=timeline,
                             train__elastic=elastic or None)
        if show_keys:
            _print_keys(config, spec)
            return
        train(config)
    except Preempted:  # rank 0 printed where it stopped and how to continue
        sys.exit(EXIT_PREEMPTED)
    except USER_ERRORS as exc:
        fail(exc)


def _resume_mode(value: str | None) -> bool | str | None:
    """``--resume`` (True), ``--resume auto`` ("auto"), or not given (None: the config's)."""
    if value is None:
        return None
    if value.lower() in ("yes", "true"):
        return True
    if value.lower() == "auto":
        return "auto"
    raise click.BadParameter(f"{value!r}: give --resume alone, or --resume auto", param_hint="--resume")


def _print_keys(config, spec) -> None:
    own = set(spec.sections)
    click.echo(f"Config keys of recipe {spec.name} (set with --set KEY=VALUE or a YAML/TOML file; "
               f"its own sections: {', '.join(sorted(own)) or 'none'}):")
    for key, value, text in describe_keys(config):
        marker = "*" if key.split(".")[0] in own else " "
        click.echo(f"{marker} {key} = {redact_values(value)!r}\n      {text}")  # secrets in URIs: never shown
    for old, new in spec.moved_keys.items():
        click.echo(f"  {old}: old spelling of {new} (still accepted)")


@main.command("recipes")
def recipes_command() -> None:
    """List the recipes and their frameworks."""
    for name, spec in list_recipes().items():
        click.echo(f"{name:24s} {','.join(sorted(spec.builders)):20s} {spec.description}")
