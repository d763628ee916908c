"""Issue 41, item 6: hostile Slurm variables get one line naming the variable, at once.

Before: ``SLURM_JOB_NODELIST='node[0-99999999]'`` ran for minutes growing memory; ``node[5-1]``
printed an empty host list and exited 0 (training: a ZeroDivisionError); ``node[1-`` and ``n[]``
were tracebacks; ``SLURM_TASKS_PER_NODE='1(x99999999999)'`` a MemoryError;
``HVDTRAIN_SLURM_RENDEZVOUS_TIMEOUT=nan`` waited forever and ``=abc`` did not name the variable.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from hvdtrain.cli import main
from hvdtrain.launch import slurm
from hvdtrain.launch.slurm import SlurmError, slurm_step

pytestmark = pytest.mark.timeout(60)  # the huge list used to run for minutes


def step_env(**extra: str) -> dict[str, str]:
    env = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "1", "SLURM_PROCID": "1", "SLURM_LOCALID": "1",
           "SLURM_NODEID": "0", "SLURMD_NODENAME": "n1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2",
           "SLURM_STEP_NODELIST": "n1", "SLURM_JOB_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": "2"}
    env.update(extra)
    return env


HOSTILE_NODELISTS = {
    "node[0-99999999]": "more than 200,000 hosts",
    "n[0-9999][0-9999]": "more than 200,000 hosts",  # each range small, the product huge
    "node[5-1]": "descends",
    "node[1-": "unbalanced brackets",
    "n[]": "is not N or N-M",
    "n[1-2],-oProxyCommand=x": "is not a host name",
    "n[1-99999999999999999999999]": "is not N or N-M",  # more digits than any node number
}


@pytest.mark.parametrize("nodelist", HOSTILE_NODELISTS)
def test_a_hostile_node_list_is_one_line_naming_the_variable(nodelist, monkeypatch):
    with pytest.raises(SlurmError) as caught:
        slurm_step(step_env(SLURM_STEP_NODELIST=nodelist))
    assert str(caught.value).startswith(f"SLURM_STEP_NODELIST={nodelist!r}")
    assert HOSTILE_NODELISTS[nodelist] in str(caught.value) and "\n" not in str(caught.value)
    # hvdtrain slurm-hosts: exit 1, one line, no traceback, nothing printed on stdout
    monkeypatch.setenv("SLURM_JOB_NODELIST", nodelist)
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "1")
    result = CliRunner().invoke(main, ["slurm-hosts"], catch_exceptions=False)
    assert result.exit_code == 1 and result.stdout == "", (result.exit_code, result.stdout)
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"hvdtrain: error: SLURM_JOB_NODELIST={nodelist!r}")


@pytest.mark.parametrize("per_node", ["1(x99999999999)", "99999999999", "1(x"])
def test_a_hostile_tasks_per_node_names_the_variable(per_node):
    with pytest.raises(SlurmError, match=r"^SLURM_TASKS_PER_NODE="):
        slurm.allocation_hosts({"SLURM_JOB_NODELIST": "n1", "SLURM_TASKS_PER_NODE": per_node})
    with pytest.raises(SlurmError, match=r"^SLURM_STEP_TASKS_PER_NODE="):
        slurm_step(step_env(SLURM_STEP_TASKS_PER_NODE=per_node))


@pytest.mark.parametrize("value", ["nan", "inf", "-5", "0", "abc", "1e999"])
def test_a_rendezvous_timeout_that_is_not_a_finite_positive_number_is_named(value):
    step = slurm_step(step_env())
    with pytest.raises(SlurmError, match=rf"^{slurm.TIMEOUT_VARIABLE}='{value}' is not a number of seconds"):
        slurm.prepare_slurm_step(step, step_env(**{slurm.TIMEOUT_VARIABLE: value}))


def test_ordinary_lists_still_expand():
    assert slurm.hostnames("n[08-10],login-1.cluster,g[1-2]x[3,4]", "SLURM_JOB_NODELIST") == [
        "n08", "n09", "n10", "login-1.cluster", "g1x3", "g1x4", "g2x3", "g2x4"]
    assert slurm.count_hostlist("n[1-100000],m[1-100000]") == 200_000
    assert slurm.rendezvous_timeout({slurm.TIMEOUT_VARIABLE: "12.5"}) == 12.5
