#!/usr/bin/env bash
# Switchyard's start for the shared harness (bench/anchors puts it in place of the harness's
# switchyard/start.sh, in a private copy of the harness; /work/shared is left as it is).
#   anchors_start.sh CONFIG PORT WORKERS REDIS_URL WORKDIR   (the harness's calling convention)
# Why not the harness's own start.sh: it runs `manage.py broker_bootstrap`, a command this
# project removed when the broker's state began to heal itself (86e4806), so it stops there.
# Otherwise the same: a fresh SQLite file, migrate, loadconfig, then the server exec'd (the PID
# the harness holds is the server's), started as tests/stack.py and scripts/demo start it:
# gateway.serve (uvicorn, a listening socket per worker), switchyard.asgi:application with
# gateway.server:HttpProtocol (uvicorn's httptools protocol, whose own 400s are in the error
# envelope), uvloop, no access log, the cores compiled by mypyc. No Celery worker (as the
# harness and bench/gateway_bench.py): ledger records stay queued in Redis.
# Env: SWITCHYARD_SRC (the project checkout), SWITCHYARD_VENV (default: its .venv),
# SWITCHYARD_SERVER (uvicorn, the default, or granian: the same application under granian's ASGI
# interface, uvloop, HTTP/1 only, for bench/cpu_per_request.py --server; issue 19 item 2),
# SWITCHYARD_WRAP (a command the server runs under: valgrind for cpu_per_request.py --callgrind).
set -euo pipefail
[[ $# -eq 5 ]] || { sed -n '2,4p' "$0"; exit 2; }
CONFIG=$1 PORT=$2 WORKERS=$3 REDIS=$4 WORKDIR=$5
SRC=${SWITCHYARD_SRC:?the project checkout}
VENV=${SWITCHYARD_VENV:-$SRC/.venv}
rm -rf "$WORKDIR"; mkdir -p "$WORKDIR/metrics"
export DATABASE_URL="sqlite:///$WORKDIR/switchyard.sqlite3" REDIS_URL="$REDIS" REDIS_PREFIX=sybench \
  DJANGO_SETTINGS_MODULE=switchyard.settings PYTHONPATH="$SRC" PROMETHEUS_MULTIPROC_DIR="$WORKDIR/metrics" \
  MOCK_UPSTREAM_API_KEY=sk-mock-upstream LOG_LEVEL=WARNING
cd "$SRC"
"$VENV/bin/python" manage.py migrate --noinput >/dev/null
"$VENV/bin/python" manage.py loadconfig "$CONFIG"
# The cores compiled by mypyc, as a deployment runs them (gateway.serve; ~1 minute the first
# time for a version of the cores, then cached); without a build the workers run them as Python.
"$VENV/bin/python" -m common.compiled_cores || echo "anchors_start: the cores run as Python" >&2
case "${SWITCHYARD_SERVER:-uvicorn}" in
  uvicorn)
    exec ${SWITCHYARD_WRAP:-} "$VENV/bin/python" -m gateway.serve --host 127.0.0.1 --port "$PORT" --workers "$WORKERS" ;;
  granian)
    exec "$VENV/bin/python" -m granian switchyard.asgi:application --interface asgi \
      --host 127.0.0.1 --port "$PORT" --workers "$WORKERS" --loop uvloop --http 1 \
      --no-ws --no-access-log --log-level warning ${GRANIAN_ARGS:-} ;;
  *) echo "SWITCHYARD_SERVER: uvicorn or granian" >&2; exit 2 ;;
esac
