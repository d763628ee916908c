"""`hvdtrain env`: versions and Horovod's build, the block a bug report needs; with ``--hosts``,
the versions of every host of a job side by side, mismatches named."""

import json

import click

from hvdtrain.cli.common import USER_ERRORS, fail, main


@main.command("env")
@click.option("--hosts", "-H", default=None,
              help="Run on every host of a job (Horovod's -H, e.g. h1:2,h2:2) over SSH and compare versions.")
@click.option("--ssh-port", "-p", type=int, default=None, help="SSH port of the hosts (as horovodrun -p).")
@click.option("--ssh-identity-file", "-i", default=None, help="SSH private key (as horovodrun -i).")
@click.option("--json", "as_json", is_flag=True, help="Print this host's versions as one JSON line.")
def env_command(hosts, ssh_port, ssh_identity_file, as_json) -> None:
    """Print versions and Horovod's build: the block a bug report needs.

    With --hosts, run `hvdtrain env` on every host (this Python's path, over SSH) and print their
    versions side by side; exit 1 naming the hosts whose hvdtrain, Python, torch, TensorFlow,
    Keras or Horovod version differs, or a host SSH cannot reach. Run it before a multi-host job.
    """
    from hvdtrain.tools import environment

    if as_json:
        click.echo(json.dumps(environment.versions()))
        return
    if not hosts:
        click.echo(environment.describe_environment())
        return
    from hvdtrain.launch import hosts as host_checks

    try:
        found = host_checks.host_versions(hosts, ssh_port, ssh_identity_file)
        click.echo(host_checks.format_table(found))
        wrong = host_checks.mismatches(found)
        if wrong:
            raise host_checks.HostError("version mismatch across hosts: " + " | ".join(wrong))
    except USER_ERRORS as exc:
        fail(exc)
    click.echo(f"versions agree on all {len(found)} host(s)")
