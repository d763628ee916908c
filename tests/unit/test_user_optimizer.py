"""Whose LR runs (hvdtrain.core.optimizer_policy) and what the adapters read from a task's optimizer."""

from __future__ import annotations

import pytest
from envguard import isolate_environ

from hvdtrain.core import optimizer_policy as policy
from hvdtrain.core.config import ConfigError
from hvdtrain.core.optimizer_policy import OptimizerFacts
from hvdtrain.core.resolve import load_config

pytestmark = pytest.mark.lr_schedule

ADAMW = OptimizerFacts("torch.optim.adamw.AdamW", 1e-3, 1e-3, False)
ONECYCLE = OptimizerFacts("torch.optim.adamw.AdamW", 4e-5, 1e-3, False, "torch.optim.lr_scheduler.OneCycleLR")
BUILT = OptimizerFacts("torch.optim.sgd.SGD", 0.01, 0.01, True)


@pytest.fixture
def framework_env(monkeypatch):
    """torch's first optimizer step sets TORCHINDUCTOR_CACHE_DIR; importing OpenCV (the Keras image
    pipeline) extends LD_LIBRARY_PATH."""
    isolate_environ(monkeypatch, ("TORCHINDUCTOR_CACHE_DIR", "LD_LIBRARY_PATH"))


def config(*overrides, defaults=None, file=None):
    return load_config(defaults or {}, file, overrides=list(overrides))


def test_an_optimizer_built_from_optim_gets_hvdtrains_schedule():
    decision, notes = policy.decide(config(), BUILT)
    assert decision.mode == "hvdtrain" and decision.optim.lr == 0.01 and notes == []
    assert policy.decide(config("optim.schedule=task"), BUILT)[0].task


def test_the_tasks_own_optimizer_runs_as_given_whatever_the_defaults():
    decision, notes = policy.decide(config(), ADAMW)  # optim.name=sgd, optim.lr=0.01: defaults, not set
    assert decision.task and notes == []
    assert "AdamW" in decision.describe() and "schedule off" in decision.describe()


@pytest.mark.parametrize("overrides, facts, message", [
    (["optim.name=adam"], ADAMW, "optim.name=adam contradicts the task's optimizer torch.optim.adamw.AdamW"),
    (["optim.name=sgd"], ADAMW, "optim.name=sgd contradicts the task's optimizer torch.optim.adamw.AdamW"),
    (["optim.lr=0.02"], ADAMW, "optim.lr=0.02 contradicts the task's optimizer AdamW (built with lr 0.001)"),
    (["optim.lr=0.02"], ONECYCLE, "optim.lr=0.02 contradicts the task's optimizer AdamW (built with lr 0.001)"),
    (["optim.schedule=hvdtrain"], ONECYCLE, "optim.schedule=hvdtrain: the task brings its own LR schedule"),
])
def test_a_contradicting_key_the_user_set_is_refused_naming_it(overrides, facts, message):
    with pytest.raises(ConfigError) as err:
        policy.decide(config(*overrides), facts, facts.scheduler is not None)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_key_set_to_its_default_value_counts_as_set():
    """optim.name=sgd is the default's value: set in a file, an override or the recipe's defaults, it is
    the user's word all the same."""
    with pytest.raises(ConfigError, match="^optim.name=sgd contradicts"):
        policy.decide(config(defaults={"optim": {"name": "sgd"}}), ADAMW)
    with pytest.raises(ConfigError, match="^optim.lr=0.01 contradicts"):
        policy.decide(config("optim.lr=0.01"), ADAMW)


def test_keys_that_agree_pass_and_schedule_keys_are_named_in_one_warning():
    decision, notes = policy.decide(config("optim.name=adamw", "optim.lr=0.001", "optim.warmup_epochs=1",
                                           "optim.decay=linear"), ADAMW)
    assert decision.task
    assert notes == ["hvdtrain: optim.warmup_epochs=1.0, optim.decay=linear not applied: the task's optimizer AdamW "
                     "runs as the recipe built it (optim.schedule=hvdtrain applies hvdtrain's schedule to it)"]


def test_a_recipe_that_reads_optim_lr_for_its_own_optimizer_and_scheduler_is_accepted():
    decision, _ = policy.decide(config("optim.lr=0.001"), ONECYCLE, True)
    assert decision.task


def test_hvdtrains_schedule_on_the_tasks_optimizer_takes_its_lr_as_base():
    decision, _ = policy.decide(config("optim.schedule=hvdtrain"), ADAMW)
    assert decision.mode == "hvdtrain" and decision.optim.lr == 1e-3 and decision.optim.name == "adamw"
    with pytest.raises(ConfigError, match="^optim.schedule=hvdtrain with optim.lr_scaling=auto: .* Lion"):
        policy.decide(config("optim.schedule=hvdtrain"), OptimizerFacts("lion.Lion", 1e-4, 1e-4, False))


@pytest.mark.parametrize("override, key", [("train.elastic=true", "train.elastic=true"),
                                           ("optim.backbone_lr_factor=0.1", "optim.backbone_lr_factor=0.1")])
