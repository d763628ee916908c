"""`hvdtrain report RUN_DIR`: PNG plots of a run's loss, accuracy, LR and throughput, and a summary page."""

from __future__ import annotations

import click

from hvdtrain.cli.common import USER_ERRORS, fail, main


@main.command("report")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--output", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Where to write the PNG files (default: RUN_DIR/report).")
def report_command(run_dir, out_dir) -> None:
    """Render RUN_DIR's curves (loss, accuracy, learning rate, throughput) and a one-page summary as PNG."""
    from hvdtrain.reporting import load_run, render_report, summary_lines

    try:
        paths = render_report(run_dir, out_dir)
        for key, value in summary_lines(load_run(run_dir)):
            click.echo(f"{key:24s} {value}")
    except USER_ERRORS as exc:
        fail(exc)
    for path in paths:
        click.echo(f"wrote {path}")
