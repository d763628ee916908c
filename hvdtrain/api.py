"""Run a recipe on N Horovod workers from Python, e.g. a notebook cell, and get rank 0's result.

::

    import hvdtrain
    result = hvdtrain.run("image-classification", framework="torch", np=2,
                          train__epochs=1, data__max_train_samples=5000)
    result.history[-1]["val_accuracy"], result.checkpoint

``np >= 2`` starts the workers with Horovod's launcher over Gloo (as ``horovodrun`` would, from
this process), as Accelerate's ``notebook_launcher`` does for torch; ``np=1`` trains in this
process. The config is resolved here, with the same objects and rules as the CLI, so a bad key
fails before any worker starts. The recipe travels with the job (its builders pickled by value
when they were defined in the notebook or in a recipe file), so recipes registered in the notebook
run too. An exception in a worker stops every worker and is raised here as :class:`WorkerError`
carrying that worker's traceback.

Network: the job and the workers' results travel through a :class:`~hvdtrain.launch.jobchannel.Channel`
of this process, bound to the address the workers reach it at (loopback for a job on this machine) and
authenticated with a random per-job key (HMAC); results and failure reports are JSON data. Not
through Horovod's function mode (``horovod.runner.run(func)``), whose unauthenticated key-value
store on every interface would let any host that reaches it run code here or on the workers.
Horovod's Gloo rendezvous server (all interfaces, unauthenticated, no code) stays exposed while
the job runs: docs/guides/notebooks.md.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from hvdtrain.core.callbacks import Callback
from hvdtrain.core.config import RunConfig, to_dict
from hvdtrain.core.errors import type_name
from hvdtrain.core.loop import RunResult
from hvdtrain.core.plugins import resolve_recipe_name
from hvdtrain.launch import detect, jobchannel
from hvdtrain.trainer import train
from hvdtrain.core.registry import RecipeSpec, get_recipe, register_spec
from hvdtrain.core.resolve import load_config


class WorkerError(RuntimeError):
    """A worker of :func:`run` failed. ``rank``, ``exc_type``, ``message`` and ``worker_traceback``
    describe the first failure; ``exception`` is a plain exception of the same builtin type with the
    worker's message (``FileNotFoundError``, ``ValueError``, ...), or None for other types: failure
    reports travel as data (JSON), never as pickled objects."""

    def __init__(self, summary: str, rank: int | None = None, exc_type: str = "", message: str = "",
                 worker_traceback: str = "", exception: BaseException | None = None):
        super().__init__(summary)
        self.rank, self.exc_type, self.message = rank, exc_type, message
        self.worker_traceback, self.exception = worker_traceback, exception


def resolve_config(recipe: str | RecipeSpec | RunConfig, framework: str | None = None,
                   config_file: str | Path | None = None, overrides: dict[str, Any] | list[str] | None = None,
                   **kwargs: Any) -> RunConfig:
    """The RunConfig :func:`run` trains: like ``hvdtrain recipe`` with ``--config`` and ``--set``.

    ``recipe`` is a recipe name, a user's recipe file (``my_recipe.py``), a :class:`RecipeSpec`, or
    a RunConfig to start from. ``kwargs`` are config keys with ``__`` for dots
    (``train__epochs=1``, ``output="runs/x"``); ``overrides`` is a dict of dotted keys
    (``{"optim.lr": 0.1}``) or a list of ``"key=value"`` strings. Later sources win:
    recipe defaults < ``config_file`` < ``kwargs`` < ``overrides``.
    """
    if isinstance(recipe, RunConfig):
        name, defaults = recipe.recipe, to_dict(recipe)
    else:
        if isinstance(recipe, RecipeSpec):
            register_spec(recipe, replace=True)
            name = recipe.name
        else:
            name = resolve_recipe_name(str(recipe))
        defaults = get_recipe(name).defaults
    top = dict(kwargs)
    strings: list[str] = []
    if isinstance(overrides, dict):
        top.update({key.replace(".", "__"): value for key, value in overrides.items()})
    elif overrides:
        strings = list(overrides)
    config = load_config(defaults, config_file, strings, recipe=name, framework=framework, **top)
    config.output = str(Path(config.output).expanduser().absolute())  # workers may start elsewhere
    return config


def run(recipe: str | RecipeSpec | RunConfig, framework: str | None = None, np: int = 2, *,
        config_file: str | Path | None = None, overrides: dict[str, Any] | list[str] | None = None,
        hosts: str | None = None, ssh_port: int | None = None, ssh_identity_file: str | None = None,
        network_interfaces: str | None = None, start_timeout: int | None = None, verbose: bool = False,
        callbacks: list[Callback] | tuple[Callback, ...] = (), **kwargs: Any) -> RunResult:
    """Train ``recipe`` on ``np`` workers and return rank 0's :class:`~hvdtrain.core.loop.RunResult`
    (``history``: one metrics dict per epoch; ``checkpoint``: the final checkpoint's path).

    ``np=1`` trains in this process. Otherwise ``hosts`` (default ``localhost:<np>``) is Horovod's
    ``host1:slots,host2:slots``; remote hosts are reached over SSH (``ssh_port``,
    ``ssh_identity_file``: horovodrun's ``-p``/``-i``) and need the same environment and paths;
    ``network_interfaces`` (``"eth0"``) picks the interface(s) Horovod uses between hosts. Before
    any worker starts, every remote host is checked: one that SSH cannot reach, or that has another
    hvdtrain, Python, framework or Horovod version, raises :class:`~hvdtrain.launch.hosts.HostError`
    naming it. Config arguments are those of :func:`resolve_config`. ``callbacks``
    (:class:`hvdtrain.Callback` instances) run in every worker beside hvdtrain's own: they travel
    with the job (pickled by value), so each worker holds its own copy (``on_train_begin``'s
    ``ctx.rank`` says which). Raises :class:`WorkerError` (with the failing worker's traceback) if
    any worker fails; no worker outlives the call.
    """
    if not isinstance(np, int) or isinstance(np, bool) or np < 1:
        raise ValueError(f"np={np!r}: the number of workers must be an integer >= 1")
    config = resolve_config(recipe, framework, config_file, overrides, **kwargs)
    callbacks = list(callbacks)
    bad = [c for c in callbacks if not isinstance(c, Callback)]
    if bad:
        raise TypeError(f"callbacks: {type_name(bad[0])} is not a "
                        f"hvdtrain.Callback (subclass it and override its hooks)")
    if np == 1:
        return train(config, callbacks)
    hosts = hosts or f"localhost:{np}"
    ssh = {"ssh_port": ssh_port, "ssh_identity_file": ssh_identity_file}
    _check_hosts(hosts, **ssh)
    return _launch(config, get_recipe(config.recipe), np, hosts, start_timeout, verbose,
                   network_interfaces=network_interfaces.split(",") if network_interfaces else None,
                   callbacks=callbacks, **ssh)


def _check_hosts(hosts: str, ssh_port: int | None, ssh_identity_file: str | None) -> None:
    """Every remote host reachable over SSH, with this host's versions (else HostError naming it)."""
    from hvdtrain.launch import hosts as host_checks

    if all(host_checks.is_local(name) for name, _ in host_checks.parse_hosts(hosts)):
        return
    found = host_checks.host_versions(f"localhost,{hosts}", ssh_port, ssh_identity_file)
    wrong = host_checks.mismatches(found)
    if wrong:
        raise host_checks.HostError("the hosts of this job run different versions (localhost is this "
                                    "machine): " + " | ".join(wrong))


def _launch(config: RunConfig, spec: RecipeSpec, np: int, hosts: str, start_timeout: int | None,
            verbose: bool, network_interfaces: list[str] | None = None, callbacks: list[Callback] | None = None,
            **ssh: Any) -> RunResult:
    """Horovod's launcher over Gloo running :func:`_task_main` on every worker, which fetches the job
    from, and sends its result or failure to, this process's authenticated
    :class:`~hvdtrain.launch.jobchannel.Channel`.

    Not Horovod's function mode (``horovod.runner.run(func)``): that mode serves the pickled function
    and reads the pickled results through an unauthenticated key-value store on every interface of
    this machine, so any host that reaches the port could replace the function (code on every
    worker) or a result (code here)."""
    # what horovod.runner.run does with a command instead of a function (private names of the
    # Horovod pinned in setup.cfg, 0.28.1; tests/distributed/test_api.py runs this path)
    from horovod.runner import _HorovodArgs
    from horovod.runner.launch import _run as horovod_launch

    import cloudpickle

    key = secrets.token_bytes(32)
    channel = jobchannel.Channel(jobchannel.channel_address(hosts, network_interfaces), key,
                                 cloudpickle.dumps((config, spec, list(callbacks or ()))))
    args = _HorovodArgs()
    args.num_proc, args.hosts, args.use_gloo, args.start_timeout = np, hosts, True, start_timeout
    args.verbose = 2 if verbose else None
    args.ssh_port, args.ssh_identity_file = ssh.get("ssh_port"), ssh.get("ssh_identity_file")
    args.nics = set(network_interfaces) if network_interfaces else None
    # the key reaches the workers on their command line (as Horovod's own service key does): visible
    # in the process list of the job's hosts while it runs, useless once the call returns
    args.command = [sys.executable, "-c", "from hvdtrain.api import _task_main; _task_main()",
                    channel.address, str(channel.port), key.hex()]
    # horovod's launcher installs SIGINT/SIGTERM handlers (to stop its workers) and never removes
    # them; put the caller's back so a notebook's interrupt button keeps working afterwards.
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} \
        if threading.current_thread() is threading.main_thread() else {}
    try:
        horovod_launch(args)
    except Exception as exc:
        raise _worker_error(channel.reports(), exc, np) from None
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        channel.close()
    data = channel.result()
    if data is None:
        raise WorkerError("the Horovod job finished but rank 0's result did not reach the caller "
                          "(the workers' output above says why)")
    return RunResult(Path(data["output"]), data["history"],
                     Path(data["checkpoint"]) if data["checkpoint"] else None, data["world_size"])


def _task_main() -> None:
    """A worker's entry point (``python -c ... ADDRESS PORT KEY``): fetch the job, run :func:`_worker`,
    send rank 0's result to the caller (as JSON data)."""
    import cloudpickle

    address, port, key = sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3])
    config, spec, callbacks = cloudpickle.loads(jobchannel.request(address, port, key, "GET", "/job"))  # checked: signed by the caller
    result = _worker(config, spec, (address, port, key), callbacks)
    if result is not None:
        body = {"output": str(result.output), "history": result.history, "world_size": result.world_size,
                "checkpoint": str(result.checkpoint) if result.checkpoint else None}
        jobchannel.request(address, port, key, "PUT", "/result/0", json.dumps(body, default=_plain).encode())


