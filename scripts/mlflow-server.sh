#!/usr/bin/env bash
# An MLflow tracking server in its own virtual environment (the tests' fixture and a user's local
# server). The full `mlflow` package brings pandas, pyarrow, scikit-learn, SQLAlchemy, Flask: kept
# out of the training venv, which needs only the client (mlflow-skinny, hvdtrain's [trackers] extra).
#
#   scripts/mlflow-server.sh --setup                    create/refresh the server venv, then exit
#   scripts/mlflow-server.sh server --host 127.0.0.1 --port 5000 --backend-store-uri sqlite:///mlflow.db ...
#                                                       any `mlflow` command, run from that venv
#
#   HVDTRAIN_MLFLOW_VENV  the server's venv     (default: <repo>/.venv-mlflow)
#   HVDTRAIN_PYTHON       interpreter for it    (default: python3)
set -euo pipefail
MLFLOW_SPEC="mlflow==3.17.0"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${HVDTRAIN_MLFLOW_VENV:-$repo/.venv-mlflow}"
python="${HVDTRAIN_PYTHON:-python3}"
stamp="$venv/.hvdtrain-mlflow-$MLFLOW_SPEC"

if [[ ! -f "$stamp" ]]; then
  echo "mlflow-server.sh: installing $MLFLOW_SPEC into $venv (once)" >&2
  [[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$MLFLOW_SPEC" 2>&1 \
    | grep -v "^WARNING: Location .* is ignored" >&2 || true
  "$venv/bin/python" -c "import mlflow.server" || { echo "mlflow-server.sh: $MLFLOW_SPEC did not install into $venv" >&2; exit 1; }
  "$venv/bin/mlflow" --version >/dev/null
  touch "$stamp"
fi
if [[ "${1:-}" == "--setup" ]]; then
  exit 0
fi
exec "$venv/bin/mlflow" "$@"
