"""The gradient exchange: how the workers' local gradients become the gradient every worker applies.

Both adapters hold one :class:`GradientExchange` (``adapter.exchange``, built in ``prepare``) and
call it at the same points of their update, in the spirit of Horovod's ``Compressor`` passed into
``DistributedOptimizer``::

    local gradients (backward, summed over the accumulation window)
        -> grads = exchange.reduce(grads)      # the collective(s): allreduce, PowerSGD, top-k...
        -> unscale, finite check, clip, optimizer update   (the adapter's ``_update``)
        -> exchange.after_update()            # local SGD: average every H updates
    before each evaluation / epoch-end checkpoint: exchange.sync_replicas()
    checkpoint: exchange.state() on every rank -> comm_state.npz; resume: exchange.load_state() or
    exchange.reset() (another world size, an elastic re-formation)

Where each framework calls it:

=====================  ===========================================  ==========================================
                       PyTorch (:mod:`hvdtrain.torch.adapter`)      TensorFlow (:mod:`hvdtrain.tensorflow.adapter`)
=====================  ===========================================  ==========================================
``reduce``             ``_apply_update``, after ``backward`` of the  ``_apply_step`` (the ``tf.function`` step),
                       window's last micro-batch; the result is     after ``tape.gradient`` and the
                       left in each ``p.grad`` and returned         accumulators; returns the gradients
``after_update``       end of ``_apply_update`` (also after a       end of ``_apply_step``, inside the graph
                       skipped non-finite update)                   (``tf.cond`` on a variable counter)
``sync_replicas``      ``FrameworkAdapter.sync_replicas`` (the loop, before evaluating), eagerly
``state``/``load_...`` :mod:`hvdtrain.core.compression_state` (``gather`` / ``restore``), eagerly
=====================  ===========================================  ==========================================

Which exchange runs is decided once, by :func:`hvdtrain.core.exchange_plan.plan_exchange`; each
framework's factory (:mod:`hvdtrain.torch.exchanges`, :mod:`hvdtrain.tensorflow.exchanges`) builds it,
with the optimizer the adapter steps and a state keeper for what differs when the optimizer state is
sharded, so the adapters never branch on the kind.

The exchanges, each in both frameworks (``hvdtrain/<framework>/compression.py``):

* ``Allreduce``: Horovod's own allreduce, average or Adasum, optional float16 on the wire. In
  torch it is ``hvd.DistributedOptimizer``: its hooks start each gradient's allreduce during the
  backward pass (overlap), and ``reduce`` is ``synchronize()`` (torch's exchanges also give
  ``stepping()``, the context around ``optimizer.step()``: Horovod's ``skip_synchronize()`` here,
  nothing for the others, whose optimizer is the recipe's own). In TensorFlow it is the function
  ``hvd.DistributedGradientTape`` applies to the tape's gradients, so the graph is the one the
  tape builds (each allreduce runs as soon as its gradient exists). No state. Without overlap
  (``comm.overlap``) torch's data parallelism uses ``FlatAllreduce`` instead
  (:mod:`hvdtrain.torch.flat_buffers`, ``comm.flat_gradients``, the default): every ``p.grad`` is
  a view of one flat buffer per dtype, and ``reduce`` averages the buffers in place with one
  allreduce (no fusion-buffer copies, one negotiation per update); the recipe's own optimizer is
  stepped and ``after_update`` zeroes the buffers. Same updates, bitwise, at 2 ranks.
* ``PowerSGD`` and ``TopK`` (error feedback; :mod:`hvdtrain.core.compression` describes them).
* ``LocalSGD``: ``reduce`` returns the local gradients; ``after_update`` averages the model
  (and optionally the optimizer state) every ``comm.local_sgd_steps`` updates.

**State** (:meth:`GradientExchange.state`): one flat ``dict[str, numpy.ndarray]`` per rank, the
same keys in both frameworks, stored by :mod:`hvdtrain.core.compression_state` as
``<rank>/<key>`` in ``comm_state.npz``:

==================  =========================================================================
``format``          :data:`STATE_FORMAT` (added by ``compression_state``; files without it are
                    format 1, which each exchange still reads)
``steps``           PowerSGD / top-k: exchanges so far (PowerSGD's warm-up counts them)
``q/<i>``           PowerSGD: ``Q`` (``m x r``, float32) of the ``i``-th gradient
``error/<i>``       error feedback of the ``i``-th gradient, in PyTorch's logical layout
                    ``(out, in, k...)``: PowerSGD the ``n x m`` matrix, top-k flattened
``since_average``   local SGD: updates since the last averaging
``model/<i>``       local SGD, between averagings: this rank's ``i``-th model tensor
                    (torch: ``state_dict()`` order; TensorFlow: ``model.variables`` order)
``optimizer/<i>``   local SGD: this rank's ``i``-th optimizer tensor (torch: the per-parameter
                    state tensors in parameter order, keys sorted; TensorFlow:
                    ``optimizer.variables`` order) whenever the ranks' optimizers differ
==================  =========================================================================

``<i>`` is the gradient's index among the trainable parameters (``q``, ``error``: unpadded) or a
five-digit index (``model``, ``optimizer``). A state holds only what the exchange needs: an
exchange without state returns ``{}`` and :attr:`GradientExchange.keeps_state` is False, so the
checkpoint holds no ``comm_state.npz`` and nothing is gathered.

**Two more features** plug in at the same points without touching the loop or the checkpoint code:

* *Sharded optimizer state* (``parallel.shard_optimizer``: ZeRO-1 ``optimizer``, ZeRO-2
  ``gradients``; :mod:`hvdtrain.torch.sharded`, :mod:`hvdtrain.tensorflow.sharded`): the gradients
  live in flat buffers, one per parameter group, padded to a multiple of the world size; ``reduce``
  averages them with one grouped allreduce (ZeRO-1) or reduce-scatters them so each rank keeps the
  averaged gradient of its own slice only (ZeRO-2); the optimizer the adapter steps updates this
  rank's slice with its 1/N of the optimizer state and all-gathers the parameters. The exchange
  itself keeps no state (``keeps_state`` False): checkpoints hold the whole optimizer state in data
  parallelism's format (gathered to rank 0 when saving, each rank's slice taken when loading), so a
  resume at any world size, sharded or not, re-shards on load.
* *Compiled steps* (``train.compile``, :mod:`hvdtrain.core.compiled`): torch compiles only the
  model's forward and backward (``torch.compile``), so the exchange runs unchanged from Horovod's
  hooks and ``p.grad``; TensorFlow compiles only the forward and ``tape.gradient`` with XLA, and the
  exchange stays in the step's ``tf.function`` outside the XLA part (Horovod's XLA ops exist only in
  its GPU builds).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

#: Version of the per-rank state layout in ``comm_state.npz`` (1: before one format for both
#: frameworks: torch's local SGD replica as one serialised blob, TensorFlow's top-k error in the
#: kernel's own layout and its local-SGD counter under ``steps``).
STATE_FORMAT = 2


@runtime_checkable
class GradientExchange(Protocol):
    """What both adapters call, at the same points of their update (see the module docstring)."""

    #: The run's :class:`~hvdtrain.core.compression.CommPlan` (None: Horovod's allreduce).
    plan: Any
    #: Whether :meth:`state` has anything to keep (decided by the kind of exchange, so the same on
    #: every rank: the checkpoint's gather is a collective only when it is True).
    keeps_state: bool
    #: Whether every rank's running statistics (BatchNorm) are equal after an update already, so
    #: ``sync_model_buffers`` has nothing to average (bitwise mode's tree sums them too).
    buffers_agree: bool

    def reduce(self, grads: list[Any]) -> list[Any]:
        """The gradients every rank applies, from this rank's local ``grads`` (a collective)."""

    def after_update(self) -> None:
        """Called once after every update, applied or skipped (local SGD may average here)."""

    def sync_replicas(self) -> None:
        """Make the ranks' models equal now (local SGD; before evaluations). A collective."""

    def state(self) -> dict[str, np.ndarray]:
        """This rank's state for the checkpoint (keys in the module docstring)."""

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Continue from what :meth:`state` returned on this rank (format 1 or 2)."""

    def reset(self) -> None:
        """Start afresh: a resume on another world size, or an elastic re-formation."""

    def restart(self, accumulation: int) -> None:
        """An elastic sync: a fresh update of ``accumulation`` micro-batches on this worker."""


class Stateless:
    """Mix-in for an exchange with no state and nothing to do after the update."""

    plan: Any = None
    keeps_state = False
    buffers_agree = False

    def after_update(self) -> None:
        """Nothing to do."""
        return None  # a body besides the docstring: TensorFlow's AutoGraph cannot convert an empty one

    def sync_replicas(self) -> None:
        """The replicas are always equal."""

    def state(self) -> dict[str, np.ndarray]:
        """No state."""
        return {}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """No state."""

    def reset(self) -> None:
        """No state."""

    def restart(self, accumulation: int) -> None:
        """Nothing counts the micro-batches here."""


def state_format(state: dict[str, Any]) -> int:
    """The layout version of a per-rank ``state`` read from a checkpoint."""
    return int(state["format"]) if "format" in state else 1


def indexed(state: dict[str, np.ndarray], prefix: str) -> dict[int, np.ndarray]:
    """``{i: array}`` for the keys ``<prefix><i>`` of ``state``, ``prefix`` ending in ``/``."""
    return {int(key[len(prefix):]): value for key, value in state.items() if key.startswith(prefix)}


def replica_key(kind: str, index: int) -> str:
    """``model/00003``: the key of a local-SGD replica tensor."""
    return f"{kind}/{index:05d}"
