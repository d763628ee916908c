"""The bert-finetune task for PyTorch: ``transformers``' AutoModelForSequenceClassification."""

from __future__ import annotations

import inspect
from pathlib import Path

import torch
import torch.nn.functional as F

import hvdtrain
from hvdtrain.torch import build_optimizer
from hvdtrain_recipes.bert_finetune import common, export, pretrained, torch_stages
from hvdtrain_recipes.bert_finetune.tokenized import TORCH_INPUTS
from hvdtrain_recipes.model_files import from_pretrained

NO_DECAY = ("bias", "LayerNorm.weight", "layer_norm.weight", "norm.weight")


class LogitsOnly(torch.nn.Module):
    """Wraps a Hugging Face classifier so the loop sees plain logits (and only inputs it accepts)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.accepted = set(inspect.signature(model.forward).parameters)

    def forward(self, **inputs: torch.Tensor) -> torch.Tensor:
        return self.model(**{k: v for k, v in inputs.items() if k in self.accepted}).logits


def load_model(model_dir: Path, labels: list[str], seed: int) -> torch.nn.Module:
    """The pretrained encoder from ``model_dir`` with a fresh head drawn from ``seed`` (see
    :func:`hvdtrain_recipes.bert_finetune.pretrained.head_weights`)."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model = from_pretrained(  # trust_remote_code=False; an auto_map or pickled weights: one line naming the folder
        transformers.AutoModelForSequenceClassification, model_dir, num_labels=len(labels), id2label=dict(enumerate(labels)),
        label2id={name: i for i, name in enumerate(labels)}, dtype=torch.float32)
    head = getattr(model, "classifier", None)
    if isinstance(head, torch.nn.Linear):
        kernel, bias = pretrained.head_weights(head.in_features, len(labels), seed,
                                               getattr(model.config, "initializer_range", 0.02))
        with torch.no_grad():
            head.weight.copy_(torch.from_numpy(kernel.T))
            head.bias.copy_(torch.from_numpy(bias))
    return model


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: weight decay on weights, none on biases and LayerNorm weights."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (no_decay if name.endswith(NO_DECAY) else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def metric_sums(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """Correct predictions and, per scored class, true positives, false positives, false negatives."""
    preds = logits.argmax(dim=1)
    sums = {"correct": (preds == labels).sum()}
    for k in common.scored_classes(logits.shape[1]):
        sums[f"tp_{k}"] = ((preds == k) & (labels == k)).sum()
        sums[f"fp_{k}"] = ((preds == k) & (labels != k)).sum()
        sums[f"fn_{k}"] = ((preds != k) & (labels == k)).sum()
    return sums


def barrier() -> None:
    """Wait until every rank arrives (a one-number allreduce)."""
    import horovod.torch as hvd

    hvd.allreduce(torch.zeros(1), name="bert_finetune.barrier")  # distributed


def build(config: hvdtrain.RunConfig, ctx: hvdtrain.DistContext) -> hvdtrain.TrainTask:
    """Model, optimizer, loss and data for one worker; the adapter wires up Horovod."""
    export.check_target(config.output, config.model.name)  # never replace a user's folder
    data = common.prepare(config, ctx, TORCH_INPUTS, dtype="int64", barrier=barrier)
    torch.manual_seed(config.train.seed)  # same dropout stream everywhere; rank 0's weights are broadcast
    model = load_model(data.model_dir, data.labels, config.train.seed)
    wrapped = LogitsOnly(model)

    def export_model(output: Path) -> None:
        export.write_export(output, lambda folder: model.save_pretrained(folder),
                            data.model_dir, data.labels, config.text.max_length)

    return hvdtrain.TrainTask(
        model=wrapped,
        optimizer=build_optimizer(parameter_groups(wrapped, config.optim.weight_decay), config.optim),
        loss_fn=lambda logits, labels: F.cross_entropy(logits.float(), labels),
        train_data=data.train,
        val_data=data.val,
        metric_sums=metric_sums,
        finalize_metrics=common.finalize_metrics,
        export=export_model,
        info={"model_dir": str(data.model_dir), "labels": data.labels},
        pipeline_blocks=lambda: torch_stages.pipeline_blocks(model),  # parallel.pipeline_stages > 1
    )
