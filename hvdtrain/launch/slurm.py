"""A Slurm job step (``srun hvdtrain ...``, one task per rank) formed into a Horovod job over Gloo.

Horovod has no Slurm support of its own, and an MPI without Slurm's PMI cannot start its ranks
from ``srun``. Every task of a step knows enough from Slurm's variables to join a Gloo job
instead: its rank (``SLURM_PROCID``), the step's size (``SLURM_STEP_NUM_TASKS``, else
``SLURM_NTASKS``), its rank on its node (``SLURM_LOCALID``), the nodes (``SLURM_STEP_NODELIST``,
else ``SLURM_JOB_NODELIST``) and the tasks on each (``SLURM_STEP_TASKS_PER_NODE``, e.g.
``2(x3),1``). :func:`prepare_slurm_step` sets the variables ``horovodrun --gloo`` would give
the worker (``HOROVOD_RANK``/``SIZE``/``LOCAL_RANK``/``LOCAL_SIZE``/``CROSS_RANK``/
``CROSS_SIZE``, ``HOROVOD_HOSTNAME``, ``HOROVOD_GLOO_RENDEZVOUS_ADDR``/``PORT``,
``HOROVOD_CONTROLLER=gloo``, ``HOROVOD_CPU_OPERATIONS=gloo``, ``HOROVOD_GLOO_IFACE``), and task 0
starts Horovod's own rendezvous server (``horovod.runner.http.http_server``, the one
``horovodrun`` runs) in a thread, on the step's first node, where task 0 runs. The rendezvous is
:mod:`hvdtrain.launch.gloo`'s, which a ``torchrun`` job uses too (:mod:`hvdtrain.launch.torchrun`).

The port is derived from the job and step ids, in 20000-29999 (:func:`rendezvous_port`), so
every task computes the same one without talking; ``HVDTRAIN_SLURM_RENDEZVOUS_PORT`` overrides
it. Task 0 stores ``JOBID.STEPID`` on its server and the other tasks check it before they join:
a server of another job on the same port is named, never joined.

A step is recognised only when ``SLURM_PROCID`` and a step id are set and no other launcher has
set its variables (``horovodrun`` and ``mpirun`` inside an allocation, ``srun --mpi=pmix`` with
an MPI that uses Slurm's PMI keep their own). The batch script itself (no step id) is no step: a
process started there alone in a job of several tasks is the singleton trap, named by
:func:`check_batch_process`. This module imports neither a framework nor Horovod (the server's
classes are imported when task 0 starts it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any, Mapping

from hvdtrain.core.errors import TrainingError
from hvdtrain.launch import gloo
from hvdtrain.launch.detect import launcher
from hvdtrain.launch.gloo import SCOPE, KEY, host_alloc_plan, horovod_variables  # noqa: F401 (this module's API)

PORT_BASE, PORT_SPAN = 20000, 10000  # the rendezvous port: PORT_BASE + (job * 16 + step % 16) % PORT_SPAN
PORT_VARIABLE = "HVDTRAIN_SLURM_RENDEZVOUS_PORT"
TIMEOUT_VARIABLE = "HVDTRAIN_SLURM_RENDEZVOUS_TIMEOUT"  # seconds a task waits for task 0's server (default 300)


class SlurmError(TrainingError):
    """A Slurm step cannot become a Horovod job; the message says why and what to do."""


@dataclass(frozen=True)
class SlurmStep(gloo.GlooJob):
    """One task of a Slurm job step, and the step's layout (a :class:`~hvdtrain.launch.gloo.GlooJob`)."""

    job_id: int
    step_id: int
    rank: int
    size: int
    local_rank: int
    node: str  # this task's node
    nodes: list[str] = field(default_factory=list)  # the step's nodes, in Slurm's order
    tasks_per_node: list[int] = field(default_factory=list)  # tasks on each of ``nodes``
    kind = "Slurm job"
    member = "task"
    port_variable = PORT_VARIABLE
    timeout_variable = TIMEOUT_VARIABLE
    where = "in the batch script"
    error = SlurmError

    @property
    def port(self) -> int:
        """Task 0's rendezvous port (:func:`rendezvous_port`)."""
        return rendezvous_port(self.job_id, self.step_id)

    @property
    def tag(self) -> str:
        """``JOBID.STEPID``."""
        return f"{self.job_id}.{self.step_id}"


