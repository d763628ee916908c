"""Fine-tuning controls in process (no Horovod): which parameters are the head, the backbone's
learning-rate factor in both frameworks (the same updates as torch parameter groups with their own
LR), and a frozen backbone that gets no update at all (no weight decay, no momentum, BatchNorm
statistics kept). The 2-rank jobs are tests/distributed/test_finetune.py."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
keras = pytest.importorskip("keras")

from hvdtrain import ConfigError, TrainTask  # noqa: E402
from hvdtrain.core import finetune  # noqa: E402
from hvdtrain.core.config import OptimConfig  # noqa: E402
from hvdtrain.tensorflow import optimizers as tf_optimizers  # noqa: E402
from hvdtrain.tensorflow.finetune import BackboneControl as KerasControl, head_variables  # noqa: E402
from hvdtrain.torch import TorchAdapter, build_optimizer, decay_groups  # noqa: E402
from hvdtrain.torch.finetune import BackboneControl, head_parameters  # noqa: E402
from hvdtrain_recipes.image_classification import keras_models, torch_models  # noqa: E402
from envguard import isolate_environ  # noqa: E402


@pytest.fixture(autouse=True)
def _inductor_cache(monkeypatch):
    """torch's first optimizer step in a process sets TORCHINDUCTOR_CACHE_DIR itself."""
    isolate_environ(monkeypatch, ("TORCHINDUCTOR_CACHE_DIR",))


def _task(model, head=None):
    return TrainTask(model=model, optimizer=None, loss_fn=None, train_data=None, val_data=None, metric_sums=None,
                     head=head)


