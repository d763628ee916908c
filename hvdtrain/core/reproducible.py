"""Bitwise mode, ``train.reproducible=world-size``: the weights after every update are bit for bit
the same on any world size that divides the update's micro-batches.

With a fixed global batch (:mod:`hvdtrain.core.batching`) update ``k`` already takes the same
samples at any world size, cut into the same ``M`` micro-batches. What still depends on the world
size is arithmetic order and random streams; this module is the framework-neutral plan that takes
both out, and each framework has one exchange that carries it out (torch:
:mod:`hvdtrain.torch.reproducible`, TensorFlow: :mod:`hvdtrain.tensorflow.reproducible`):

* **the micro-batch is the unit of computation**: each is computed alone (forward, backward), with
  a fixed number of intra-op threads (:func:`threads`: ``train.threads``, else 1) and the
  framework's deterministic kernels;
* **random draws keyed by (seed, update, micro-batch index)** (:func:`micro_seed`), never by rank:
  the loop reseeds the framework, and the exchange the layers' own seed states, before each
  micro-batch (:func:`before_micro_batch`);
  augmentation is already keyed by (seed, epoch, sample);
* **gradients combined along one fixed tree** (:func:`tree_sum`) over the ``M`` micro-batches,
  whatever worker computed them: when a worker's block of micro-batches is a node of that tree
  (:func:`blocks_are_nodes`: its accumulation is a power of two) it sums its block and the workers
  allgather the partial sums, else they allgather every micro-batch's gradient; either way every
  worker sums along the same tree, so every worker holds the same bits at any world size;
* **BatchNorm**: statistics per micro-batch (each is its own forward); the running statistics of
  every micro-batch start from the update's, and their mean over the ``M`` micro-batches, summed
  along the same tree, is what the update leaves (no averaging over ranks afterwards);
* **loss and metrics**: each micro-batch's loss is its own; the epoch sums add float32 values in
  float64 (exact for losses within 2^29 of each other), and validation batches are cut from the
  validation set in order and dealt round-robin (:func:`eval_batches`), the same batches at any
  world size, their sums added in float64.

What it costs and what it does not cover: docs/guides/world-size.md.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, TypeVar

import numpy as np

MODES = ("none", "world-size")
T = TypeVar("T")


def enabled(config: Any) -> bool:
    """Whether ``config`` asks for bitwise mode."""
    return getattr(config.train, "reproducible", "none") == "world-size"


def threads(config: Any) -> int:
    """Intra-op threads per process in bitwise mode: ``train.threads``, else 1 (a count that
    depends on how many workers share a host would change the kernels' summation order)."""
    return config.train.threads or 1


def micro_seed(seed: int, update: int, index: int) -> int:
    """The framework seed of micro-batch ``index`` (0 .. M-1) of update ``update`` (0-based):
    a 31-bit integer from NumPy's SeedSequence of ``(seed, update, index)``."""
    return int(np.random.SeedSequence([seed, update, index]).generate_state(1)[0] & 0x7FFFFFFF)


def split(n: int) -> int:
    """Where the tree over ``n`` leaves splits: the largest power of two below ``n``."""
    return 1 << ((n - 1).bit_length() - 1)


def tree_sum(items: Sequence[T], add: Callable[[T, T], T]) -> T:
    """``items`` summed along the fixed tree: the first ``split(n)`` and the rest, recursively."""
    if not items:
        raise ValueError("nothing to sum")
    if len(items) == 1:
        return items[0]
    cut = split(len(items))
    return add(tree_sum(items[:cut], add), tree_sum(items[cut:], add))


def blocks_are_nodes(accumulation: int) -> bool:
    """Whether each worker's contiguous block of ``accumulation`` micro-batches is a node of the
    tree over all ``M = workers x accumulation`` (true for a power of two): then summing the
    block first, and the blocks along the tree over ``workers`` leaves, is the same sum."""
    return accumulation & (accumulation - 1) == 0


def before_micro_batch(adapter: Any, config: Any, plan: Any, rank: int, update: int, local: int) -> None:
    """The loop calls this before each micro-batch: in bitwise mode the framework is reseeded from
    (seed, update, micro-batch index) and the exchange told a micro-batch begins (it keeps the
    previous one's gradient and resets the running statistics). Nothing otherwise."""
    if not enabled(config):
        return
    index = rank * plan.accumulation + local % plan.accumulation
    seed = micro_seed(config.train.seed, update, index)
    adapter.exchange.begin_micro_batch(seed)
    adapter.reseed(seed)


def loss_term(config: Any, loss: Any, samples: int) -> Any:
    """What a micro-batch adds to the epoch's loss sum: ``loss * samples`` as the framework computes
    it, or in bitwise mode that product in float64 (exact for a float32 loss), so that the sums of
    every rank, and their allreduce, are exact while the epoch's losses stay within about 2^14 of
    each other: ``train_loss`` then has the same digits at any world size."""
    return float(loss) * samples if enabled(config) else loss * samples


def eval_batches(num_samples: int, rank: int, world_size: int, batch_size: int) -> list[np.ndarray]:
    """Bitwise mode's validation batches for ``rank``: the set cut in order into batches of
    ``batch_size``, batch ``j`` on rank ``j % world_size`` (the same batches at any world size)."""
    cuts = [np.arange(i, min(i + batch_size, num_samples), dtype=np.int64) for i in range(0, num_samples, batch_size)]
    return cuts[rank::world_size]


def refusal(config: Any) -> str | None:
    """Why bitwise mode cannot run with ``config`` (one line naming both keys), or None."""
    if not enabled(config):
        return None
    key = "train.reproducible=world-size"
    comm, parallel, train = config.comm, config.parallel, config.train
    conflicts = (
        (train.global_batch_size is None, "train.global_batch_size unset",
         "only a fixed global batch takes the same samples per update at any world size; set it"),
        (comm.compression not in (None, "none"), f"comm.compression={comm.compression}",
         "compressed gradients are not summed along the fixed tree"),
        (train.fp16_allreduce, "train.fp16_allreduce=true", "float16 on the wire rounds partial sums"),
        (comm.local_sgd_steps > 1, f"comm.local_sgd_steps={comm.local_sgd_steps}",
         "local SGD averages models, not micro-batch gradients"),
        (comm.reduction == "adasum", "comm.reduction=adasum", "Adasum combines whole updates"),
        (parallel.shard_optimizer != "none", f"parallel.shard_optimizer={parallel.shard_optimizer}",
         "ZeRO reduce-scatters in world-size slices"),
        (parallel.pipeline_stages > 1, f"parallel.pipeline_stages={parallel.pipeline_stages}",
         "pipeline stages cut the model, not the batch"),
        (train.mixed_precision == "fp16", "train.mixed_precision=fp16", "the loss scaler's skips differ by rank"),
        (comm.overlap == "always", "comm.overlap=always", "the gradients are combined once per update, not during "
                                                          "the backward pass"),
        (train.compile != "none", f"train.compile={train.compile}", "compiled kernels are not checked for "
                                                                    "determinism here"),
    )
    for clash, other, why in conflicts:
        if clash:
            return f"{key} cannot be combined with {other}: {why}; drop {other}, or use train.reproducible=none"
    return None
