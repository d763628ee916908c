"""The ``hvdtrain`` command line. Each subcommand lives in its own module and registers itself on
:data:`hvdtrain.cli.common.main`; importing it here is all that adds a command."""

from hvdtrain.cli import env, recipe  # noqa: F401  (register the subcommands)
from hvdtrain.cli import predict  # noqa: F401
from hvdtrain.cli import bench  # noqa: F401
from hvdtrain.cli import report  # noqa: F401
from hvdtrain.cli import convert  # noqa: F401
from hvdtrain.cli import slurm  # noqa: F401
from hvdtrain.cli.common import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
