"""`hvdtrain slurm-hosts`: the Slurm allocation's hosts for launchers that take a host list."""

import click

from hvdtrain.cli.common import fail, main


@main.command("slurm-hosts")
@click.option("--hostfile", is_flag=True, help="One `NODE slots=N` line per node (mpirun --hostfile) instead.")
def slurm_hosts_command(hostfile) -> None:
    """Print this Slurm allocation's nodes with their task counts as `n1:2,n2:2`.

    For horovodrun (or mpirun) inside an sbatch script or salloc shell:
    `horovodrun -np $SLURM_NTASKS -H $(hvdtrain slurm-hosts) hvdtrain recipe ...`. Read from
    SLURM_JOB_NODELIST (expanded by `scontrol show hostnames` where installed) and
    SLURM_TASKS_PER_NODE.
    """
    from hvdtrain.launch.slurm import SlurmError, allocation_hosts

    try:
        hosts = allocation_hosts()
    except SlurmError as exc:
        fail(exc)
        return
    if hostfile:
        click.echo("\n".join(f"{node} slots={slots}" for node, slots in hosts))
    else:
        click.echo(",".join(f"{node}:{slots}" for node, slots in hosts))
