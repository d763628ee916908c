"""keras-hub's BertTextClassifier as ordered blocks for pipeline stages (``parallel.pipeline_stages > 1``).

The TensorFlow counterpart of :mod:`hvdtrain_recipes.bert_finetune.torch_stages`: the embeddings, each
transformer layer, and the head (pooler on the first token, dropout, classifier). The blocks are
Keras layers that share the classifier's own layers (and so its variables), so the balanced cut
by parameter count groups them as in torch (for the embedded MiniLM-L6: embeddings | layers + head).
Composed in order they compute exactly the classifier's logits.
"""

from __future__ import annotations

import keras


class Embeddings(keras.layers.Layer):
    """Token, position and segment embeddings, LayerNorm and dropout of the micro-batch's inputs."""

    def __init__(self, backbone: keras.Model):
        super().__init__(name="bert_stage_embeddings")
        self.token_embedding = backbone.token_embedding
        self.position_embedding = backbone.position_embedding
        self.segment_embedding = backbone.segment_embedding
        self.embeddings_add = backbone.embeddings_add
        self.embeddings_layer_norm = backbone.embeddings_layer_norm
        self.embeddings_dropout = backbone.embeddings_dropout

    def call(self, inputs, training=None):
        tokens = self.token_embedding(inputs["token_ids"])
        x = self.embeddings_add((tokens, self.position_embedding(tokens),
                                 self.segment_embedding(inputs["segment_ids"])))
        return self.embeddings_dropout(self.embeddings_layer_norm(x), training=training)


class EncoderLayer(keras.layers.Layer):
    """One transformer layer; it also gets the model inputs, for the padding mask."""

    needs_inputs = True

    def __init__(self, layer: keras.layers.Layer):
        super().__init__(name=f"bert_stage_{layer.name}")
        self.layer = layer

    def call(self, hidden_and_inputs, training=None):
        hidden, inputs = hidden_and_inputs
        return self.layer(hidden, padding_mask=inputs["padding_mask"], training=training)


class Head(keras.layers.Layer):
    """Pooler (dense + tanh on the first token), dropout and the classification layer."""

    def __init__(self, pooled_dense: keras.layers.Layer, dropout: keras.layers.Layer, logits: keras.layers.Layer):
        super().__init__(name="bert_stage_head")
        self.pooled_dense, self.dropout, self.logits = pooled_dense, dropout, logits

    def call(self, hidden, training=None):
        return self.logits(self.dropout(self.pooled_dense(hidden[:, 0, :]), training=training))


def pipeline_blocks(classifier: keras.Model) -> list[keras.layers.Layer]:
    """``classifier`` (a built keras-hub ``BertTextClassifier``) as embeddings, layers, head."""
    backbone = getattr(classifier, "backbone", None)
    if backbone is None or not hasattr(backbone, "transformer_layers"):
        raise ValueError(f"parallel.pipeline_stages>1 supports keras-hub BERT classifiers (a .backbone with "
                         f"transformer_layers); {type(classifier).__name__} has none; use parallel.pipeline_stages=1")
    blocks: list[keras.layers.Layer] = [Embeddings(backbone)]
    blocks += [EncoderLayer(layer) for layer in backbone.transformer_layers]
    blocks.append(Head(backbone.pooled_dense, classifier.output_dropout, classifier.output_dense))
    return blocks
