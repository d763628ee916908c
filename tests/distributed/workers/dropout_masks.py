"""Worker for tests/distributed/test_rank_randomness.py: run under horovodrun -np 2.

``python dropout_masks.py FRAMEWORK OUTPUT REPORT``: trains the image recipe's small CNN (which
has dropout) for one short epoch through the real Trainer, then draws a dropout mask the way the
model's dropout draws them during training (torch: the global generator; Keras: the layer's own
seed state), and rank 0 writes every rank's mask.
"""

import json
import sys

import numpy as np

from hvdtrain.api import resolve_config
from hvdtrain.trainer import Trainer

FRAMEWORK, OUTPUT, REPORT = sys.argv[1:4]
config = resolve_config("image-classification", framework=FRAMEWORK, output=OUTPUT, overrides=[
    "train.epochs=1", "train.batch_size=16", "data.max_train_samples=64", "data.max_val_samples=32",
    "train.log_every=0", "train.tensorboard=false", "checkpoint.enabled=false"])
trainer = Trainer(config)
trainer.fit()
if FRAMEWORK == "torch":
    import torch

    mask = (torch.nn.functional.dropout(torch.ones(256), 0.5, training=True) != 0).numpy()
else:
    import keras
    import tensorflow as tf

    def layers_of(model):  # the recipe's model sits inside a uint8-normalising wrapper
        for layer in model.layers:
            yield layer
            yield from layers_of(layer) if isinstance(layer, keras.Model) else ()

    layer = next(l for l in layers_of(trainer.adapter.model) if isinstance(l, keras.layers.Dropout))
    mask = np.asarray(layer(tf.ones((1, 256)), training=True))[0] != 0
masks = trainer.adapter.allgather_object(mask.astype(int).tolist())
if trainer.ctx.rank == 0:
    with open(REPORT, "w") as f:
        json.dump({"world_size": trainer.ctx.size, "masks": masks}, f)
