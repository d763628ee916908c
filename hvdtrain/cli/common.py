"""The ``hvdtrain`` click group and the error handling every command shares."""

from __future__ import annotations

import os
import sys

import click

from hvdtrain.core.adapter import FrameworkMissingError
from hvdtrain.core.checkpoint import CheckpointError
from hvdtrain.core.config import ConfigError
from hvdtrain.launch.hosts import HostError
from hvdtrain.core.loop import TrainingError
from hvdtrain.core.preemption import hold_early_warnings
from hvdtrain.core.redact import redact_text
from hvdtrain.core.registry import RecipeError

# What the commands catch and turn into an ``hvdtrain: error:`` line and a non-zero exit.
USER_ERRORS = (ConfigError, RecipeError, ValueError, LookupError, ImportError, RuntimeError, OSError)
# The user's mistakes: a bad value, name, file or folder, explained by the message alone. Anything
# else (a RuntimeError such as CUDA out-of-memory or an NCCL failure, an OSError, a KeyError) is a
# failure the user did not cause: it keeps its traceback.
EXPLAINED = (ConfigError, RecipeError, ValueError, TrainingError, CheckpointError, FrameworkMissingError, HostError)


def explained(exc: BaseException) -> bool:
    """Whether ``exc`` is a user's mistake its message explains: one of :data:`EXPLAINED`, or an
    OSError raised with a message only (``FileNotFoundError("RUN holds no exported model ...")``:
    no errno, so written for the user, not reported by the operating system)."""
    return isinstance(exc, EXPLAINED) or (isinstance(exc, OSError) and exc.errno is None and bool(exc.args))


def fail(exc: BaseException) -> None:
    """Print ``hvdtrain: error: ...`` and exit: 2 for bad config or names, 1 for anything else.
    Unexpected failures (not :func:`explained`) print their traceback first, on the failing
    rank; ``HVDTRAIN_TRACEBACK=1`` prints it for every error."""
    if os.environ.get("HVDTRAIN_TRACEBACK") or not explained(exc):
        import traceback

        traceback.print_exception(exc)
    click.echo(f"hvdtrain: error: {redact_text(str(exc))}", err=True)  # secrets in URIs: never shown
    sys.exit(2 if isinstance(exc, (ConfigError, RecipeError)) else 1)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="hvdtrain")
def main() -> None:
    """Horovod-based distributed training for PyTorch and TensorFlow/Keras 3.

    Run alone, or start N workers with: horovodrun -np N hvdtrain recipe NAME ...
    """
    hold_early_warnings()  # a scheduler's warning during start-up is kept for the run, not fatal