class TinyNet(torch.nn.Module):
    """A backbone (linear + BatchNorm) and a head called ``classifier``, as Hugging Face names it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.ReLU())
        self.classifier = torch.nn.Linear(6, 3)

    def forward(self, x):
        return self.classifier(self.body(x))


def test_the_head_is_found_by_name_or_given_by_the_recipe():
    resnet = torch_models.build_model("resnet18", 3, (32, 32), 5)
    assert [id(p) for p in head_parameters(_task(resnet), resnet)] == [id(p) for p in resnet.head.parameters()]
    tiny = TinyNet()
    assert [id(p) for p in head_parameters(_task(tiny), tiny)] == [id(p) for p in tiny.classifier.parameters()]
    given = [tiny.body[0].weight]
    assert head_parameters(_task(tiny, lambda: given), tiny) == given
    with pytest.raises(ConfigError, match="no module or layer named classifier, fc, head"):
        head_parameters(_task(torch.nn.Sequential(torch.nn.Linear(2, 2))), torch.nn.Sequential(torch.nn.Linear(2, 2)))
    with pytest.raises(ConfigError, match="the head holds 2 and the backbone 0"):
        BackboneControl(tiny.classifier, list(tiny.classifier.parameters()))

    from hvdtrain.tensorflow.images import normalize_inputs

    inner = keras_models.build_model("resnet18", (32, 32, 3), 5)
    wrapped = normalize_inputs(inner, (32, 32, 3))  # the recipe's model: the head is inside
    fc = inner.get_layer(inner.torchvision_layers["fc"])
    assert [id(v) for v in head_variables(_task(wrapped), wrapped)] == [id(v) for v in fc.trainable_variables]
    named = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="classifier"), keras.layers.Softmax()])
    assert head_variables(_task(named), named)[0] is named.layers[0].kernel


def _sgd(weight_decay=0.01):
    return OptimConfig(name="sgd", lr=0.1, momentum=0.9, weight_decay=weight_decay)


def test_torch_backbone_lr_factor_is_a_parameter_group_at_factor_times_the_lr():
    model, reference = TinyNet(), TinyNet()
    control = BackboneControl(model, head_parameters(_task(model), model))
    optimizer = control.split_groups(build_optimizer(decay_groups(model, 0.01), _sgd()), 0.25)
    assert [(len(g["params"]), g["lr_factor"], g["weight_decay"]) for g in optimizer.param_groups] == \
        [(1, 1.0, 0.01), (1, 0.25, 0.01), (1, 1.0, 0.0), (3, 0.25, 0.0)]
    adapter = TorchAdapter()
    adapter.optimizer = optimizer
    adapter.set_learning_rate(0.2)
    assert sorted({g["lr"] for g in optimizer.param_groups}) == [0.05, 0.2]
    # the same step as hand-made groups with their own LR
    head_ids = {id(p) for p in reference.classifier.parameters()}
    groups = [{"params": [p for p in reference.parameters() if id(p) in head_ids], "lr": 0.2},
              {"params": [p for p in reference.parameters() if id(p) not in head_ids], "lr": 0.05}]
    expected = torch.optim.SGD(groups, lr=0.2, momentum=0.9)
    optimizer.param_groups[0]["weight_decay"] = optimizer.param_groups[1]["weight_decay"] = 0.0
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    for net, opt in ((model, optimizer), (reference, expected)):
        for _ in range(2):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)


def test_torch_frozen_backbone_gets_no_update_at_all():
    model = TinyNet()
    control = BackboneControl(model, head_parameters(_task(model), model))
    optimizer = build_optimizer(decay_groups(model, 0.1), _sgd(0.1))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    control.frozen = True
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    for _ in range(3):
        model.train()
        control.after_train_mode()
        assert not model.body[1].training and model.classifier.training
        torch.nn.functional.cross_entropy(model(x), y).backward()
        control.drop_frozen_grads()
        optimizer.step()
        optimizer.zero_grad()
    after = model.state_dict()
    for key in before:
        same = torch.equal(before[key], after[key])
        assert same == (not key.startswith("classifier")), key  # BatchNorm statistics and counter included
    assert all(p not in optimizer.state for p in control.backbone)  # no momentum buffer: nothing drifts later
    control.frozen = False
    model.train()
    control.after_train_mode()
    assert model.body[1].training


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw"])
def test_keras_backbone_lr_factor_matches_torch_parameter_groups(name):
    """hvdtrain's Keras optimizers with the backbone's variables at factor 0.3 update exactly as torch's
    optimizer with a backbone group at 0.3 x the LR (weight decay included: coupled or decoupled)."""
    rng = np.random.default_rng(0)
    w_head, w_back = rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    grads = [(rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32))
             for _ in range(3)]
    config = OptimConfig(name=name, lr=0.1, momentum=0.9, weight_decay=0.05)
    head, back = keras.Variable(w_head), keras.Variable(w_back)
    optimizer = tf_optimizers.build_optimizer(config)
    optimizer.build([head, back])
    optimizer.set_lr_factor([back], 0.3)
    t_head = torch.nn.Parameter(torch.from_numpy(w_head.copy()))
    t_back = torch.nn.Parameter(torch.from_numpy(w_back.copy()))
    groups = [{"params": [t_head], "lr_factor": 1.0}, {"params": [t_back], "lr_factor": 0.3}]
    reference = build_optimizer(groups, config)
    for step, (g_head, g_back) in enumerate(grads):
        lr = 0.1 * (step + 1)
        optimizer.learning_rate = lr
        optimizer.apply_gradients([(g_head, head), (g_back, back)])
        for group in reference.param_groups:
            group["lr"] = lr * group["lr_factor"]
        t_head.grad, t_back.grad = torch.from_numpy(g_head), torch.from_numpy(g_back)
        reference.step()
    np.testing.assert_allclose(np.asarray(head), t_head.detach().numpy(), rtol=0, atol=2e-6)
    np.testing.assert_allclose(np.asarray(back), t_back.detach().numpy(), rtol=0, atol=2e-6)


def test_keras_frozen_backbone_batchnorm_keeps_its_statistics():
    model = keras_models.build_model("resnet18", (32, 32, 3), 4)
    control = KerasControl(model, model.trainable_variables, head_variables(_task(model), model))
    assert len(control.norms) == 20 and sum(control.head_mask) == 2
    stats = [v for v in model.non_trainable_variables if id(v) in control.frozen_stats]
    before = [np.asarray(v).copy() for v in stats]
    x = np.random.default_rng(0).normal(size=(4, 32, 32, 3)).astype(np.float32)
    control.set_frozen(True)
    model(x, training=True)
    assert all(np.array_equal(a, np.asarray(v)) for a, v in zip(before, stats))
    control.set_frozen(False)
    model(x, training=True)
    assert not all(np.array_equal(a, np.asarray(v)) for a, v in zip(before, stats))


def test_frozen_epochs_depend_only_on_the_epoch_index():
    class Config:
        class model:
            freeze_backbone_epochs = 2

        class optim:
            backbone_lr_factor = 1.0

    assert finetune.enabled(Config) and [finetune.backbone_frozen(Config, e) for e in range(4)] == \
        [True, True, False, False]
    adapter = TorchAdapter()
    adapter.control, adapter.freeze_epochs = BackboneControl(TinyNet(), list(TinyNet().classifier.parameters())), 2
    for epoch, frozen in ((1, True), (2, False), (0, True)):  # a resume may start at any epoch
        adapter.begin_epoch(epoch)
        assert adapter.control.frozen is frozen
