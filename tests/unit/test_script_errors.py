"""issue 61, item 7: hvdtrain's refusals in a user's own script (hvdtrain.core.script_errors, installed by
hvdtrain.keras.init) end the process as the CLI's do: one line ``hvdtrain: error: ...`` on rank 0 only, no
traceback, exit status 2 for a ConfigError and 1 for the others; any other exception keeps the hook
that was there before. The 2-rank job (tests/distributed/test_keras_fit.py) runs it in a real script."""

import sys

import pytest

from hvdtrain.core import script_errors
from hvdtrain.core.checkpoint import CheckpointError
from hvdtrain.core.config import ConfigError


@pytest.fixture
def hook():
    """sys.excepthook as script_errors.install leaves it, restored afterwards; the hook before it records."""
    saved_hook, saved_state = sys.excepthook, dict(script_errors._installed)
    earlier = []
    sys.excepthook = lambda *info: earlier.append(info[1])
    rank = {"rank": 0}
    script_errors.install(lambda: rank["rank"])
    yield rank, earlier
    sys.excepthook = saved_hook
    script_errors._installed.clear()
    script_errors._installed.update(saved_state)


def uncaught(exc):
    """What the interpreter does with an uncaught ``exc``: hand it to sys.excepthook."""
    try:
        raise exc
    except BaseException as raised:  # noqa: BLE001
        sys.excepthook(type(raised), raised, raised.__traceback__)


def test_a_refusal_is_one_line_on_rank_zero_and_the_clis_exit_status(hook, capsys):
    rank, earlier = hook
    with pytest.raises(SystemExit) as stopped:
        uncaught(CheckpointError("runs/x/checkpoints already holds checkpoint epoch-0002: resume from it"))
    assert stopped.value.code == 1
    assert capsys.readouterr().err == ("hvdtrain: error: runs/x/checkpoints already holds checkpoint epoch-0002: "
                                       "resume from it\n")
    with pytest.raises(SystemExit) as stopped:
        uncaught(ConfigError("batches: global_batch_size=6 cannot be shared\nequally by 4 workers"))
    assert stopped.value.code == 2
    assert capsys.readouterr().err == ("hvdtrain: error: batches: global_batch_size=6 cannot be shared equally by 4 "
                                       "workers\n")  # one line
    rank["rank"] = 1  # the other ranks raise it too, and say nothing
    with pytest.raises(SystemExit) as stopped:
        uncaught(ConfigError("batches: bad"))
    assert stopped.value.code == 2 and capsys.readouterr().err == ""
    assert earlier == []


def test_other_exceptions_keep_their_traceback_and_hvdtrain_traceback_shows_it(hook, capsys, monkeypatch):
    rank, earlier = hook
    mine = ValueError("the user's own")
    uncaught(mine)
    assert earlier == [mine]  # the hook that was there before: the user's own error is not shortened
    monkeypatch.setenv("HVDTRAIN_TRACEBACK", "1")
    with pytest.raises(SystemExit):
        uncaught(CheckpointError("damaged"))
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and err.endswith("hvdtrain: error: damaged\n")
    script_errors.install(lambda: 1 / 0)  # a rank that cannot be told (Horovod not started): speaks as rank 0
    monkeypatch.delenv("HVDTRAIN_TRACEBACK")
    with pytest.raises(SystemExit):
        uncaught(CheckpointError("damaged"))
    assert capsys.readouterr().err == "hvdtrain: error: damaged\n"
