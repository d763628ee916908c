"""A Slurm step's variables -> Horovod's Gloo variables (hvdtrain/core/slurm.py), without Slurm:
node-list and tasks-per-node syntaxes, the layout of uneven steps, the port, what is not a step
(other launchers, the batch script), the singleton trap, task 0's real rendezvous server, and two
real processes with only Slurm's variables forming one Horovod job through
``prepare_horovod_environment``. The same on a real Slurm cluster: tests/slurm."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from hvdtrain.launch import slurm
from hvdtrain.launch.slurm import SlurmError, SlurmStep, expand_hostlist, expand_tasks_per_node, slurm_step
from jobs import REPO, job_env


def step_env(**extra: str) -> dict[str, str]:
    """What srun gives task 3 of ``srun -N2 -n4`` (2 per node) on n2."""
    env = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "1", "SLURM_PROCID": "3", "SLURM_LOCALID": "1",
           "SLURM_NODEID": "1", "SLURMD_NODENAME": "n2", "SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4",
           "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}
    env.update(extra)
    return env


@pytest.mark.parametrize("text, names", [
    ("n[1-3,5],m2", ["n1", "n2", "n3", "n5", "m2"]),
    ("gpu[08-10]-ib", ["gpu08-ib", "gpu09-ib", "gpu10-ib"]),
    ("r[1-2]n[3,4]", ["r1n3", "r1n4", "r2n3", "r2n4"]),
    ("login", ["login"]),
    ("a,b[7],c[001-002]", ["a", "b7", "c001", "c002"]),
])
def test_node_lists_expand_like_scontrol_show_hostnames(text, names):
    assert expand_hostlist(text) == names


@pytest.mark.parametrize("text", ["n[1-", "n[a-b]", "n1]"])
def test_bad_node_lists_are_named(text):
    with pytest.raises(ValueError, match="Slurm node list"):
        expand_hostlist(text)


def test_tasks_per_node():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("4") == [4]
    with pytest.raises(ValueError, match=r"'2\(3\)' in '2\(3\)' is not N or N\(xM\)"):
        expand_tasks_per_node("2(3)")


def test_a_task_of_an_even_step():
    step = slurm_step(step_env())
    assert step == SlurmStep(4242, 1, rank=3, size=4, local_rank=1, node="n2", nodes=["n1", "n2"],
                             tasks_per_node=[2, 2])
    variables = slurm.horovod_variables(step, "10.0.0.1", "eth0")
    assert variables == {
        "HOROVOD_RANK": "3", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2",
        "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2", "HOROVOD_HOSTNAME": "n2",
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": str(step.port),
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_IFACE": "eth0"}


def test_an_uneven_step_matches_horovods_own_host_assignment():
    """``srun -n5`` over 3 nodes as 2,2,1: every task's local/cross rank and size is what
    Horovod's get_host_assignments gives for hosts n1:2,n2:2,n3:1 (what horovodrun would set)."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

    expected = {(s.hostname, s.local_rank): s for s in get_host_assignments(parse_hosts("n1:2,n2:2,n3:1"), 5)}
    plan = slurm.host_alloc_plan(slurm_step(step_env(SLURM_STEP_NODELIST="n[1-3]", SLURM_STEP_NUM_TASKS="5",
                                                     SLURM_STEP_TASKS_PER_NODE="2(x2),1")))
    assert plan == list(expected.values())
    for rank, (node, local) in enumerate([("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1), ("n3", 0)]):
        env = step_env(SLURM_STEP_NODELIST="n[1-3]", SLURM_STEP_NUM_TASKS="5", SLURM_STEP_TASKS_PER_NODE="2(x2),1",
                       SLURM_PROCID=str(rank), SLURM_LOCALID=str(local), SLURMD_NODENAME=node)
        step, want = slurm_step(env), expected[(node, local)]
        assert (step.local_size, step.cross_rank, step.cross_size) == (want.local_size, want.cross_rank,
                                                                       want.cross_size), (node, local)


def test_node_from_slurm_nodeid_when_slurmd_nodename_is_missing():
    env = step_env(SLURM_NODEID="1")
    del env["SLURMD_NODENAME"]
    assert slurm_step(env).node == "n2"


@pytest.mark.parametrize("extra", [{"HOROVOD_RANK": "0"}, {"OMPI_COMM_WORLD_RANK": "0"}, {"PMIX_RANK": "0"},
                                   {"PMI_RANK": "0"}, {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "h"}])
def test_other_launchers_keep_their_job(extra):
    assert slurm_step(step_env(**extra)) is None  # horovodrun/mpirun inside an allocation, srun --mpi=pmix


def test_the_batch_script_is_no_step_and_a_lone_process_of_a_several_task_job_is_refused():
    batch = {k: v for k, v in step_env(SLURM_PROCID="0", SLURM_LOCALID="0").items() if "STEP" not in k}
    assert slurm_step(batch) is None
    with pytest.raises(SlurmError, match=r"SLURM_NTASKS=4\) but no launcher started it.*`srun hvdtrain \.\.\.`"):
        slurm.check_batch_process(batch)
    assert not slurm.lone_slurm_process(batch)
    one = {**batch, "SLURM_NTASKS": "1"}
    slurm.check_batch_process(one)  # a one-task job: trains as one rank
    assert slurm.lone_slurm_process(one)
    slurm.check_batch_process({**batch, "HOROVOD_RANK": "0"})  # horovodrun in the batch script


def test_world_size_one_in_a_several_task_step_is_the_singleton_trap():
    with pytest.raises(SlurmError, match=r"Slurm started 4 tasks but Horovod's world size is 1.*without --mpi"):
        slurm.check_world_size(1, step_env(PMIX_RANK="3"))
    slurm.check_world_size(4, step_env(PMIX_RANK="3"))
    slurm.check_world_size(1, step_env(SLURM_STEP_NUM_TASKS="1"))
    slurm.check_world_size(1, {})


def test_the_port_comes_from_job_and_step_or_the_variable():
    ports = {slurm.rendezvous_port(job, step, {}) for job in range(1000, 1625) for step in range(16)}
    assert len(ports) == 10000 and min(ports) == 20000 and max(ports) == 29999  # the documented range, all used
    assert slurm.rendezvous_port(7, 0, {}) != slurm.rendezvous_port(7, 1, {})  # steps of one job differ
    assert slurm.rendezvous_port(7, 0, {"HVDTRAIN_SLURM_RENDEZVOUS_PORT": "31000"}) == 31000
    with pytest.raises(SlurmError, match=r"HVDTRAIN_SLURM_RENDEZVOUS_PORT='99' is not a port number in 1024-65535"):
        slurm.rendezvous_port(7, 0, {"HVDTRAIN_SLURM_RENDEZVOUS_PORT": "99"})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def test_task_zero_serves_the_rendezvous_and_the_others_check_whose_it_is(monkeypatch):
    port = str(free_port())
    monkeypatch.setenv("HVDTRAIN_SLURM_RENDEZVOUS_PORT", port)
    host = socket.gethostname()
    local = {"SLURM_STEP_NODELIST": host, "SLURMD_NODENAME": host, "SLURM_STEP_TASKS_PER_NODE": "2",
             "SLURM_STEP_NUM_TASKS": "2"}
    zero = slurm_step(step_env(SLURM_PROCID="0", SLURM_LOCALID="0", **local))
    one = slurm_step(step_env(SLURM_PROCID="1", SLURM_LOCALID="1", **local))
    server = slurm.start_rendezvous(zero)
    try:
        with pytest.raises(SlurmError, match=f"cannot open the rendezvous port {port}"):
            slurm.start_rendezvous(zero)  # held: named with the variable that moves it
        env = {"HVDTRAIN_SLURM_RENDEZVOUS_TIMEOUT": "5"}
        slurm.wait_rendezvous(one, "127.0.0.1", env)
        other = slurm_step(step_env(SLURM_PROCID="1", SLURM_LOCALID="1", SLURM_JOB_ID="99", **local))
        with pytest.raises(SlurmError, match=f"port {port} on {host} is held by Slurm job 4242.1, not 99.1"):
            slurm.wait_rendezvous(other, "127.0.0.1", env)
        variables = slurm.prepare_slurm_step(one, env)
        assert env["HOROVOD_RANK"] == "1" and variables["HOROVOD_GLOO_RENDEZVOUS_PORT"] == port
        assert env["HOROVOD_HOSTNAME"] == host and env["HOROVOD_LOCAL_SIZE"] == "2"
        assert env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "5"  # Gloo waits for late tasks as long as the rendezvous
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(SlurmError, match=r"task 0's rendezvous at .* did not answer within 1 s"):
        slurm.wait_rendezvous(one, "127.0.0.1", {"HVDTRAIN_SLURM_RENDEZVOUS_TIMEOUT": "1"})


TASK = """
import json, os, sys
from hvdtrain.launch import prepare_horovod_environment
prepare_horovod_environment()
import horovod.torch as hvd, torch
hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
print("RESULT", json.dumps({"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
      "local_size": hvd.local_size(), "cross_size": hvd.cross_size(), "sum": total,
      "controller": os.environ["HOROVOD_CONTROLLER"]}))
"""


def test_two_processes_with_only_slurms_variables_form_one_horovod_job():
    """What srun starts for ``srun -N1 -n2`` on this host: no launcher but Slurm's variables."""
    host = socket.gethostname()
    base = {k: v for k, v in job_env().items() if not k.startswith(("SLURM", "PMI", "OMPI_COMM"))}
    base.update(SLURM_JOB_ID="77", SLURM_STEP_ID="0", SLURM_STEP_NUM_TASKS="2", SLURM_NTASKS="2",
                SLURM_STEP_NODELIST=host, SLURMD_NODENAME=host, SLURM_NODEID="0", SLURM_STEP_TASKS_PER_NODE="2",
                HVDTRAIN_SLURM_RENDEZVOUS_PORT=str(free_port()), HVDTRAIN_SLURM_RENDEZVOUS_TIMEOUT="60")
    tasks = [subprocess.Popen([sys.executable, "-c", TASK], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env={**base, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)})
             for r in (1, 0)]  # task 1 first: it waits for task 0's server
    outs = [t.communicate(timeout=120)[0] for t in tasks]
    assert all(t.returncode == 0 for t in tasks), outs
    results = sorted((json.loads(o.split("RESULT ", 1)[1].splitlines()[0]) for o in outs), key=lambda r: r["rank"])
    assert results == [{"rank": r, "size": 2, "local_rank": r, "local_size": 2, "cross_size": 1, "sum": 3.0,
                        "controller": "gloo"} for r in (0, 1)]


def test_the_allocations_hosts_for_horovodrun(monkeypatch):
    assert slurm.allocation_hosts({"SLURM_JOB_NODELIST": "n[1-2],g7", "SLURM_TASKS_PER_NODE": "2(x2),1"}) == [
        ("n1", 2), ("n2", 2), ("g7", 1)]
    with pytest.raises(SlurmError, match="names 1 node.* but SLURM_JOB_NODELIST='n\\[1-2\\]' has 2"):
        slurm.allocation_hosts({"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "4"})
    with pytest.raises(SlurmError, match="not inside a Slurm allocation"):
        slurm.allocation_hosts({})
    from click.testing import CliRunner

    from hvdtrain.cli import main

    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "2,1")
    assert CliRunner().invoke(main, ["slurm-hosts"]).output == "n1:2,n2:1\n"
    assert CliRunner().invoke(main, ["slurm-hosts", "--hostfile"]).output == "n1 slots=2\nn2 slots=1\n"
    monkeypatch.delenv("SLURM_JOB_NODELIST")
    result = CliRunner().invoke(main, ["slurm-hosts"])
    assert result.exit_code == 1 and "hvdtrain: error: not inside a Slurm allocation" in result.output


def test_a_warning_signal_outside_the_training_loop_is_ignored_in_a_slurm_job():
    import signal

    before = signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGUSR2)
    try:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        assert slurm.ignore_early_and_late_warnings(["USR1", "TERM"], {}) == []  # not a Slurm job
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
        assert slurm.ignore_early_and_late_warnings(["USR1", "TERM"], {"SLURM_JOB_ID": "5"}) == ["USR1"]
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN  # TERM keeps stopping the task
        signal.raise_signal(signal.SIGUSR1)  # would end this process with the default action
        handler = lambda *_: None  # noqa: E731
        signal.signal(signal.SIGUSR2, handler)
        assert slurm.ignore_early_and_late_warnings(["USR2"], {"SLURM_JOB_ID": "5"}) == []  # a handler stays
        assert signal.getsignal(signal.SIGUSR2) is handler
    finally:
        signal.signal(signal.SIGUSR1, before[0])
        signal.signal(signal.SIGUSR2, before[1])