# -- Slurm's list syntaxes ----------------------------------------------------------------------

MAX_HOSTS = 200_000  # more nodes than any cluster has (Fugaku: 158,976): a longer list is a hostile or broken variable
MAX_TASKS_PER_NODE = 100_000  # more tasks than any node runs
# a Slurm node name as it may reach a command line or a URL: letters, digits, '_', '-', '.', not
# starting with '-' or '.' (an option to ssh or mpirun), at most 253 characters
NODE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}")


def _bracket_ranges(item: str, text: str) -> tuple[re.Match | None, list[tuple[int, int, int]]]:
    """The first ``[...]`` of ``item`` and its ``(low, high, width)`` ranges, checked: digits,
    ascending; ValueError naming the bad part."""
    match = re.search(r"\[([^\[\]]*)\]", item)
    if match is None:
        if "[" in item or "]" in item:
            raise ValueError(f"Slurm node list: unbalanced brackets in {item!r}")
        return None, []
    ranges = []
    for part in match.group(1).split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()) or len(low) > 18 or len(high) > 18:
            raise ValueError(f"Slurm node list: {part!r} in {item!r} is not N or N-M")
        first, last = int(low), int(high if dash else low)
        if last < first:
            raise ValueError(f"Slurm node list: the range {part.strip()!r} in {item!r} descends")
        ranges.append((first, last, len(low)))
    return match, ranges


def _count(item: str, text: str) -> int:
    """How many names ``item`` stands for, without listing them (ValueError past :data:`MAX_HOSTS`)."""
    match, ranges = _bracket_ranges(item, text)
    if match is None:
        return 1
    here = sum(last - first + 1 for first, last, _ in ranges)
    rest = _count(item[match.end():], text) if "[" in item[match.end():] else 1
    if here * rest > MAX_HOSTS:
        raise ValueError(f"Slurm node list: {text[:80]!r} stands for more than {MAX_HOSTS:,} hosts")
    return here * rest


def _expand_brackets(item: str, text: str = "") -> list[str]:
    """``"gpu[01-02]-ib[1,3]"`` -> every name it stands for, left bracket first."""
    match, ranges = _bracket_ranges(item, text or item)
    if match is None:
        return [item]
    names = [f"{item[:match.start()]}{number:0{width}d}{item[match.end():]}"
             for first, last, width in ranges for number in range(first, last + 1)]
    return [name for prefix in names for name in _expand_brackets(prefix, text or item)]


def _items(text: str) -> list[str]:
    """The comma-separated items of a node list (commas inside brackets belong to their item)."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def count_hostlist(text: str) -> int:
    """How many host names the compressed list ``text`` stands for, checked (malformed or
    descending ranges, more than :data:`MAX_HOSTS`: ValueError) without expanding it."""
    total = 0
    for item in _items(text):
        total += _count(item, text)
        if total > MAX_HOSTS:
            raise ValueError(f"Slurm node list: {text[:80]!r} stands for more than {MAX_HOSTS:,} hosts")
    return total


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list (``n[1-3,5],m2``, ``gpu[01-02]-ib``) -> host names, in order.
    Malformed or descending ranges, and lists of more than :data:`MAX_HOSTS` names, are a
    ValueError (counted before anything is expanded)."""
    if not count_hostlist(text):
        raise ValueError(f"Slurm node list: {text[:80]!r} names no host")
    return [name for item in _items(text) for name in _expand_brackets(item, text)]


