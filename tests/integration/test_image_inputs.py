"""The framework-side half of the image pipeline: a uint8 NHWC batch becomes bitwise the same
normalised float batch in torch (NCHW) and TensorFlow (NHWC), and the same as NumPy's."""

import numpy as np


def test_torch_and_tensorflow_normalise_bitwise_identically():
    import tensorflow as tf
    import torch

    from hvdtrain.data.normalize import normalize_numpy
    from hvdtrain.tensorflow.images import to_float_nhwc
    from hvdtrain.torch.images import to_float_nchw

    for channels in (1, 3):
        batch = np.random.default_rng(channels).integers(0, 256, (4, 9, 7, channels), dtype=np.uint8)
        t = to_float_nchw(torch.from_numpy(batch)).numpy()
        k = to_float_nhwc(tf.constant(batch)).numpy()
        assert t.shape == (4, channels, 9, 7) and t.dtype == np.float32 and k.dtype == np.float32
        assert np.array_equal(t.transpose(0, 2, 3, 1), k)
        assert np.array_equal(k, normalize_numpy(batch))


def test_models_take_uint8_batches():
    import keras
    import torch

    from hvdtrain.tensorflow.images import normalize_inputs as keras_inputs
    from hvdtrain.torch.images import normalize_inputs as torch_inputs

    batch = np.random.default_rng(0).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    net = torch_inputs(torch.nn.Sequential(torch.nn.Conv2d(3, 2, 3), torch.nn.Flatten()))
    assert net(torch.from_numpy(batch)).shape == (2, 2 * 6 * 6)
    assert list(net.state_dict()) == ["0.weight", "0.bias"]  # a hook: checkpoints keep their keys
    inner = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(2, 3), keras.layers.Flatten()])
    model = keras_inputs(inner, (8, 8, 3))
    assert tuple(model(batch).shape) == (2, 72)
    assert [v.path for v in model.variables] == [v.path for v in inner.variables]
