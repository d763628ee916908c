"""Before training: rank 0 reaches every tracker ``log.trackers`` names; all ranks share the verdict.

Each check imports the tracker's package and talks to its server once, with a short timeout and no
retries: a missing package, a server that does not answer, a URI of the wrong kind or a W&B login
that is missing is a :class:`~.base.TrackerError` naming the tracker, the address and the fix, raised
on every rank alike (the verdict is broadcast, as the start plan is), before the model is built.
"""

from __future__ import annotations

import os
from typing import Any

from hvdtrain.core.redact import redact_text, redact_uri
from hvdtrain.observability.trackers.base import INSTALL_HINT, TrackerError, parse_trackers

TIMEOUT_SEC = 10
DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")  # local stores that need SQLAlchemy (full mlflow)


def _short(exc: BaseException, most: int = 160) -> str:
    """An exception as a short phrase: its type and the start of its message's first sentence."""
    text = (str(exc).strip().splitlines() or [""])[0]
    text = text.split(". ")[0]
    return f"{type(exc).__name__}: {text[:most]}{'...' if len(text) > most else ''}" if text else type(exc).__name__


def mlflow_uri(config: Any) -> str:
    """The tracking URI a run uses: ``log.mlflow_tracking_uri``, else ``MLFLOW_TRACKING_URI``, else MLflow's default."""
    import mlflow

    return config.log.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or mlflow.get_tracking_uri()


def check_mlflow(config: Any) -> None:
    """The MLflow package imports and its tracking server (or local store) answers."""
    try:
        import mlflow  # noqa: F401
    except ImportError as exc:
        raise TrackerError(f"log.trackers=mlflow: the mlflow client is not installed ({exc}); {INSTALL_HINT}") from None
    uri = mlflow_uri(config)
    shown = redact_uri(uri)  # what a message may show: no user-info, no query values
    fix = "start the server, or set log.mlflow_tracking_uri (or MLFLOW_TRACKING_URI) to one that answers"
    if uri.startswith(("http://", "https://")):
        from mlflow.tracking._tracking_service.utils import get_default_host_creds
        from mlflow.utils.rest_utils import http_request

        try:
            response = http_request(get_default_host_creds(uri), "/api/2.0/mlflow/experiments/get-by-name", "GET",
                                    max_retries=0, timeout=TIMEOUT_SEC, raise_on_status=False,
                                    params={"experiment_name": config.log.mlflow_experiment})
        except Exception as exc:  # connection refused, DNS, timeout: requests' and urllib3's errors
            reason = "no answer" if "onnect" in str(exc) or "imeout" in str(exc) else redact_text(_short(exc))
            raise TrackerError(f"log.trackers=mlflow: cannot reach the MLflow tracking server at {shown} "
                               f"({reason}); {fix}") from None
        if response.status_code in (401, 403):
            raise TrackerError(f"log.trackers=mlflow: the MLflow server at {shown} refused the request "
                               f"(HTTP {response.status_code}); set MLFLOW_TRACKING_TOKEN or "
                               f"MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD")
        if response.status_code not in (200, 404) or "json" not in response.headers.get("Content-Type", ""):
            raise TrackerError(f"log.trackers=mlflow: {shown} does not answer as an MLflow tracking server "
                               f"(HTTP {response.status_code} on /api/2.0/mlflow/experiments/get-by-name); {fix}")
        return
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""
    if scheme in DATABASE_SCHEMES:
        try:
            import sqlalchemy  # noqa: F401
        except ImportError:
            raise TrackerError(f"log.trackers=mlflow: the MLflow store {shown} is a database, which only the full "
                               f"mlflow package opens (this venv has the client, mlflow-skinny); pip install "
                               f"mlflow==3.17.0, or run a server (scripts/mlflow-server.sh server ...) and set "
                               f"log.mlflow_tracking_uri=http://HOST:PORT") from None
    try:  # a local store (sqlite:, file:, a folder): opening it is the check
        from mlflow import MlflowClient

        MlflowClient(uri).search_experiments(max_results=1)
    except ImportError as exc:
        raise TrackerError(f"log.trackers=mlflow: the MLflow store {shown} needs the full mlflow package ({exc}); "
                           f"pip install mlflow==3.17.0, or point log.mlflow_tracking_uri at a server "
                           f"(scripts/mlflow-server.sh starts one)") from None
    except Exception as exc:
        raise TrackerError(f"log.trackers=mlflow: cannot open the MLflow store {shown} ({redact_text(_short(exc))}); use a "
                           f"tracking server (scripts/mlflow-server.sh starts one) with "
                           f"log.mlflow_tracking_uri=http://HOST:PORT") from None