def _plain(value: Any) -> Any:
    """JSON for what metrics may hold besides plain numbers (NumPy scalars, paths)."""
    return value.item() if hasattr(value, "item") else str(value)


def _worker(config: RunConfig, spec: RecipeSpec, channel: tuple[str, int, bytes],
            callbacks: list[Callback] | tuple[Callback, ...] = ()) -> RunResult | None:
    """What each worker runs: register the shipped recipe, train (with the caller's callbacks),
    report a failure before dying."""
    rank = detect.rank()
    try:
        register_spec(spec, replace=True)
        result = train(config, callbacks)
    except Exception as exc:
        _send_report(rank, exc, channel)
        raise  # a non-zero exit: the launcher stops the other workers at once
    return result if rank == 0 else None


def _send_report(rank: int, exc: BaseException, channel: tuple[str, int, bytes]) -> None:
    """Send this worker's failure to the caller as JSON data (best effort)."""
    report = {"rank": rank, "size": int(os.environ.get("HOROVOD_SIZE", "0")), "host": socket.gethostname(),
              "time": time.time(), "type": type(exc).__name__, "module": type(exc).__module__,
              "message": str(exc), "traceback": "".join(traceback.format_exception(exc))}
    try:
        jobchannel.request(*channel, "PUT", f"/failure/{rank}", json.dumps(report).encode())
    except Exception as send_error:  # the traceback still reaches the caller through stderr
        print(f"hvdtrain: could not send the failure report to the caller: {send_error}", file=sys.stderr)


