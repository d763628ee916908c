"""`hvdtrain env`: versions and Horovod's build, the block a bug report needs."""

import click

from hvdtrain.cli.common import main


@main.command("env")
def env_command() -> None:
    """Print versions and Horovod's build: the block a bug report needs."""
    from hvdtrain.core.environment import describe_environment

    click.echo(describe_environment())
