# Shared by scripts/demo and scripts/test: a virtualenv, a Redis, a PostgreSQL — started only
# when none answers, stopped by PID when the script exits.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
STARTED_PIDS=()

log() { printf '\033[1m[switchyard]\033[0m %s\n' "$*" >&2; }

cleanup() {
  local pid
  for pid in "${STARTED_PIDS[@]:-}"; do
    [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  done
  for pid in "${STARTED_PIDS[@]:-}"; do
    [ -n "$pid" ] && wait "$pid" 2>/dev/null || true
  done
  if [ -n "${PG_DATA:-}" ] && [ -f "$PG_DATA/postmaster.pid" ]; then
    as_postgres "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast stop >/dev/null 2>&1 || true
  fi
  [ -n "${THROWAWAY_DIR:-}" ] && rm -rf "$THROWAWAY_DIR"
  return 0
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

ensure_venv() {
  if [ ! -x "$PY" ]; then
    log "creating the virtualenv in .venv"
    python3.11 -m venv "$VENV" 2>/dev/null || python3 -m venv "$VENV"
  fi
  local stamp="$VENV/.requirements.sha256"
  local want
  want="$(sha256sum "$ROOT/requirements.txt" | cut -d' ' -f1)"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    log "installing requirements.txt"
    "$VENV/bin/pip" install --disable-pip-version-check -q -r "$ROOT/requirements.txt"
    echo "$want" > "$stamp"
  fi
}

apt_install() {
  log "installing Debian packages: $*"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q "$@" >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q "$@" >/dev/null; }
}

redis_answers() { # URL
  "$PY" - "$1" <<'PYEOF' >/dev/null 2>&1
import sys, redis
redis.Redis.from_url(sys.argv[1], socket_connect_timeout=1).ping()
PYEOF
}

# Sets REDIS_URL: $REDIS_URL or the given default when it answers, else a throwaway
# redis-server (on $REDIS_PORT, or a free port).
ensure_redis() {
  local url
  for url in "${REDIS_URL:-}" "${1:-}"; do
    if [ -n "$url" ] && redis_answers "$url"; then
      export REDIS_URL="$url"
      log "using Redis at $REDIS_URL"
      return
    fi
  done
  command -v redis-server >/dev/null || apt_install redis-server
  local port
  port="${REDIS_PORT:-$(free_port)}"
  mkdir -p "$THROWAWAY_DIR/redis"
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$THROWAWAY_DIR/redis" --logfile "$THROWAWAY_DIR/redis/redis.log" &
  STARTED_PIDS+=("$!")
  export REDIS_URL="redis://127.0.0.1:$port/0"
  for _ in $(seq 50); do redis_answers "$REDIS_URL" && break; sleep 0.1; done
  redis_answers "$REDIS_URL" || { log "Redis did not start"; exit 1; }
  log "started a throwaway Redis at $REDIS_URL (pid ${STARTED_PIDS[-1]})"
}

as_postgres() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

postgres_answers() { # URL
  "$PY" - "$1" <<'PYEOF' >/dev/null 2>&1
import sys, psycopg
psycopg.connect(sys.argv[1], connect_timeout=2).close()
PYEOF
}

# Sets DATABASE_URL: the given one if it answers, else a throwaway cluster (initdb + pg_ctl).
ensure_postgres() {
  if [ -n "${DATABASE_URL:-}" ] && postgres_answers "$DATABASE_URL"; then
    log "using PostgreSQL at $DATABASE_URL"
    return
  fi
  PG_BIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)"
  if [ -z "$PG_BIN" ] || [ ! -x "$PG_BIN/initdb" ]; then
    apt_install postgresql
    PG_BIN="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n1)"
  fi
  id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
  local port
  port="$(free_port)"
  PG_DATA="$THROWAWAY_DIR/pg"
  mkdir -p "$PG_DATA"
  chown -R postgres "$THROWAWAY_DIR"
  chmod 755 "$THROWAWAY_DIR"
  as_postgres "$PG_BIN/initdb" -D "$PG_DATA" -A trust -U postgres >/dev/null
  as_postgres "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$PG_DATA/server.log" -w \
    -o "-p $port -k $PG_DATA -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
    start >/dev/null
  export DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres"
  log "started a throwaway PostgreSQL at $DATABASE_URL"
}
