"""Optimizer state sharded across ranks for TensorFlow / Keras 3 on Horovod's collectives:
``parallel.shard_optimizer=optimizer`` (ZeRO-1) and ``=gradients`` (ZeRO-2).

The model's trainable variables are laid out in flat buffers, one per group of variables the
recipe's optimizer treats alike (same dtype, weight decay or not, the same learning-rate factor),
each cut into buckets of about :data:`BUCKET_ELEMENTS` at the variables' rows, each bucket
zero-padded to a multiple of the world size ``N`` (:class:`FlatGroup`). Rank ``r`` owns the
``r``-th ``1/N`` slice of every bucket, each slice a shard variable of its own (the update's
temporaries are a bucket's, not a whole buffer's), and a Keras optimizer of the recipe optimizer's
class and configuration is built over the shard variables only, so its slots (momentum, Adam's
moments) are ``1/N`` of data parallelism's. One update, inside the adapter's ``tf.function`` step (graph ops only):

1. :class:`ShardedExchange` (the run's gradient exchange) flattens the local gradients a bucket at
   a time and either averages each bucket with an allreduce and keeps this rank's slice
   (``optimizer``), or reduce-scatters it so that only this rank's averaged slice ever exists
   (``gradients``); a bucket is flattened once the bucket two before it has its slice and a
   bucket's gradients are freed once its collective has them, so the step never holds a second
   whole-model-sized gradient buffer (one whole-buffer collective did: ZeRO-2 then peaked above
   data parallelism);
2. the adapter unscales (fp16 loss scaling), asks :meth:`ShardedOptimizer.global_norm` for the norm
   of the whole gradient (this rank's sum of squares, summed across ranks: one scalar allreduce, so
   the finite check and global-norm clipping agree on every rank), clips, and applies the shard
   optimizer to the shard variables;
3. :meth:`ShardedOptimizer.gather` all-gathers the slices a bucket at a time (each bucket after
   the previous one is assigned) and assigns the whole model back on every rank.

The update is data parallelism's element by element, because the optimizers allowed
(:data:`ELEMENTWISE`) update each element from its own gradient and state.

**Checkpoints keep today's format** (``optimizer.npz``: the recipe optimizer's variables in order,
with their paths). The recipe optimizer (with the loss-scale wrapper, if any) is built over
shape-only stand-ins of the model's variables (:class:`_StandIn`): it holds its real scalar
variables (iterations, learning rate, loss scale) and zero-size slots with data parallelism's
paths, order and nothing else. :meth:`ShardedOptimizer.checkpoint_variables` lists what the file
holds: the scalars, and for each slot a :class:`HostValue` of the model variable's shape. Before
rank 0 saves, :meth:`ShardedOptimizer.collect` (every rank) readies the slots: while rank 0 writes
the file a variable at a time, each slot's rows come from the ranks' shards a bucket at a time (one
``alltoall`` per bucket and slot kind, the other ranks receiving nothing and sending the same
buckets in the same order), so rank 0 never holds the whole optimizer state; on resume rank 0 reads
the file into the host values and :meth:`ShardedOptimizer.broadcast` sends every rank only its
slice (``alltoall`` again): a sharded run resumes a data-parallel checkpoint and the other way
round, at any world size.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf
from keras.src.optimizers.base_optimizer import BaseOptimizer

from hvdtrain.core.config import ConfigError
from hvdtrain.core.exchange import Stateless
from hvdtrain.tensorflow.compression import tf_variables

#: Keras optimizers whose update of an element depends on that element's gradient and state only
#: (hvdtrain's own SGD, Adam and AdamW derive from them).
ELEMENTWISE = ("SGD", "Adam", "AdamW", "Adamax", "Nadam", "RMSprop", "Adagrad", "Adadelta", "Lion")
#: Hyperparameters hvdtrain's optimizers keep outside Keras's ``get_config()`` (coupled L2 decay).
EXTRA_HYPERPARAMETERS = ("l2",)
MODES = ("optimizer", "gradients")


def check_optimizer(optimizer: keras.optimizers.Optimizer, mode: str) -> None:
    """Refuse an optimizer whose update is not element by element (see the module docstring)."""
    names = {cls.__name__ for cls in type(optimizer).__mro__}
    if not names & set(ELEMENTWISE):
        raise ConfigError(f"parallel.shard_optimizer={mode}: the recipe's optimizer {type(optimizer).__name__} is "
                          f"not one whose update works element by element on a flat slice; use one of "
                          f"{', '.join(ELEMENTWISE)}, or parallel.shard_optimizer=none")


#: The flat buffers are cut into buckets of at most about this many elements (16 MiB of float32), at
#: the first-dimension rows of the variables (a large variable spans buckets; a single row larger
#: than a bucket is a bucket): each bucket is reduced and gathered by a collective of its own, so
#: the step never holds a second whole-model-sized buffer (the concatenated gradients, Horovod's
#: copy of what it reduces, the all-gathered parameters).
BUCKET_ELEMENTS = 1 << 22


class Bucket:
    """Consecutive rows of a group's variables: ``pieces`` ``(variable index, first row, end row,
    elements)``, ``total`` elements padded to ``shard`` per rank, stored at ``offset`` of each
    rank's shard."""

    def __init__(self, pieces: list[tuple[int, int, int, int]], size: int, offset: int) -> None:
        self.pieces = pieces
        self.total = sum(n for *_, n in pieces)
        self.shard = max(1, math.ceil(self.total / size))
        self.offset = offset


