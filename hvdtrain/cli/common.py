"""The ``hvdtrain`` click group and the error handling every command shares."""

from __future__ import annotations

import os
import sys

import click

from hvdtrain.core.config import ConfigError
from hvdtrain.core.registry import RecipeError

USER_ERRORS = (ConfigError, RecipeError, ValueError, LookupError, ImportError, RuntimeError, OSError)


def fail(exc: BaseException) -> None:
    """Print ``hvdtrain: error: ...`` and exit: 2 for bad config or names, 1 for anything else.
    ``HVDTRAIN_TRACEBACK=1`` also prints the traceback."""
    if os.environ.get("HVDTRAIN_TRACEBACK"):
        import traceback

        traceback.print_exception(exc)
    click.echo(f"hvdtrain: error: {exc}", err=True)
    sys.exit(2 if isinstance(exc, (ConfigError, RecipeError)) else 1)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="hvdtrain")
def main() -> None:
    """Horovod-based distributed training for PyTorch and TensorFlow/Keras 3.

    Run alone, or start N workers with: horovodrun -np N hvdtrain recipe NAME ...
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's INFO/WARNING start-up chatter
