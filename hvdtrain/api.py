"""Run a recipe on N Horovod workers from Python, e.g. a notebook cell, and get rank 0's result.

::

    import hvdtrain
    result = hvdtrain.run("image-classification", framework="torch", np=2,
                          train__epochs=1, data__max_train_samples=5000)
    result.history[-1]["val_accuracy"], result.checkpoint

``np >= 2`` starts the workers with Horovod's Python launcher (``horovod.runner.run``) over Gloo,
as Accelerate's ``notebook_launcher`` does for torch; ``np=1`` trains in this process. The config
is resolved here, with the same objects and rules as the CLI, so a bad key fails before any
worker starts. The recipe travels with the job (its builders pickled by value when they were
defined in the notebook or in a recipe file), so recipes registered in the notebook run too.
An exception in a worker stops every worker and is raised here as :class:`WorkerError` carrying
that worker's traceback.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from hvdtrain.core.config import RunConfig, to_dict
from hvdtrain.core.resolve import load_config
from hvdtrain.core.loop import RunResult, train
from hvdtrain.core.plugins import resolve_recipe_name
from hvdtrain.core.registry import RecipeSpec, get_recipe, register_spec

REPORT_SCOPE = "hvdtrain-failures"


class WorkerError(RuntimeError):
    """A worker of :func:`run` failed. ``rank``, ``exc_type``, ``message`` and ``worker_traceback``
    describe the first failure; ``exception`` is the original exception object when it could be
    sent back (else None)."""

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
        **kwargs: Any) -> RunResult:
    """Train ``recipe`` on ``np`` workers and return rank 0's :class:`~hvdtrain.core.loop.RunResult`
    (``history``: one metrics dict per epoch; ``checkpoint``: the final checkpoint's path).

    ``np=1`` trains in this process. Otherwise ``hosts`` (default ``localhost:<np>``) is Horovod's
    ``host1:slots,host2:slots``; remote hosts are reached over SSH (``ssh_port``,
    ``ssh_identity_file``: horovodrun's ``-p``/``-i``) and need the same environment and paths;
    ``network_interfaces`` (``"eth0"``) picks the interface(s) Horovod uses between hosts. Before
    any worker starts, every remote host is checked: one that SSH cannot reach, or that has another
    hvdtrain, Python, framework or Horovod version, raises :class:`~hvdtrain.tools.hosts.HostError`
    naming it. Config arguments are those of :func:`resolve_config`. Raises :class:`WorkerError`
    (with the failing worker's traceback) if any worker fails; no worker outlives the call.
    """
    if not isinstance(np, int) or isinstance(np, bool) or np < 1:
        raise ValueError(f"np={np!r}: the number of workers must be an integer >= 1")
    config = resolve_config(recipe, framework, config_file, overrides, **kwargs)
    if np == 1:
        return train(config)
    hosts = hosts or f"localhost:{np}"
    ssh = {"ssh_port": ssh_port, "ssh_identity_file": ssh_identity_file}
    _check_hosts(hosts, **ssh)
    return _launch(config, get_recipe(config.recipe), np, hosts, start_timeout, verbose,
                   network_interfaces=network_interfaces.split(",") if network_interfaces else None, **ssh)


def _check_hosts(hosts: str, ssh_port: int | None, ssh_identity_file: str | None) -> None:
    """Every remote host reachable over SSH, with this host's versions (else HostError naming it)."""
    from hvdtrain.tools import hosts as host_checks

    if all(host_checks.is_local(name) for name, _ in host_checks.parse_hosts(hosts)):
        return
    found = host_checks.host_versions(f"localhost,{hosts}", ssh_port, ssh_identity_file)
    wrong = host_checks.mismatches(found)
    if wrong:
        raise host_checks.HostError("the hosts of this job run different versions (localhost is this "
                                    "machine): " + " | ".join(wrong))


def _launch(config: RunConfig, spec: RecipeSpec, np: int, hosts: str, start_timeout: int | None,
            verbose: bool, **launcher: Any) -> RunResult:
    """Horovod's launcher over Gloo, with a side channel for the workers' failure reports."""
    from horovod.runner import run as horovod_run
    from horovod.runner.http.http_server import KVStoreServer

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # as the CLI: no TensorFlow start-up chatter
    reports = KVStoreServer(verbose=0)
    port = reports.start_server()
    # horovod's launcher installs SIGINT/SIGTERM handlers (to stop its workers) and never removes
    # them; put the caller's back so a notebook's interrupt button keeps working afterwards.
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} \
        if threading.current_thread() is threading.main_thread() else {}
    try:
        results = horovod_run(_worker, args=(config, spec, port), num_proc=np, hosts=hosts, use_gloo=True,
                              start_timeout=start_timeout, verbose=2 if verbose else None,
                              **{k: v for k, v in launcher.items() if v is not None})
    except Exception as exc:
        raise _worker_error(reports, exc, np) from None
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        reports.shutdown_server()
    return results[0]


def _worker(config: RunConfig, spec: RecipeSpec, report_port: int) -> RunResult | None:
    """What each worker runs: register the shipped recipe, train, report a failure before dying."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    rank = int(os.environ.get("HOROVOD_RANK", "0"))
    try:
        register_spec(spec, replace=True)
        result = train(config)
    except Exception as exc:
        _send_report(rank, exc, report_port)
        raise  # a non-zero exit: the launcher stops the other workers at once
    return result if rank == 0 else None


def _send_report(rank: int, exc: BaseException, port: int) -> None:
    """Put this worker's failure into the caller's key-value store (best effort)."""
    from horovod.runner.http.http_client import put_data_into_kvstore

    import cloudpickle

    try:
        original = cloudpickle.dumps(exc)
    except Exception:
        original = None
    report = {"rank": rank, "size": int(os.environ.get("HOROVOD_SIZE", "0")), "host": socket.gethostname(),
              "time": time.time(), "type": type(exc).__name__, "message": str(exc),
              "traceback": "".join(traceback.format_exception(exc)), "exception": original}
    # horovod.runner.run_task is started as `python -m horovod.runner.run_task DRIVER_ADDR PORT`
    driver = sys.argv[1] if len(sys.argv) > 1 and Path(sys.argv[0]).name == "run_task.py" else "127.0.0.1"
    try:
        put_data_into_kvstore(driver, port, REPORT_SCOPE, str(rank), report)
    except Exception as send_error:  # the traceback still reaches the caller through stderr
        print(f"hvdtrain: could not send the failure report to the caller: {send_error}", file=sys.stderr)


def _is_consequence(report: dict[str, Any]) -> bool:
    """True for errors that only say another worker went away first."""
    text = f"{report['type']} {report['message']}"
    return "Horovod" in report["type"] or "shut down" in text or "HorovodInternalError" in report["traceback"]


def _worker_error(server: Any, launcher_error: Exception, np: int) -> WorkerError:
    """The first real failure among the workers' reports, or the launcher's own error."""
    from horovod.runner.common.util import codec

    import cloudpickle

    with server.httpd.cache_lock:
        raw = list(server.httpd.cache.get(REPORT_SCOPE, {}).values())
    reports = [codec.loads_base64(value) for value in raw]
    if not reports:
        return WorkerError(f"the Horovod job stopped without a worker reporting an error: a worker was killed "
                           f"(out of memory, a signal) or the run was interrupted; the workers' output above says "
                           f"more. {launcher_error}")
    first = min(reports, key=lambda r: (_is_consequence(r), r["time"]))
    try:
        original = cloudpickle.loads(first["exception"]) if first["exception"] else None
    except Exception:
        original = None
    summary = (f"worker {first['rank']} of {first['size'] or np} (host {first['host']}) failed: "
               f"{first['type']}: {first['message']}\n\nTraceback from worker {first['rank']}:\n"
               f"{first['traceback'].rstrip()}")
    return WorkerError(summary, first["rank"], first["type"], first["message"], first["traceback"], original)