def _buckets(shapes: list[tuple[int, ...]], numels: list[int], size: int, limit: int) -> list[Bucket]:
    """The variables' rows (in order) cut into buckets of at most ``limit`` elements."""
    cuts: list[list[tuple[int, int, int, int]]] = [[]]
    filled = 0
    for index, (shape, numel) in enumerate(zip(shapes, numels)):
        rows = shape[0] if shape else 1
        row = numel // rows if rows else 0
        first = 0
        while row and first < rows:
            take = min(rows - first, (limit - filled) // row)
            if take <= 0 and cuts[-1]:
                cuts.append([])
                filled = 0
                continue
            take = max(take, 1)  # a row larger than a bucket is a bucket
            cuts[-1].append((index, first, first + take, take * row))
            filled += take * row
            first += take
    buckets, offset = [], 0
    for pieces in cuts:
        if pieces or not buckets:
            buckets.append(Bucket(pieces, size, offset))
            offset += buckets[-1].shard
    return buckets


class FlatGroup:
    """Where each of ``variables`` lies in the flat buffers of its group, and which slice rank
    ``rank`` owns: the variables' rows are cut into :class:`Bucket` s, each padded to a multiple of
    ``size``; rank ``r`` owns the ``r``-th ``1/size`` of every bucket, and its shard is those slices
    one after the other. The *whole buffer* is every rank's shard in rank order (rank-major: what an
    all-gather or all-to-all of the shards gives), ``padded`` elements."""

    def __init__(self, variables: list[Any], size: int, rank: int, bucket_elements: int | None = None) -> None:
        self.variables = variables
        self.size = size
        self.dtype = tf.as_dtype(variables[0].dtype)
        self.shapes = [tuple(int(d) for d in v.shape) for v in variables]
        self.numels = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
        self.total = sum(self.numels)
        self.buckets = _buckets(self.shapes, self.numels, size, bucket_elements or BUCKET_ELEMENTS)
        self.shard = sum(b.shard for b in self.buckets)
        self.padded = self.shard * size
        self.start = rank * self.shard
        self.rows: list[list[tuple[int, int, int, int, int]]] = [[] for _ in variables]
        for b, bucket in enumerate(self.buckets):  # variable -> [(bucket, first row, end row, offset, elements)]
            offset = 0
            for index, first, end, n in bucket.pieces:
                self.rows[index].append((b, first, end, offset, n))
                offset += n

    def bucket_flat(self, bucket: Bucket, tensors: list[Any]) -> Any:
        """The bucket's rows of ``tensors`` (None: zeros) flattened, concatenated and zero-padded to
        ``size * bucket.shard`` (graph ops): what the bucket's collective reduces."""
        pieces = []
        for index, first, end, n in bucket.pieces:
            tensor = tensors[index]
            if tensor is None:
                pieces.append(tf.zeros([n], self.dtype))
                continue
            tensor = tf.convert_to_tensor(tensor)
            whole = first == 0 and end == (self.shapes[index][0] if self.shapes[index] else 1)
            pieces.append(tf.reshape(tf.cast(tensor if whole else tensor[first:end], self.dtype), [-1]))
        if self.size * bucket.shard > bucket.total:
            pieces.append(tf.zeros([self.size * bucket.shard - bucket.total], self.dtype))
        return tf.concat(pieces, axis=0) if len(pieces) > 1 else pieces[0]

    def assign_bucket(self, bucket: Bucket, flat: Any) -> list[Any]:
        """Assign a bucket's flat values (``bucket_flat``'s layout) to its rows of the variables;
        the assign ops (graph ops)."""
        ops, offset = [], 0
        for index, first, end, n in bucket.pieces:
            variable = tf_variables([self.variables[index]])[0]  # sliced assignment needs the tf.Variable
            value = flat[offset:offset + n]
            offset += n
            shape = self.shapes[index]
            if first == 0 and end == (shape[0] if shape else 1):
                ops.append(variable.assign(tf.reshape(value, shape), read_value=False))
            else:
                ops.append(tf.raw_ops.ResourceStridedSliceAssign(  # variable[first:end] = value
                    ref=variable.handle, begin=[first], end=[end], strides=[1],
                    value=tf.reshape(value, (end - first, *shape[1:]))))
        return ops

    def flatten(self, tensors: list[Any]) -> Any:
        """The whole buffer of ``tensors`` (None: zeros) in rank-major order (graph ops)."""
        rows = [tf.reshape(self.bucket_flat(b, tensors), [self.size, b.shard]) for b in self.buckets]
        return tf.reshape(tf.concat(rows, axis=1), [-1])

    def mine(self, flat: Any) -> Any:
        """This rank's slice of a whole buffer."""
        return flat[self.start:self.start + self.shard]

    def flatten_host(self, arrays: list[np.ndarray | None]) -> np.ndarray:
        """:meth:`flatten` for NumPy arrays (None: zeros)."""
        dtype = self.dtype.as_numpy_dtype
        rows = np.zeros((self.size, self.shard), dtype=dtype)
        for bucket in self.buckets:
            flat, offset = np.zeros(self.size * bucket.shard, dtype=dtype), 0
            for index, first, end, n in bucket.pieces:
                if arrays[index] is not None:
                    array = np.asarray(arrays[index], dtype=dtype).reshape(self.shapes[index] or (1,))
                    flat[offset:offset + n] = array[first:end].reshape(-1)
                offset += n
            rows[:, bucket.offset:bucket.offset + bucket.shard] = flat.reshape(self.size, bucket.shard)
        return rows.reshape(-1)

    def split_host(self, flat: np.ndarray) -> list[np.ndarray]:
        """The variables' values from a whole buffer (NumPy, rank-major)."""
        rows = np.asarray(flat).reshape(self.size, self.shard)
        out = [np.zeros(s or (1,), dtype=rows.dtype) for s in self.shapes]
        for bucket in self.buckets:
            natural, offset = rows[:, bucket.offset:bucket.offset + bucket.shard].reshape(-1), 0
            for index, first, end, n in bucket.pieces:
                out[index][first:end] = natural[offset:offset + n].reshape(end - first, *out[index].shape[1:])
                offset += n
        return [o.reshape(s) for o, s in zip(out, self.shapes)]


class _StandIn:
    """A model variable's name, path, dtype and identity with no values: the recipe optimizer built
    over stand-ins has data parallelism's variable paths and order, and zero-size slots."""

    overwrite_with_gradient = False

    def __init__(self, variable: Any) -> None:
        self.path, self.name, self.dtype = variable.path, variable.name, variable.dtype
        self.shape = (0,)
        self._unique_id = variable.value._unique_id  # the recipe optimizer's keys (weight-decay exclusions)


class HostValue:
    """A slot of the recipe optimizer as data parallelism's checkpoint holds it: the model variable's
    shape, its values on rank 0 only while saving or loading (what
    :func:`~hvdtrain.tensorflow.checkpoint.save_variables` and ``load_variables`` read and assign)."""

    def __init__(self, path: str, shape: tuple[int, ...]) -> None:
        self.path, self.shape, self.value = path, shape, None
        self.name = path.rsplit("/", 1)[-1]
        self.fetch: Any = None  # on the root while saving: brings this slot's values (collectives)

    def numpy(self) -> np.ndarray:
        """The values: loaded ones, or on the root after :meth:`ShardedOptimizer.collect` this
        slot's, brought from every rank's shards now (saving asks for one slot after another)."""
        if self.value is not None:
            return self.value
        if self.fetch is None:
            raise RuntimeError(f"{self.path}: the sharded optimizer state was not collected on this rank")
        return self.fetch(self)

    def assign(self, value: Any) -> None:
        """Keep loaded values until :meth:`ShardedOptimizer.broadcast` shares them out."""
        self.value = np.asarray(value)


@contextlib.contextmanager
def _recording(optimizer: Any, made: list, stand_ins: bool) -> Iterator[None]:
    """While building ``optimizer``: record ``(reference variable, slot name, slot)`` for every slot
    it adds (stand-ins skip the TF backend's colocation with the reference)."""
    def record(reference_variable: Any, name: str | None = None, initializer: Any = "zeros") -> Any:
        if stand_ins:
            slot = BaseOptimizer.add_variable_from_reference(optimizer, reference_variable, name=name,
                                                             initializer=initializer)
        else:
            slot = original(reference_variable, name=name, initializer=initializer)
        made.append((reference_variable, name, slot))
        return slot

    original = optimizer.add_variable_from_reference
    optimizer.add_variable_from_reference = record
    try:
        yield
    finally:
        del optimizer.add_variable_from_reference


class ShardedOptimizer:
    """The recipe's ``optimizer`` (Keras) with its state sharded across the ranks.

    ``outer`` is what the adapter calls its optimizer (``optimizer`` itself, or Keras's
    ``LossScaleOptimizer`` around it): it is built over stand-ins here. ``variables``: the model's
    trainable variables (Keras variables). ``inner``: the shard optimizer, built over ``shards``."""

    def __init__(self, optimizer: Any, outer: Any, variables: list[Any], mode: str) -> None:
        check_optimizer(optimizer, mode)
        self.mode, self.size, self.rank = mode, hvd.size(), hvd.rank()
        self.recipe, self.outer = optimizer, outer
        factor = getattr(optimizer, "_lr_factor", lambda v: 1.0)
        kinds: dict[tuple, list[Any]] = {}
        for v in variables:  # variables the optimizer treats alike share a buffer
            kinds.setdefault((str(v.dtype), bool(optimizer._use_weight_decay(v)), factor(v)), []).append(v)
        self.groups = [FlatGroup(vs, self.size, self.rank) for vs in kinds.values()]
        #: (group, bucket) of each shard variable: this rank's slice of every bucket is a variable of
        #: its own, so the shard optimizer's update (and its temporaries) works a bucket at a time
        self.where = [(g, b) for g, group in enumerate(self.groups) for b in range(len(group.buckets))]
        self.shards = [keras.Variable(self._my_slice(g, b), dtype=self.groups[g].dtype.name, name=f"zero_shard_{g}_{b}")
                       for g, b in self.where]
        self.inner = type(optimizer).from_config(optimizer.get_config())
        for key in EXTRA_HYPERPARAMETERS:
            if hasattr(optimizer, key):
                setattr(self.inner, key, getattr(optimizer, key))
        kind = list(kinds)
        no_decay = [s for s, (g, _) in zip(self.shards, self.where) if not kind[g][1]]
        if no_decay:
            self.inner.exclude_from_weight_decay(var_list=no_decay)
        for shard, (g, _) in zip(self.shards, self.where):
            if kind[g][2] != 1.0:
                self.inner.set_lr_factor([shard], kind[g][2])
        inner_made: list = []
        with _recording(self.inner, inner_made, stand_ins=False):
            self.inner.build(self.shards)
        shell_made: list = []
        with _recording(optimizer, shell_made, stand_ins=True):
            outer.build([_StandIn(v) for v in variables])
        self.slot_names = sorted({name for _, name, _ in inner_made})
        index = {id(s): i for i, s in enumerate(self.shards)}
        self.slots = {(*self.where[index[id(ref)]], name): slot  # (group, bucket, name) -> the bucket slice's slot
                      for ref, name, slot in inner_made}
        where = {v.path: (g, i) for g, group in enumerate(self.groups) for i, v in enumerate(group.variables)}
        shape = {v.path: tuple(int(d) for d in v.shape) for v in variables}
        self._host = {id(slot): (where[ref.path], name, HostValue(slot.path, shape[ref.path]))
                      for ref, name, slot in shell_made}
        self._host_of = {id(host): (at, name, host) for at, name, host in self._host.values()}
        self._pending: list[HostValue] = []  # while saving: the slots not yet brought to the root
        slot_ids = {id(slot) for _, _, slot in inner_made}
        shell_scalars = [v for v in optimizer.variables if id(v) not in self._host]
        inner_scalars = [v for v in self.inner.variables if id(v) not in slot_ids]
        if [v.name for v in shell_scalars] != [v.name for v in inner_scalars]:
            raise RuntimeError(f"sharded optimizer: the shard optimizer's own variables "
                               f"{[v.name for v in inner_scalars]} are not the recipe optimizer's "
                               f"{[v.name for v in shell_scalars]}")
        self.scalars = list(zip(shell_scalars, inner_scalars))  # the recipe's and the shard optimizer's
        self.own = [v for v in outer.variables if id(v) not in self._host]  # loss scale too: real, whole
        self._collective_id = 0

    # -- the update (graph ops, inside the adapter's tf.function step) ---------------------------

    def global_norm(self, shard_grads: list[Any]) -> Any:
        """The norm of the whole gradient from every rank's slices (a scalar allreduce)."""
        squares = tf.add_n([tf.reduce_sum(tf.square(tf.cast(g, tf.float32))) for g in shard_grads])
        if self.size > 1:
            squares = hvd.allreduce(squares, op=hvd.Sum, name="hvdtrain.zero.norm")  # distributed
        return tf.sqrt(squares)

    def apply(self, shard_grads: list[Any]) -> None:
        """Step the shard optimizer on this rank's slices of the (unscaled, clipped) gradients."""
        self.inner.apply_gradients(zip(shard_grads, self.shards))

    def gather(self) -> None:
        """All-gather the updated slices and assign the whole model on every rank, a bucket at a
        time (a collective each; each waits for the previous bucket's assignments, so one bucket's
        gathered values exist at a time)."""
        previous: list[Any] = []
        for (g, b), shard in zip(self.where, self.shards):
            with tf.control_dependencies(previous):
                mine = tf.identity(tf.convert_to_tensor(shard))
            whole = mine if self.size == 1 else hvd.allgather(  # distributed
                mine, name=f"hvdtrain.zero.params.{g}.{b}")
            previous = self.groups[g].assign_bucket(self.groups[g].buckets[b], whole)

    def set_learning_rate(self, lr: float) -> None:
        """The learning rate the schedule set: into the shard optimizer (and the recipe's, saved)."""
        self.inner.learning_rate = lr

    # -- parameters and state, eagerly --------------------------------------------------------------

    def _my_slice(self, g: int, b: int) -> Any:
        """This rank's slice of bucket ``b`` of group ``g`` of the model variables (one bucket's
        flat copy at a time, eagerly)."""
        group = self.groups[g]
        bucket = group.buckets[b]
        return group.bucket_flat(bucket, list(group.variables))[self.rank * bucket.shard:(self.rank + 1) * bucket.shard]

    def take_parameters(self) -> None:
        """Each shard's values from the model variables (after they were loaded or broadcast)."""
        for (g, b), shard in zip(self.where, self.shards):
            shard.assign(self._my_slice(g, b))

    def checkpoint_variables(self) -> list[Any]:
        """What ``optimizer.npz`` holds, in data parallelism's order: the recipe optimizer's real
        scalars and a :class:`HostValue` for each slot."""
        return [self._host[id(v)][2] if id(v) in self._host else v for v in self.outer.variables]

    def variables(self) -> list[Any]:
        """This rank's optimizer variables (an in-memory snapshot's)."""
        return self.own + list(self.inner.variables)

    def state_bytes(self) -> int:
        """Bytes of optimizer slots this rank keeps."""
        return sum(int(np.prod(s.shape)) * tf.as_dtype(s.dtype).size for s in self.slots.values())

    def _name(self, what: str) -> str:
        self._collective_id += 1
        return f"hvdtrain.zero.{what}.{self._collective_id}"

    def _by_slot(self) -> dict[tuple[int, str], list[HostValue | None]]:
        """``(group, slot name) -> [host value of each of the group's variables]``."""
        out: dict[tuple[int, str], list[HostValue | None]] = {
            (g, name): [None] * len(self.groups[g].variables) for g, _, name in self.slots}
        for (group, i), name, host in self._host.values():
            out.setdefault((group, name), [None] * len(self.groups[group].variables))[i] = host
        return out

    def _saved_slots(self) -> list[HostValue]:
        """The slots' host values in the order the checkpoint file holds them (the order of the
        collectives that bring them)."""
        return [v for v in self.checkpoint_variables() if isinstance(v, HostValue)]

    def collect(self, root_rank: int = 0) -> None:
        """Every rank, before ``root_rank`` saves. The whole optimizer state never exists at once:
        the root's :class:`HostValue` s bring each slot's values when the saver asks for them, in
        the file's order, a bucket at a time (one ``alltoall`` of each rank's slice of a bucket: the
        other ranks receive nothing), so the root holds one variable's slot and one bucket per slot
        kind; the other ranks send the same buckets in the same order here."""
        for shell, inner in self.scalars:
            shell.assign(inner)
        self._root, self._received, self._pending = root_rank, {}, self._saved_slots()
        if self.rank == root_rank:
            for host in self._pending:
                host.fetch = self._fetch
            return
        while self._pending:
            self._fetch(self._pending[0])

    def _fetch(self, host: HostValue) -> np.ndarray | None:
        """The next slot of the file (``host``): its rows from the buckets holding them, each
        bucket's slices brought to the root by one ``alltoall`` (a collective; the values on the
        root, None elsewhere)."""
        if not self._pending or self._pending[0] is not host:
            raise RuntimeError(f"{host.path}: the sharded optimizer's slots must be saved in the checkpoint's "
                               f"order (expected {self._pending[0].path if self._pending else 'none'})")
        self._pending.pop(0)
        (g, i), name, _ = self._host_of[id(host)]
        group = self.groups[g]
        root = self.rank == self._root
        out = np.empty(group.shapes[i] or (1,), dtype=group.dtype.as_numpy_dtype) if root else None
        for b, first, end, offset, n in group.rows[i]:
            held = self._received.get((g, name))
            if held is None or held[0] != b:  # each kind of slot's buckets come in order: one at a time
                bucket = group.buckets[b]
                mine = tf.convert_to_tensor(self.slots[(g, b, name)])
                splits = [bucket.shard if r == self._root else 0 for r in range(self.size)]
                whole = mine if self.size == 1 else hvd.alltoall(mine, splits=splits,  # distributed
                                                                 name=self._name("collect"))[0]
                held = (b, whole.numpy() if root else None)
                self._received[(g, name)] = held
            if root:
                out[first:end] = held[1][offset:offset + n].reshape(end - first, *out.shape[1:])
        if not self._pending:
            self._received = {}
        return out.reshape(group.shapes[i]) if root else None

    def release(self) -> None:
        """After saving (or failing to): drop the host values; on the root, the slots the saver did
        not ask for are still brought (and dropped), so every rank ran the same collectives."""
        while getattr(self, "_pending", None):
            self._fetch(self._pending[0])
        self._received = {}
        for _, _, host in self._host.values():
            host.value, host.fetch = None, None

    def broadcast(self, root_rank: int = 0) -> None:
        """Every rank, after the model variables were broadcast: take this rank's slice of the
        parameters, the root's scalars and this rank's slice of what the root loaded (a fresh start
        loaded nothing: the slots stay zero); the host copies are dropped (a collective)."""
        self.take_parameters()
        if self.size > 1:
            hvd.broadcast_variables([getattr(v, "value", v) for v in self.own], root_rank=root_rank)  # distributed
        for shell, inner in self.scalars:
            inner.assign(shell)
        by_slot = self._by_slot()
        loaded = self.rank == root_rank and any(h.value is not None for hs in by_slot.values() for h in hs if h)
        if self.size > 1:
            loaded = hvd.broadcast_object(loaded, root_rank=root_rank, name=self._name("loaded"))  # distributed
        if loaded:
            for key, hosts in by_slot.items():
                group = self.groups[key[0]]
                if self.rank == root_rank:
                    flat = group.flatten_host([h.value if h is not None else None for h in hosts])
                    splits = [group.shard] * self.size
                else:
                    flat, splits = np.zeros(0, dtype=group.dtype.as_numpy_dtype), [0] * self.size
                mine = flat if self.size == 1 else hvd.alltoall(tf.constant(flat), splits=splits,  # distributed
                                                                name=self._name("scatter"))[0]
                for b, bucket in enumerate(group.buckets):  # this rank's shard: its bucket slices in order
                    if (key[0], b, key[1]) in self.slots:
                        self.slots[(key[0], b, key[1])].assign(mine[bucket.offset:bucket.offset + bucket.shard])
        self.release()


class ShardedExchange(Stateless):
    """The sharded optimizer's gradient exchange: each bucket of the flat gradient buffers averaged
    with an allreduce of which this rank keeps its slice (``optimizer``, ZeRO-1), or
    reduce-scattered (``gradients``, ZeRO-2); optional float16 on the wire. Returns this rank's
    averaged slice of each bucket, in the order of :attr:`ShardedOptimizer.shards`.

    ZeRO-2 reduce-scatters on GPUs (NCCL's reduce-scatter moves half an allreduce's bytes). Without
    a GPU it averages each bucket by allreduce too and keeps its slice, as the torch exchange does:
    Horovod's Gloo reducescatter measured 2.6x the CPU of an allreduce of the same bucketed buffer
    (``benchmarks/reducescatter_cost_tf.py``), and the memory is the same, because a bucket's whole
    average lives only inside the step. ``by_allreduce`` (None: by device) forces either way."""

    #: A bucket is flattened once the bucket this many before it has its slice: at most about this
    #: many buckets' flat gradients and averages exist at a time (without the chain the graph
    #: flattened every bucket at once, a second whole-model-sized buffer; a slice is a copy, since a
    #: view would keep its bucket's whole average alive until the update).
    WINDOW = 2

    def __init__(self, sharded: ShardedOptimizer, variables: list[Any], compression: Any) -> None:
        self.sharded, self.compression = sharded, compression
        self.position = {id(v): i for i, v in enumerate(variables)}  # the order of the gradients reduce() gets
        self.by_allreduce: bool | None = None

    def reduce(self, grads: list[Any]) -> list[Any]:
        """This rank's slice of every averaged bucket, a bucket at a time (a collective each: each
        bucket's gradients can be freed once its slice exists; graph ops)."""
        sharded = self.sharded
        fp16 = self.compression is hvd.Compression.fp16
        grads = [tf.convert_to_tensor(g) if g is not None else None for g in grads]  # sparse: dense once
        by_allreduce = sharded.mode == "optimizer" or (
            self.by_allreduce if self.by_allreduce is not None else not tf.config.list_logical_devices("GPU"))
        out: list[Any] = []
        for g, group in enumerate(sharded.groups):
            tensors = [grads[self.position[id(v)]] for v in group.variables]
            for b, bucket in enumerate(group.buckets):
                before = [out[len(out) - self.WINDOW]] if len(out) >= self.WINDOW else []
                with tf.control_dependencies(before):
                    flat = group.bucket_flat(bucket, tensors)
                if sharded.size > 1:
                    wire = tf.cast(flat, tf.float16) if fp16 else flat
                    name = f"hvdtrain.zero.grads.{g}.{b}"
                    if not by_allreduce:
                        flat = hvd.reducescatter(wire, op=hvd.Average, name=name)  # distributed
                    else:
                        whole = hvd.allreduce(wire, op=hvd.Average, name=name)  # distributed
                        # a copy of the slice: a view would keep the bucket's whole average alive until the end
                        first = sharded.rank * bucket.shard
                        flat = tf.raw_ops.DeepCopy(x=whole[first:first + bucket.shard])
                    flat = tf.cast(flat, group.dtype) if fp16 else flat
                out.append(flat)
        return out