def test_a_tasks_scheduler_is_refused_where_it_cannot_run(override, key):
    cfg = config(override)
    decision, _ = policy.decide(cfg, ONECYCLE, True)
    with pytest.raises(ConfigError, match=f"^{key}"):
        policy.check_task_schedule(cfg, decision, True)
    policy.check_task_schedule(cfg, decision, False)  # without a scheduler: nothing to refuse


def test_the_config_as_it_ran_names_the_tasks_optimizer_and_leaves_out_what_did_not_apply():
    cfg = config()
    ran = policy.ran_config(cfg, policy.decide(cfg, ONECYCLE, True)[0])
    assert ran["optim"]["ran"] == "torch.optim.adamw.AdamW + torch.optim.lr_scheduler.OneCycleLR"
    assert ran["optim"]["schedule"] == "task" and ran["optim"]["lr"] == 4e-5
    assert not {"name", "momentum", "weight_decay", "warmup_epochs", "decay", "lr_scaling"} & set(ran["optim"])
    built = policy.ran_config(cfg, policy.decide(cfg, BUILT)[0])
    assert built["optim"]["name"] == "sgd" and built["optim"]["ran"] == ""


def test_given_keys_come_from_every_layer(tmp_path):
    file = tmp_path / "c.yaml"
    file.write_text("optim:\n  momentum: 0.8\n")
    cfg = load_config({"optim": {"lr": 0.1}}, file, overrides=["optim.name=adam"], train__epochs=2, data__path=None)
    assert {"optim.lr", "optim.momentum", "optim.name", "train.epochs"} <= cfg.explicit_keys
    assert "data.path" not in cfg.explicit_keys and "optim.decay" not in cfg.explicit_keys


def test_torch_build_optimizer_marks_and_the_adapter_reads_the_task(framework_env):
    torch = pytest.importorskip("torch")
    from hvdtrain.torch.adapter import TorchAdapter, build_optimizer

    model = torch.nn.Linear(2, 2)
    built = build_optimizer(model.parameters(), config().optim)
    task = type("Task", (), {"optimizer": built, "scheduler": None})()
    assert TorchAdapter().describe_optimizer(task) == OptimizerFacts("torch.optim.sgd.SGD", 0.01, 0.01, True)
    own = torch.optim.AdamW(model.parameters(), lr=1e-3)
    task.optimizer, task.scheduler = own, torch.optim.lr_scheduler.OneCycleLR(own, max_lr=0.01, total_steps=5)
    facts = TorchAdapter().describe_optimizer(task)
    assert facts.scheduler == "torch.optim.lr_scheduler.OneCycleLR" and facts.base_lr == 1e-3 and not facts.from_config
    task.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(own)
    with pytest.raises(ConfigError, match="^TrainTask.scheduler: torch.optim.lr_scheduler.ReduceLROnPlateau is not"):
        TorchAdapter().describe_optimizer(task)
    task.scheduler = torch.optim.lr_scheduler.StepLR(torch.optim.SGD(model.parameters(), lr=0.1), 2)
    with pytest.raises(ConfigError, match="^TrainTask.scheduler: it drives another optimizer"):
        TorchAdapter().describe_optimizer(task)


def test_torch_start_up_step_fires_no_hook(framework_env):
    torch = pytest.importorskip("torch")
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from hvdtrain.torch.adapter import _hooks_off

    param = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.AdamW([param], lr=1e-3)
    calls = []
    optimizer.register_step_pre_hook(lambda *a: calls.append("own"))
    handle = register_optimizer_step_post_hook(lambda *a: calls.append("global"))
    try:
        with _hooks_off(optimizer):
            param.grad = torch.zeros(2)
            optimizer.step()
        assert calls == []
        optimizer.step()
        assert calls == ["own", "global"]  # and they are back afterwards
    finally:
        handle.remove()


def test_keras_build_optimizer_marks_and_the_adapter_reads_the_task(framework_env):
    keras = pytest.importorskip("keras")
    from hvdtrain.tensorflow import TensorFlowAdapter, build_optimizer

    task = type("Task", (), {"optimizer": build_optimizer(config().optim), "scheduler": None})()
    assert TensorFlowAdapter().describe_optimizer(task).from_config
    schedule = keras.optimizers.schedules.CosineDecay(1e-2, 10)
    task.optimizer = keras.optimizers.AdamW(learning_rate=schedule)
    facts = TensorFlowAdapter().describe_optimizer(task)
    assert facts.scheduler.endswith("CosineDecay") and facts.base_lr == 1e-2 and facts.lr == pytest.approx(1e-2)
    task.scheduler = schedule
    with pytest.raises(ConfigError, match="^TrainTask.scheduler: the optimizer .* already has the schedule"):
        TensorFlowAdapter().describe_optimizer(task)
    task.optimizer, task.scheduler = keras.optimizers.SGD(0.1), "cosine"
    with pytest.raises(ConfigError, match="^TrainTask.scheduler: builtins.str is not a keras"):
        TensorFlowAdapter().describe_optimizer(task)
