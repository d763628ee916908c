"""Worker for tests/distributed/test_token_cache.py: prepare bert-finetune's data under horovodrun
-np 2 (the token cache: one builder per host, the others wait at the recipe's barrier) and write
what this rank sees.

Usage: ``token_cache_ranks.py OUT_DIR FRAMEWORK KEY=VALUE...`` (config overrides). Every rank writes
``OUT_DIR/rank{R}.json``: how many rows it tokenised itself (the real batch encoder, counted), and
for its epoch-0 training shard and its validation shard the file line, token ids and segment ids
of each row as the padded batches give them.
"""

import json
import sys
from pathlib import Path

import numpy as np

import hvdtrain
from hvdtrain.core import sharding
from hvdtrain.core.adapter import load_adapter
from hvdtrain_recipes.bert_finetune import common, tokenized

out_dir, framework, overrides = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
config = hvdtrain.load_config(hvdtrain.get_recipe("bert-finetune").defaults, overrides=overrides,
                              recipe="bert-finetune", framework=framework)
adapter = load_adapter(framework)
ctx = adapter.init(config)

encoded = []
real_encode = tokenized.encode_chunk


def counted(tokenizer, texts, pairs, dtype):
    encoded.append(len(texts))
    return real_encode(tokenizer, texts, pairs, dtype)


tokenized.encode_chunk = counted
if framework == "torch":
    from hvdtrain_recipes.bert_finetune.torch_recipe import barrier
    names, dtype = tokenized.TORCH_INPUTS, "int64"
else:
    from hvdtrain_recipes.bert_finetune.tf_recipe import barrier
    names, dtype = tokenized.KERAS_HUB_INPUTS, "int32"
data = common.prepare(config, ctx, names, dtype, barrier=barrier)


def view(split, indices):
    """Line, token ids and segment ids of the rows at ``indices``, read through get_batch."""
    inputs, labels = split.get_batch(indices, 0)
    rows = []
    for position, index in enumerate(indices):
        n = int(inputs[names[1]][position].sum())
        rows.append({"line": int(split.arrays.lines[split.rows[index]]), "label": data.labels[labels[position]],
                     "ids": inputs[names[0]][position, :n].tolist(),
                     "segments": inputs[names[2]][position, :n].tolist()})
    return rows


train_shard = sharding.train_shard(len(data.train), ctx.rank, ctx.size, 0, config.train.seed)
val_shard = sharding.eval_shard(len(data.val), ctx.rank, ctx.size)
(out_dir / f"rank{ctx.rank}.json").write_text(json.dumps({
    "rank": ctx.rank, "size": ctx.size, "encoded_rows": int(sum(encoded)),
    "memmap": isinstance(data.train.arrays.ids, np.memmap),
    "train": view(data.train, train_shard), "val": view(data.val, val_shard)}))