def _is_consequence(report: dict[str, Any]) -> bool:
    """True for errors that only say another worker went away first."""
    text = f"{report['type']} {report['message']}"
    return "Horovod" in report["type"] or "shut down" in text or "HorovodInternalError" in report["traceback"]


def _builtin_exception(report: dict[str, Any]) -> BaseException | None:
    """A plain exception of the worker's builtin exception type with its message, else None."""
    import builtins

    cls = getattr(builtins, report["type"], None) if report["module"] == "builtins" else None
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        return None
    try:
        return cls(report["message"])
    except Exception:
        return None


def _worker_error(reports: list[dict[str, Any]], launcher_error: Exception, np: int) -> WorkerError:
    """The first real failure among the workers' reports, or the launcher's own error."""
    if not reports:
        return WorkerError(f"the Horovod job stopped without a worker reporting an error: a worker was killed "
                           f"(out of memory, a signal) or the run was interrupted; the workers' output above says "
                           f"more. {launcher_error}")
    first = min(reports, key=lambda r: (_is_consequence(r), r["time"]))
    summary = (f"worker {first['rank']} of {first['size'] or np} (host {first['host']}) failed: "
               f"{first['type']}: {first['message']}\n\nTraceback from worker {first['rank']}:\n"
               f"{first['traceback'].rstrip()}")
    return WorkerError(summary, first["rank"], first["type"], first["message"], first["traceback"],
                       _builtin_exception(first))
