"""`hvdtrain predict RUN_DIR TEXT...`: classify text with a run's exported text model."""

from __future__ import annotations

import click

from hvdtrain.cli.common import USER_ERRORS, fail, main


@main.command("predict")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.argument("texts", nargs=-1, required=True)
def predict_command(run_dir, texts) -> None:
    """Print the label and its probability for each TEXT, one tab-separated line per text,
    using the model a bert-finetune run exported to RUN_DIR/model."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything needed is in the export folder
    try:
        from recipes.bert_finetune.predict import predict

        for prediction in predict(run_dir, list(texts)):
            click.echo(f"{prediction.label}\t{prediction.probability:.4f}\t{prediction.text}")
    except USER_ERRORS as exc:
        fail(exc)
