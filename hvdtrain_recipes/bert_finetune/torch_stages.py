"""A BERT-family classifier as ordered blocks for pipeline stages (``parallel.pipeline_stages > 1``).

The blocks are the embeddings, each encoder layer, and the head (pooler, dropout, classifier);
the balanced cut by parameter count groups them, so with two stages the embeddings (the large
vocabulary table) and the first layers form stage 0 and the remaining layers and the head stage 1
(for the embedded MiniLM-L6, whose table is as large as its six layers together: embeddings |
layers + head). Composed in order they compute exactly ``BertForSequenceClassification``'s logits.
"""

from __future__ import annotations

import torch
from torch import nn


class Embeddings(nn.Module):
    """Token, position and segment embeddings of the micro-batch's inputs."""

    def __init__(self, embeddings: nn.Module):
        super().__init__()
        self.embeddings = embeddings

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.embeddings(input_ids=inputs["input_ids"], token_type_ids=inputs.get("token_type_ids"))


class EncoderLayer(nn.Module):
    """One encoder layer; it also gets the model inputs, for the attention mask."""

    needs_inputs = True

    def __init__(self, layer: nn.Module, config):
        super().__init__()
        self.layer = layer
        self.config = config

    def forward(self, hidden: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        from transformers.masking_utils import create_bidirectional_mask

        mask = create_bidirectional_mask(config=self.config, inputs_embeds=hidden,
                                         attention_mask=inputs.get("attention_mask"))
        return self.layer(hidden, mask)


class Head(nn.Module):
    """Pooler (first token), dropout and the classification layer."""

    def __init__(self, pooler: nn.Module | None, dropout: nn.Module, classifier: nn.Module):
        super().__init__()
        self.pooler, self.dropout, self.classifier = pooler, dropout, classifier

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        pooled = self.pooler(hidden) if self.pooler is not None else hidden[:, 0]
        return self.classifier(self.dropout(pooled))


def pipeline_blocks(classifier: nn.Module) -> list[nn.Module]:
    """``classifier`` (a ``BertForSequenceClassification``) as embeddings, layers, head."""
    bert = getattr(classifier, "bert", None)
    if bert is None or getattr(bert.config, "is_decoder", False):
        raise ValueError(f"parallel.pipeline_stages>1 supports BERT-family encoders (a .bert module); "
                         f"{type(classifier).__name__} has none; use parallel.pipeline_stages=1")
    layers = [EncoderLayer(layer, bert.config) for layer in bert.encoder.layer]
    return [Embeddings(bert.embeddings), *layers, Head(bert.pooler, classifier.dropout, classifier.classifier)]
