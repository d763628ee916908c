"""`hvdtrain convert SRC DEST --to webdataset|parquet`: an image tree into shards; `--verify DEST SRC` checks them.

The work is done by :mod:`hvdtrain.data.convert` (layouts, naming, manifest, resume) and
:mod:`hvdtrain.data.convert_verify` (the check).
"""

from __future__ import annotations

import click

from hvdtrain.cli.common import USER_ERRORS, fail, main

SHOWN = 5  # problems named on the error line of --verify


@main.command("convert")
@click.argument("paths", nargs=2, metavar="SRC DEST | --verify DEST SRC", type=click.Path())
@click.option("--to", "fmt", type=click.Choice(["webdataset", "parquet"]), default=None,
              help="Output format: WebDataset tar shards or Hugging Face-style Parquet files.")
@click.option("--split", "splits", multiple=True, help="A split folder of SRC to convert (repeat; default: train "
              "and val, those that exist).")
@click.option("--shard-size", default=None, help="Target bytes per shard, e.g. 256MB, 1GiB (default 256MB).")
@click.option("--samples-per-shard", type=int, default=None, help="Samples per shard (instead of --shard-size).")
@click.option("--workers", type=int, default=1, show_default=True, help="Processes writing (or reading) shards.")
@click.option("--val-labels", type=click.Path(dir_okay=False), default=None,
              help="Labels CSV of a flat SRC/val (ImageNet's LOC_val_solution.csv, or file,class).")
@click.option("--shuffle-seed", type=int, default=0, show_default=True,
              help="Seed of the sample order (shards then mix classes).")
@click.option("--no-shuffle", is_flag=True, help="Keep the sorted order of the tree (class by class).")
@click.option("--verify", is_flag=True, help="Check DEST against SRC instead: every image once, same bytes and label.")
def convert_command(paths, fmt, splits, shard_size, samples_per_shard, workers, val_labels, shuffle_seed, no_shuffle,
                    verify) -> None:
    """Convert an ImageFolder tree SRC/{train,val}/<class>/<images> (or a flat SRC/val with
    --val-labels) into WebDataset shards DEST/<split>-NNNNNN.tar or Parquet files
    DEST/data/<split>-NNNNN-of-NNNNN.parquet, with DEST/manifest.json. Run again with the same
    arguments to finish a conversion that was killed. With --verify, the paths are DEST SRC."""
    try:
        if verify:
            _verify(*paths, val_labels=val_labels, workers=workers)
            return
        if fmt is None:
            raise click.UsageError("--to is required: webdataset or parquet")
        _convert(*paths, fmt=fmt, splits=splits, shard_size=shard_size, samples_per_shard=samples_per_shard,
                 workers=workers, val_labels=val_labels, shuffle_seed=None if no_shuffle else shuffle_seed)
    except USER_ERRORS as exc:
        fail(exc)


def _convert(src: str, dest: str, **options) -> None:
    from hvdtrain.data.convert import convert

    def progress(entry: dict) -> None:
        click.echo(f"wrote {entry['name']}  {entry['samples']:,d} images  {entry['bytes'] / 1e6:,.1f} MB")

    result = convert(src, dest, progress=progress, **options)
    for name, split in result.manifest["splits"].items():
        count = len(split["shards"])
        click.echo(f"{name:8s} {split['samples']:>10,d} images in {count:,d} shard{'s' * (count != 1)}")
    seconds = max(result.seconds, 1e-9)
    kept = f"; kept {result.kept} finished shards" if result.kept else ""
    click.echo(f"wrote {result.written} shards ({result.samples_written:,d} images, {result.bytes_written / 1e6:,.1f} MB) "
               f"in {result.seconds:.1f} s: {result.samples_written / seconds:,.0f} images/s, "
               f"{result.bytes_written / 1e6 / seconds:,.1f} MB/s{kept}; manifest {dest}/manifest.json")


def _verify(dest: str, src: str, **options) -> None:
    from hvdtrain.data.convert import ConvertError
    from hvdtrain.data.convert_verify import verify

    result = verify(dest, src, **options)
    if not result.ok:
        more = f" (and {result.total - SHOWN} more)" if result.total > SHOWN else ""
        raise ConvertError(f"{dest} does not match {src}: {result.total} problems: "
                           + "; ".join(result.problems[:SHOWN]) + more)
    click.echo(f"ok: {result.samples:,d} images in {result.shards:,d} shards match {src} "
               f"(bytes, labels, manifest checksums) in {result.seconds:.1f} s")
