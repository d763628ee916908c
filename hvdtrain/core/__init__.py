"""Framework-neutral core of hvdtrain: config, registry, loop, sharding, schedule, checkpoints.

Nothing in this package imports torch or TensorFlow; frameworks are reached only through the
adapter interface in :mod:`hvdtrain.core.adapter`.
"""
