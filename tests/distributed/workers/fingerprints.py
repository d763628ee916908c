"""A fingerprint of a trained model's parameters, for workers that compare replicas across ranks."""

import hashlib

import numpy as np


def fingerprint(adapter, framework):
    """SHA-256 of every trainable parameter's bytes, in model order."""
    digest = hashlib.sha256()
    if framework == "torch":
        arrays = [p.detach().cpu().numpy() for p in adapter.model.parameters()]
    else:
        arrays = [np.asarray(v.numpy()) for v in adapter.model.trainable_variables]
    for array in arrays:
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()
