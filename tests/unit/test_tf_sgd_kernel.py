"""hvdtrain's TensorFlow SGD runs torch's momentum rule (``v = m v + g; w -= lr v``) through
TensorFlow's fused ApplyMomentum kernel: the same bits as the rule written as separate operations,
with the LR changing every update and coupled weight decay, for dense and sparse gradients."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from hvdtrain.tensorflow.optimizers import CoupledSGD  # noqa: E402

LRS = [0.1, 0.3, 0.05, 0.2]
MOMENTUM, L2 = 0.9, 0.01


def _reference(weights, grads):
    """The rule as separate float32 operations, update by update."""
    w = [tf.constant(x) for x in weights]
    v = [tf.zeros_like(x) for x in w]
    for lr, step in zip(LRS, grads):
        g = [gi + tf.constant(L2, tf.float32) * wi for gi, wi in zip(step, w)]
        v = [vi * tf.constant(MOMENTUM, tf.float32) + gi for vi, gi in zip(v, g)]
        w = [wi - vi * tf.constant(lr, tf.float32) for wi, vi in zip(w, v)]
    return [x.numpy() for x in w]


def test_the_fused_momentum_kernel_takes_the_same_bits_as_the_rule_in_separate_operations():
    rng = np.random.default_rng(3)
    weights = [rng.standard_normal(s).astype(np.float32) for s in [(300, 17), (17,), (3, 3, 4, 8)]]
    grads = [[rng.standard_normal(x.shape).astype(np.float32) for x in weights] for _ in LRS]
    variables = [keras.Variable(x) for x in weights]
    optimizer = CoupledSGD(learning_rate=LRS[0], momentum=MOMENTUM, l2=L2)
    optimizer.build(variables)

    @tf.function
    def update(step_grads):
        optimizer.apply_gradients(zip(step_grads, variables))

    for lr, step in zip(LRS, grads):
        optimizer.learning_rate.assign(lr)
        update([tf.constant(g) for g in step])
    for got, want in zip(variables, _reference(weights, grads)):
        np.testing.assert_array_equal(got.numpy(), want)


def test_a_sparse_gradient_takes_the_same_rule():
    rng = np.random.default_rng(4)
    table = rng.standard_normal((10, 4)).astype(np.float32)
    variable = keras.Variable(table)
    optimizer = CoupledSGD(learning_rate=0.1, momentum=MOMENTUM)
    optimizer.build([variable])
    rows = tf.constant([1, 7])

    @tf.function
    def update():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(variable.value, rows) ** 2)
        grad = tape.gradient(loss, variable.value)
        assert isinstance(grad, tf.IndexedSlices)  # (when traced) the sparse path is the one tested
        optimizer.apply_gradients([(grad, variable)])

    update()
    update()
    expected, velocity = table.copy(), np.zeros_like(table)
    for _ in range(2):
        grad = np.zeros_like(table)
        grad[[1, 7]] = 2 * expected[[1, 7]]
        velocity = velocity * np.float32(MOMENTUM) + grad
        expected = expected - velocity * np.float32(0.1)
    np.testing.assert_allclose(variable.numpy(), expected, rtol=1e-6)
