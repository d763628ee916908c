"""Issue 61, item 2: torchrun's variables -> one Horovod Gloo job (hvdtrain/launch/torchrun.py,
through the rendezvous a Slurm step uses, hvdtrain/launch/gloo.py), without torchrun: the layout,
what is not a torchrun job, and a variable that is missing or at odds named in one line before
anything starts. The same under a real ``torchrun --nproc_per_node=2``: tests/distributed/test_torchrun.py."""

from __future__ import annotations

import os

import pytest

from hvdtrain.launch import detect, gloo, slurm
from hvdtrain.launch.start import prepare_horovod_environment
from hvdtrain.launch.torchrun import TorchrunError, lone_torchrun_process, torchrun_job


def worker_env(**extra: str) -> dict[str, str]:
    """What ``torchrun --nnodes=2 --nproc_per_node=2`` gives worker 3 (node 1, local rank 1)."""
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
           "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
           "TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "0"}
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


def test_a_torchrun_worker_becomes_a_gloo_worker_of_one_job():
    job = torchrun_job(worker_env())
    assert (job.rank, job.size, job.local_rank, job.local_size, job.cross_rank, job.cross_size) == (3, 4, 1, 2, 1, 2)
    assert (job.port, job.tag, job.rendezvous_host) == (29501, "abc.0", "127.0.0.1")  # beside torch's store
    variables = gloo.horovod_variables(job, "127.0.0.1", None)
    assert {k: variables[k] for k in ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_CROSS_RANK",
                                      "HOROVOD_CONTROLLER")} == {
        "HOROVOD_RANK": "3", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_CROSS_RANK": "1",
        "HOROVOD_CONTROLLER": "gloo"}
    assert torchrun_job(worker_env(HVDTRAIN_TORCHRUN_RENDEZVOUS_PORT="31000")).port == 31000
    assert torchrun_job(worker_env(MASTER_PORT="65535")).port == 65534


def test_torchrun_inside_a_slurm_step_keeps_its_own_job_and_other_launchers_keep_theirs():
    under_srun = worker_env(SLURM_PROCID="1", SLURM_STEP_ID="0", SLURM_JOB_ID="7")  # one torchrun per node
    assert detect.launcher(under_srun) == "torchrun" and slurm.slurm_step(under_srun) is None
    assert detect.rank(under_srun) == 3
    for other in ({"HOROVOD_RANK": "3"}, {"OMPI_COMM_WORLD_RANK": "3"}):
        assert torchrun_job(worker_env(**other)) is None
    assert torchrun_job({}) is None
    one = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}  # torchrun --nproc_per_node=1: a lone process
    assert torchrun_job(one) is None and lone_torchrun_process(one)


@pytest.mark.parametrize("env, message", [
    (worker_env(MASTER_ADDR=None), r"^torchrun's environment without MASTER_ADDR \(RANK=3, WORLD_SIZE=4, .*set\)"),
    ({"WORLD_SIZE": "2"}, r"^torchrun's environment without RANK \(WORLD_SIZE=2 set\)"),
    (worker_env(LOCAL_WORLD_SIZE=None), "^torchrun's environment without LOCAL_WORLD_SIZE"),
    (worker_env(WORLD_SIZE="two"), r"^torchrun variable WORLD_SIZE='two' is not a whole number >= 1"),
    (worker_env(RANK="4"), r"^torchrun variables: RANK=4 does not fit WORLD_SIZE=4$"),
    (worker_env(LOCAL_RANK="2"), r"^torchrun variables: LOCAL_RANK=2 does not fit LOCAL_WORLD_SIZE=2$"),
    (worker_env(WORLD_SIZE="5", LOCAL_WORLD_SIZE="2"), "^torchrun variables: WORLD_SIZE=5 is not a whole number"),
    (worker_env(GROUP_RANK="0"), r"^torchrun variables: RANK=3 is not node GROUP_RANK=0's worker LOCAL_RANK=1"),
    (worker_env(HVDTRAIN_TORCHRUN_RENDEZVOUS_PORT="80"), "^HVDTRAIN_TORCHRUN_RENDEZVOUS_PORT='80' is not a port"),
])
def test_a_torchrun_environment_at_odds_is_named_in_one_line(env, message):
    with pytest.raises(TorchrunError, match=message) as refused:
        torchrun_job(env)
    assert "\n" not in str(refused.value)


def test_the_start_refuses_it_before_horovod_starts(monkeypatch):
    """Through the start every entry point makes (prepare(), recipes, hvdtrain.keras.init): the
    one line, and no Horovod variable set (the process would otherwise train alone as 1 of 1)."""
    for name in [n for n in os.environ if n.startswith(("HOROVOD_", "SLURM_", "OMPI_", "PMI", "TORCHELASTIC"))]:
        monkeypatch.delenv(name)
    for name, value in worker_env(MASTER_ADDR=None).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(TorchrunError, match="^torchrun's environment without MASTER_ADDR"):
        prepare_horovod_environment()
    assert not [n for n in os.environ if n.startswith("HOROVOD_")]


def test_rank_zero_serves_and_another_job_on_the_port_is_named():
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        port = str(s.getsockname()[1])
    host = dict(MASTER_ADDR="127.0.0.1", HVDTRAIN_TORCHRUN_RENDEZVOUS_PORT=port, WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                GROUP_RANK="0", HVDTRAIN_TORCHRUN_RENDEZVOUS_TIMEOUT="5")
    zero, one = torchrun_job(worker_env(RANK="0", LOCAL_RANK="0", **host)), torchrun_job(worker_env(**{
        **host, "RANK": "1", "LOCAL_RANK": "1"}))
    server = gloo.start_rendezvous(zero)
    try:
        env = {"HVDTRAIN_TORCHRUN_RENDEZVOUS_TIMEOUT": "5"}
        gloo.wait_rendezvous(one, "127.0.0.1", env)
        other = torchrun_job(worker_env(**{**host, "RANK": "1", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "xyz"}))
        with pytest.raises(TorchrunError, match=f"port {port} on 127.0.0.1 is held by torchrun job abc.0, not xyz.0"):
            gloo.wait_rendezvous(other, "127.0.0.1", env)
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(TorchrunError, match=r"^torchrun rank 1: rank 0's rendezvous at 127.0.0.1:\d+ did not answer "
                                            r"within 1 s"):
        gloo.wait_rendezvous(one, "127.0.0.1", {"HVDTRAIN_TORCHRUN_RENDEZVOUS_TIMEOUT": "1"})
