"""One launch of benchmarks/sharded_memory.py: a BERT classifier trained through the torch adapter
with AdamW under one ``parallel.shard_optimizer`` mode; rank 0 appends one JSON line to OUT.

    horovodrun -np 2 -H localhost:2 --gloo python benchmarks/workers/sharded_memory.py OUT.jsonl \\
        --model minilm|bert-base --mode none|optimizer|gradients --steps 8 --batch 8 --seq 128

``minilm``: the bert-finetune recipe's embedded all-MiniLM-L6-v2 (its pretrained weights, 2 labels);
``bert-base``: a BERT-base-sized classifier built from ``transformers.BertConfig()`` (hidden 768,
12 layers, 12 heads, vocabulary 30522: 109.5 M parameters), randomly initialised, nothing
downloaded. Batches are random token ids (the data pipeline is not what is measured).

Per rank: bytes of optimizer state held (``state`` tensors), bytes of gradients held right after the
exchange and at the end of the backward pass (the tensors' bytes, counted), the whole process's peak
resident memory (``ru_maxrss``) and peak virtual size (``VmPeak``, what ``ulimit -v`` limits).
Throughput: global samples/s from the end of the 2nd update to the last (rank 0's clock).
"""

import argparse
import json
import resource
import time

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--model", choices=("minilm", "bert-base"), default="minilm")
parser.add_argument("--mode", choices=("none", "optimizer", "gradients"), default="none")
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--batch", type=int, default=8, help="samples per rank per update")
parser.add_argument("--seq", type=int, default=128)
parser.add_argument("--label", default="")
parser.add_argument("--phases", action="store_true",
                    help="also time each update's gradient exchange and optimizer step (with ZeRO's parameter "
                         "allgather) per rank, median ms of the steps after the 2nd")
args = parser.parse_args()


def vm_peak_kib() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmPeak:"):
            return int(line.split()[1])
    return 0


def main():
    import horovod.torch as hvd
    import torch
    import torch.nn.functional as F
    import transformers

    from hvdtrain import ArrayDataset, TrainTask, load_config
    from hvdtrain.torch import TorchAdapter, build_optimizer
    from hvdtrain.torch.sharded import ShardedOptimizer
    from hvdtrain_recipes.bert_finetune.pretrained import embedded_model_dir
    from hvdtrain_recipes.bert_finetune.torch_recipe import LogitsOnly, parameter_groups

    transformers.utils.logging.set_verbosity_error()
    adapter = TorchAdapter()
    config = load_config(overrides=["train.seed=0", "train.threads=1", "optim.name=adamw", "optim.lr=2e-5",
                                    "optim.weight_decay=0.01", f"parallel.shard_optimizer={args.mode}"])
    ctx = adapter.init(config)
    torch.manual_seed(0)
    if args.model == "minilm":
        inner = transformers.AutoModelForSequenceClassification.from_pretrained(embedded_model_dir(), num_labels=2,
                                                                                dtype=torch.float32)
    else:
        inner = transformers.BertForSequenceClassification(transformers.BertConfig(num_labels=2))
    model = LogitsOnly(inner)
    vocab = inner.config.vocab_size
    dummy = ArrayDataset(np.zeros((2, 1), np.int64), np.zeros(2, np.int64))
    task = TrainTask(model, build_optimizer(parameter_groups(model, 0.01), config.optim),
                     lambda logits, y: F.cross_entropy(logits.float(), y), dummy, dummy,
                     metric_sums=lambda out, y: {})
    adapter.prepare(task, config)
    adapter.broadcast_state()
    n_params = sum(p.numel() for p in model.parameters())

    def grad_bytes():
        opt = adapter.optimizer
        if isinstance(opt, ShardedOptimizer):  # the parameters' gradients are views of its flat buffers
            return opt.gradient_bytes()
        return sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)

    held = {"backward": 0, "exchange": 0}
    reduce = adapter.exchange.reduce

    def reduce_and_count(grads):  # the bytes of gradients held before and after the exchange
        held["backward"] = max(held["backward"], grad_bytes())
        out = reduce(grads)
        held["exchange"] = max(held["exchange"], grad_bytes())
        return out
    adapter.exchange.reduce = reduce_and_count
    phase_ms: dict[str, list[float]] = {"exchange": [], "optimizer_step": [], "train_step": []}
    if args.phases:
        def timed(name, fn):
            def run(*a, **k):
                t0 = time.perf_counter()
                out = fn(*a, **k)
                phase_ms[name].append(1000 * (time.perf_counter() - t0))
                return out
            return run
        adapter.exchange.reduce = timed("exchange", adapter.exchange.reduce)
        adapter.optimizer.step = timed("optimizer_step", adapter.optimizer.step)
        adapter.train_step = timed("train_step", adapter.train_step)

    rng = np.random.default_rng(ctx.rank)
    times = []
    for step in range(args.steps):
        ids = rng.integers(1000, vocab, (args.batch, args.seq), dtype=np.int64)
        inputs = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        adapter.set_learning_rate(2e-5)
        adapter.train_step(inputs, rng.integers(0, 2, args.batch, dtype=np.int64))
        times.append(time.perf_counter())
    opt = adapter.optimizer
    state = opt.inner.state if isinstance(opt, ShardedOptimizer) else opt.state
    mine = {"rank": ctx.rank,
            "optimizer_bytes": sum(v.numel() * v.element_size() for s in state.values() for v in s.values()
                                   if torch.is_tensor(v) and v.dim() > 0),
            "grad_bytes_end_of_backward": held["backward"], "grad_bytes_after_exchange": held["exchange"],
            "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "vm_peak_kib": vm_peak_kib()}
    if args.phases:
        mine["phase_median_ms"] = {k: float(np.median(v[2:])) for k, v in phase_ms.items() if len(v) > 2}
    everyone = hvd.allgather_object(mine)
    if ctx.rank == 0:
        global_batch = args.batch * ctx.size
        rate = (len(times) - 2) * global_batch / (times[-1] - times[1])
        row = {"label": args.label, "model": args.model, "mode": args.mode, "world_size": ctx.size,
               "parameters": n_params, "param_bytes": n_params * 4, "batch_per_rank": args.batch, "seq": args.seq,
               "steps": args.steps, "samples_per_sec": rate, "ranks": everyone}
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps({k: v for k, v in row.items() if k != "ranks"}), flush=True)


if __name__ == "__main__":
    main()