def hostnames(nodelist: str, variable: str = "SLURM_JOB_NODELIST") -> list[str]:
    """The host names of a Slurm node list: ``scontrol show hostnames`` where Slurm's client is
    installed (it knows every syntax Slurm accepts), else :func:`expand_hostlist`. The list is
    counted first (no more than :data:`MAX_HOSTS`) and every name must be a node name
    (:data:`NODE_NAME`): a SlurmError naming ``variable`` otherwise."""
    try:
        count_hostlist(nodelist)
    except ValueError as exc:
        raise SlurmError(f"{variable}={nodelist[:80]!r}: {str(exc).removeprefix('Slurm node list: ')}") from None
    names: list[str] = []
    scontrol = shutil.which("scontrol")
    if scontrol:
        try:
            proc = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True,
                                  timeout=30)
            if proc.returncode == 0:
                names = proc.stdout.split()
        except (OSError, subprocess.SubprocessError):
            pass
    if not names:
        try:
            names = expand_hostlist(nodelist)
        except ValueError as exc:
            raise SlurmError(f"{variable}={nodelist[:80]!r}: {str(exc).removeprefix('Slurm node list: ')}") from None
    bad = next((name for name in names if not NODE_NAME.fullmatch(name)), None)
    if bad is not None or len(names) > MAX_HOSTS:
        raise SlurmError(f"{variable}={nodelist[:80]!r}: {bad!r:.80} is not a host name (letters, digits, '.', '-', "
                         f"'_', not starting with '-' or '.')" if bad is not None else
                         f"{variable}={nodelist[:80]!r} stands for more than {MAX_HOSTS:,} hosts")
    return names


def expand_tasks_per_node(text: str, variable: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """``SLURM_TASKS_PER_NODE``'s ``2(x3),1`` -> ``[2, 2, 2, 1]``; more than :data:`MAX_HOSTS`
    nodes or :data:`MAX_TASKS_PER_NODE` tasks on one is a ValueError naming ``variable``."""
    counts: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d{1,18})(?:\(x(\d{1,18})\))?\s*", part)
        if match is None:
            raise ValueError(f"Slurm tasks per node: {part!r} in {text!r} is not N or N(xM)")
        tasks, repeat = int(match.group(1)), int(match.group(2) or 1)
        if len(counts) + repeat > MAX_HOSTS or tasks > MAX_TASKS_PER_NODE:
            raise ValueError(f"{variable}={text[:80]!r}: more than {MAX_HOSTS:,} nodes or "
                             f"{MAX_TASKS_PER_NODE:,} tasks on one")
        counts += [tasks] * repeat
    return counts


def rendezvous_timeout(environ: Mapping[str, str] | None = None) -> float:
    """``HVDTRAIN_SLURM_RENDEZVOUS_TIMEOUT`` in seconds (default 300): a finite number > 0, else a
    SlurmError naming the variable."""
    return gloo.rendezvous_timeout(SlurmStep, environ)


def rendezvous_port(job_id: int, step_id: int, environ: Mapping[str, str] | None = None) -> int:
    """Task 0's rendezvous port: ``HVDTRAIN_SLURM_RENDEZVOUS_PORT`` if set, else
    ``20000 + (job_id * 16 + step_id % 16) % 10000`` (every task computes the same)."""
    env = os.environ if environ is None else environ
    if env.get(PORT_VARIABLE):
        value = env[PORT_VARIABLE]
        if not value.isdigit() or not 1024 <= int(value) <= 65535:
            raise SlurmError(f"{PORT_VARIABLE}={value!r} is not a port number in 1024-65535")
        return int(value)
    return PORT_BASE + (job_id * 16 + step_id % 16) % PORT_SPAN


# -- recognising a step -------------------------------------------------------------------------

def _int(env: Mapping[str, str], name: str) -> int:
    value = env.get(name, "")
    if not value.strip().isdigit():
        raise SlurmError(f"Slurm variable {name}={value!r} is not a number (this process looks like a task of a "
                         f"Slurm step: SLURM_PROCID and SLURM_STEP_ID are set)")
    return int(value)


def _step_id(env: Mapping[str, str]) -> str | None:
    return env.get("SLURM_STEP_ID", env.get("SLURM_STEPID"))


