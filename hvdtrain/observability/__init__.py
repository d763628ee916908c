"""Watching training from rank 0: the progress bar and TensorBoard event files, both callbacks
(:class:`hvdtrain.core.callbacks.Callback`) that :mod:`hvdtrain.trainer` adds by default.
Nothing here imports torch or TensorFlow."""