def wandb_mode() -> str:
    """``WANDB_MODE`` as W&B reads it (``dryrun`` is offline); online when unset."""
    mode = os.environ.get("WANDB_MODE", "online").strip().lower() or "online"
    return "offline" if mode == "dryrun" else mode


def wandb_key(host: str) -> str | None:
    """The API key W&B would use for ``host``: ``WANDB_API_KEY``, else the netrc entry for its host
    (``NETRC``, else ``~/.netrc``), as ``wandb login`` writes it."""
    if os.environ.get("WANDB_API_KEY"):
        return os.environ["WANDB_API_KEY"]
    import netrc
    from urllib.parse import urlparse

    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        entry = netrc.netrc(path).authenticators(urlparse(host).hostname or "")
    except (OSError, netrc.NetrcParseError):
        return None
    return entry[2] if entry else None


def verify_wandb_key(host: str, key: str) -> str | None:
    """Ask the W&B server at ``host`` who the key belongs to (its GraphQL ``viewer``), once, with a
    timeout: None when it answers with a user, else the reason. Plain HTTP, as W&B's own API does it:
    ``wandb.login(verify=True)`` starts W&B's service process, which keeps retrying an unreachable
    server after the call has given up and holds the exit of the process that started it."""
    import base64
    import json
    import urllib.error
    import urllib.request

    token = base64.b64encode(f"api:{key}".encode()).decode()
    request = urllib.request.Request(
        host.rstrip("/") + "/graphql", data=json.dumps({"query": "query { viewer { id } }"}).encode(),
        headers={"Authorization": f"Basic {token}", "Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SEC) as response:
            answer = json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return f"the server refused the key (HTTP {exc.code})" if exc.code in (401, 403) else f"HTTP {exc.code}"
    except OSError as exc:  # URLError is one: refused, DNS, timeout, TLS
        reason = getattr(exc, "reason", exc)  # URLError's reason: the socket's error, or only a string
        return f"no answer: {_short(reason if isinstance(reason, BaseException) else exc)}"
    except ValueError:
        return "the answer is not W&B's JSON"
    viewer = (answer.get("data") or {}).get("viewer") if isinstance(answer, dict) else None
    return None if viewer else "the server knows no user for this key"


def check_wandb(config: Any) -> None:
    """The wandb package imports; online, a login exists and the W&B server accepts it."""
    try:
        import wandb  # noqa: F401
    except ImportError as exc:
        raise TrackerError(f"log.trackers=wandb: the wandb client is not installed ({exc}); {INSTALL_HINT}") from None
    mode = wandb_mode()
    if mode not in ("online", "offline", "disabled", "shared"):
        raise TrackerError(f"log.trackers=wandb: WANDB_MODE={os.environ.get('WANDB_MODE')!r} is not a W&B mode; "
                           f"use online, offline or disabled")
    if mode in ("offline", "disabled"):
        return
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
    fix = "run `wandb login` (or set WANDB_API_KEY), or log offline with WANDB_MODE=offline and `wandb sync` later"
    if os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return  # federated identity: W&B exchanges the token itself; nothing to check with a key
    key = wandb_key(host)
    if not key:
        raise TrackerError(f"log.trackers=wandb: no W&B login for {host}; {fix}")
    reason = verify_wandb_key(host, key)
    if reason:
        raise TrackerError(f"log.trackers=wandb: cannot log in to W&B at {host} ({reason}); {fix}")


CHECKS = {"mlflow": check_mlflow, "wandb": check_wandb}


def verdict(config: Any) -> str | None:
    """Rank 0's check of every tracker in ``log.trackers``: the first refusal, or None."""
    try:
        for name in parse_trackers(config.log.trackers):
            if name in CHECKS:
                CHECKS[name](config)
    except TrackerError as exc:
        return str(exc)
    return None


def preflight(config: Any, adapter: Any, ctx: Any) -> None:
    """Every rank, right after Horovod starts: rank 0 checks the trackers and broadcasts the
    verdict (a collective), so all ranks raise the same :class:`TrackerError` or all go on. In
    elastic mode nothing before the elastic loop may be collective (a joiner runs this alone):
    each worker checks for itself."""
    if not any(name in CHECKS for name in parse_trackers(config.log.trackers)):
        return  # TensorBoard or none: nothing to reach, no collective
    if config.train.elastic or ctx.size == 1:
        refusal = verdict(config)
    else:
        refusal = adapter.broadcast_object(verdict(config) if ctx.is_main else None, root_rank=0)  # distributed
    if refusal:
        raise TrackerError(refusal)