def slurm_step(environ: Mapping[str, str] | None = None) -> SlurmStep | None:
    """This task's :class:`SlurmStep` when ``srun`` started it and no other launcher set up the
    job (``horovodrun``, ``mpirun``, a PMI-using MPI); else None."""
    env = os.environ if environ is None else environ
    step = _step_id(env)
    if launcher(env) != "slurm" or step is None:  # another launcher inside the allocation keeps its own
        return None
    if not step.isdigit():  # "batch"/"extern" steps, or Slurm's named special steps
        return None
    list_variable = next((name for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
                          if env.get(name)), None)
    if list_variable is None:
        raise SlurmError("a Slurm step without a node list: neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set")
    nodelist = env[list_variable]
    nodes = hostnames(nodelist, list_variable)
    size = _int(env, "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS")
    per_node_variable = "SLURM_STEP_TASKS_PER_NODE" if env.get("SLURM_STEP_TASKS_PER_NODE") else "SLURM_TASKS_PER_NODE"
    per_node_text = env.get(per_node_variable)
    try:
        per_node = expand_tasks_per_node(per_node_text, per_node_variable) if per_node_text else []
    except ValueError as exc:
        raise SlurmError(str(exc) if str(exc).startswith(per_node_variable) else
                         f"{per_node_variable}={per_node_text[:80]!r}: {exc}") from None
    if len(per_node) != len(nodes) or sum(per_node) != size:
        if size % len(nodes):
            raise SlurmError(f"Slurm step of {size} task(s) on {len(nodes)} node(s) ({nodelist}) without a usable "
                             f"SLURM_STEP_TASKS_PER_NODE ({per_node_text!r})")
        per_node = [size // len(nodes)] * len(nodes)
    node = env.get("SLURMD_NODENAME") or ""
    if node not in nodes:
        index = _int(env, "SLURM_NODEID")
        if index >= len(nodes):
            raise SlurmError(f"SLURM_NODEID={index} but the step has {len(nodes)} node(s) ({nodelist})")
        node = nodes[index]
    result = SlurmStep(job_id=_int(env, "SLURM_JOB_ID" if "SLURM_JOB_ID" in env else "SLURM_JOBID"),
                       step_id=int(step), rank=_int(env, "SLURM_PROCID"), size=size,
                       local_rank=_int(env, "SLURM_LOCALID"), node=node, nodes=nodes, tasks_per_node=per_node)
    if not 0 <= result.rank < size or not 0 <= result.local_rank < result.local_size:
        raise SlurmError(f"Slurm task {result.rank} (local {result.local_rank}) does not fit a step of {size} "
                         f"task(s) with {result.local_size} on {node}")
    return result


def check_batch_process(environ: Mapping[str, str] | None = None) -> None:
    """The singleton trap: a process started by the batch script itself (no ``srun``, no other
    launcher) in a job of several tasks would train alone while the job paid for several ranks."""
    env = os.environ if environ is None else environ
    if launcher(env) != "slurm" or _step_id(env) is not None:
        return
    tasks = env.get("SLURM_NTASKS", "1")
    if tasks.isdigit() and int(tasks) > 1:
        raise SlurmError(f"this process runs in the batch script of Slurm job {env.get('SLURM_JOB_ID', '?')} "
                         f"(SLURM_NTASKS={tasks}) but no launcher started it, so it would train alone as 1 rank: "
                         f"start it with `srun hvdtrain ...` (one task per rank), or `horovodrun -np $SLURM_NTASKS "
                         f"-H $(hvdtrain slurm-hosts) hvdtrain ...`")


def check_world_size(size: int, environ: Mapping[str, str] | None = None) -> None:
    """After ``hvd.init()``: Slurm started several tasks but Horovod's world has 1 rank (each
    task an MPI singleton: ``srun --mpi=...`` with an MPI that does not use Slurm's PMI)."""
    env = os.environ if environ is None else environ
    if "SLURM_PROCID" not in env or _step_id(env) is None or size != 1:
        return
    tasks = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "1"
    if tasks.isdigit() and int(tasks) > 1:
        raise SlurmError(f"Slurm started {tasks} tasks but Horovod's world size is 1 on each (task "
                         f"{env['SLURM_PROCID']}): its MPI did not use Slurm's PMI. Run `srun hvdtrain ...` "
                         f"without --mpi (hvdtrain forms the job over Gloo), or with the --mpi=pmix/pmi2 your MPI "
                         f"was built for")


# -- forming the Gloo job -----------------------------------------------------------------------

def network_interface(step: SlurmStep, rendezvous_address: str) -> str | None:
    """The interface holding this node's address (:func:`hvdtrain.launch.gloo.network_interface`)."""
    return gloo.network_interface(step, rendezvous_address)


def start_rendezvous(step: SlurmStep) -> Any:
    """Task 0: Horovod's rendezvous server on the step's port, holding the step's tag, serving in
    a thread for the life of the process (:func:`hvdtrain.launch.gloo.start_rendezvous`)."""
    return gloo.start_rendezvous(step)


def wait_rendezvous(step: SlurmStep, address: str, environ: Mapping[str, str] | None = None) -> None:
    """Every task but 0: until task 0's server answers with this step's tag
    (:func:`hvdtrain.launch.gloo.wait_rendezvous`)."""
    gloo.wait_rendezvous(step, address, environ)


def prepare_slurm_step(step: SlurmStep, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Turn this task of ``step`` into a Horovod Gloo worker (:func:`hvdtrain.launch.gloo.join`):
    task 0 starts the rendezvous, the others wait for it; Horovod's variables are set in
    ``environ`` (default ``os.environ``; variables the user set already, such as
    ``HOROVOD_GLOO_IFACE``, are kept). Returns them."""
    env = os.environ if environ is None else environ
    rendezvous_timeout(env)  # a bad value is named before task 0 serves or the others wait
    if step.rank == 0 and step.node != step.nodes[0]:
        raise SlurmError(f"Slurm task 0 runs on {step.node}, not on the step's first node {step.nodes[0]}: use "
                         f"srun's default block or cyclic distribution")
    return gloo.join(step, env)


def lone_slurm_process(environ: Mapping[str, str] | None = None) -> bool:
    """A process of a one-task Slurm job started by the batch script itself (no launcher): it runs
    as one rank on Gloo, like a process started alone."""
    env = os.environ if environ is None else environ
    return launcher(env) == "slurm" and _step_id(env) is None and env.get("SLURM_NTASKS", "1") in ("", "1")


def allocation_hosts(environ: Mapping[str, str] | None = None) -> list[tuple[str, int]]:
    """The job allocation's nodes and the tasks Slurm gave each (``SLURM_JOB_NODELIST`` and
    ``SLURM_TASKS_PER_NODE``), for ``horovodrun -H`` or an MPI host file inside the batch script."""
    env = os.environ if environ is None else environ
    list_variable = "SLURM_JOB_NODELIST" if env.get("SLURM_JOB_NODELIST") else "SLURM_NODELIST"
    nodelist = env.get(list_variable)
    if not nodelist:
        raise SlurmError("not inside a Slurm allocation: SLURM_JOB_NODELIST is not set (run this in an sbatch script "
                         "or an salloc shell)")
    nodes = hostnames(nodelist, list_variable)
    per_node_text = env.get("SLURM_TASKS_PER_NODE") or ""
    try:
        per_node = expand_tasks_per_node(per_node_text) if per_node_text else [1] * len(nodes)
    except ValueError as e:
        raise SlurmError(str(e) if str(e).startswith("SLURM_TASKS_PER_NODE") else
                         f"SLURM_TASKS_PER_NODE={per_node_text[:80]!r}: {e}") from None
    if len(per_node) != len(nodes):
        raise SlurmError(f"SLURM_TASKS_PER_NODE={per_node_text!r} names {len(per_node)} node(s) but "
                         f"SLURM_JOB_NODELIST={nodelist!r} has {len(nodes)}")
    return list(zip(nodes, per_node))


WARNING_SIGNALS = ("USR1", "USR2")  # what --signal=NAME@SECONDS sends ahead of a time limit


def ignore_early_and_late_warnings(names: list[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """In a Slurm job, ignore the warning signals among ``names`` (``checkpoint.preempt_signals``)
    while no handler is installed, so that one arriving before the training loop watches for it,
    or after the loop stopped watching (Slurm sends it up to a minute early, and once per run: a
    requeued run that finishes first still gets it), does not kill a task that did nothing wrong.
    The loop's handler replaces this while it runs. TERM and INT keep their default action.
    Only in the main thread (Python's rule); returns the names now ignored."""
    import signal
    import threading

    env = os.environ if environ is None else environ
    if "SLURM_JOB_ID" not in env or threading.current_thread() is not threading.main_thread():
        return []
    ignored = []
    for name in names:
        number = getattr(signal, f"SIG{name}", None)
        if name in WARNING_SIGNALS and number is not None and signal.getsignal(number) is signal.SIG_DFL:
            signal.signal(number, signal.SIG_IGN)
            ignored.append(name)
    return ignored
