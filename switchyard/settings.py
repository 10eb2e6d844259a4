"""Switchyard settings: one flat module, everything from the environment.

Every value has a safe default for the embedded demo (SQLite file, local Redis). The typed
helpers below fail loudly on a malformed value instead of silently falling back.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent


class SettingError(ValueError):
    pass


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise SettingError(f"{name} must be an integer, got {raw!r}") from None


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise SettingError(f"{name} must be a number, got {raw!r}") from None


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in {"1", "true", "yes", "on"}:
        return True
    if raw.lower() in {"0", "false", "no", "off"}:
        return False
    raise SettingError(f"{name} must be a boolean (1/0, true/false), got {raw!r}")


def env_json(name: str, default: dict[str, Any]) -> dict[str, Any]:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = json.loads(raw)
    except ValueError:
        raise SettingError(f"{name} must be a JSON object, got {raw!r}") from None
    if not isinstance(value, dict):
        raise SettingError(f"{name} must be a JSON object, got {raw!r}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


DEBUG = env_bool("DEBUG", False)
# The demo runs without configuration; production sets SECRET_KEY (it also derives the key that
# encrypts provider credentials, see routing/credentials.py).
SECRET_KEY = env_str("SECRET_KEY", "switchyard-insecure-demo-key-change-me")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
# Behind a proxy that terminates TLS, uvicorn takes the scheme (and so Django's is_secure) from
# X-Forwarded-Proto of the proxies FORWARDED_ALLOW_IPS names; these keep the admin's session and
# CSRF cookies off plain HTTP (README "Behind a reverse proxy").
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_bool("SECURE_COOKIES", False)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "tenants",
    "routing",
    "quotas",
    "gateway",
    "configfile",
    "simulator",
]

# These run for the admin and the ops pages only. The proxy API (/v1/) is served by a
# middleware-free handler (gateway/asgi.py): Django's MiddlewareMixin hops to a thread for
# every middleware in async mode, which would cost the hot path more than the whole proxy.
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "switchyard.urls"
ASGI_APPLICATION = "switchyard.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{BASE_DIR / 'var' / 'switchyard.sqlite3'}"),
        conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 60),
        # A kept connection is tried before its first query of a request, so a database
        # restart costs no failed request (common/db.py).
        conn_health_checks=True,
    )
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
# Every Redis key of this deployment starts with this, so tests and demos can share a server.
REDIS_PREFIX = env_str("REDIS_PREFIX", "sy")
# Connections per gateway process; beyond them a request waits up to the pool timeout (s).
REDIS_MAX_CONNECTIONS = env_int("REDIS_MAX_CONNECTIONS", 200)
REDIS_POOL_TIMEOUT = env_float("REDIS_POOL_TIMEOUT", 5.0)

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": f"{REDIS_PREFIX}:cache",
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
    }
}

# The Celery app, loaded by name where work is handed to it (common/background.py).
BACKGROUND_APP = "switchyard.celery.app"
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = f"{REDIS_PREFIX}-celery"
# Periodic work: flush the usage ledger from Redis into the database.
LEDGER_FLUSH_INTERVAL = env_float("LEDGER_FLUSH_INTERVAL", 1.0)
# How long a gateway process gathers ledger records before appending them in one call.
LEDGER_BATCH_SECONDS = env_float("LEDGER_BATCH_SECONDS", 0.05)
# An answer waits until its ledger records are in Redis (group commit; gateway/ledger.py).
LEDGER_COMMIT = env_bool("LEDGER_COMMIT", True)
# How long a gateway process keeps the records it appended, to append them again should Redis
# restart empty before the flush stored them (they are stored by id: a record twice is one row).
LEDGER_RETAIN_SECONDS = env_float("LEDGER_RETAIN_SECONDS", 15.0)
LEASE_REAP_INTERVAL = env_float("LEASE_REAP_INTERVAL", 5.0)
# Deferred jobs (gateway/jobs.py, job_runner.py): one run waits in the fair queue this long (s)
# before the job goes back in line; a worker process holds this many runs at once, a tenant at
# most this share of them; a run's lease, renewed while it runs, outlives a dead worker by at
# most this long; the resume task looks for lost runs and lost task messages this often.
JOB_TRY_SECONDS = env_float("JOB_TRY_SECONDS", 600.0)
JOB_CONCURRENCY = env_int("JOB_CONCURRENCY", 200)
JOB_TENANT_SHARE = env_float("JOB_TENANT_SHARE", 0.25)
JOB_LEASE_SECONDS = env_float("JOB_LEASE_SECONDS", 30.0)  # renewed every third of it
JOB_RESUME_INTERVAL = env_float("JOB_RESUME_INTERVAL", 10.0)
# A finished job (its request and answer) is deleted this long after it finished (s).
JOB_RETENTION_SECONDS = env_float("JOB_RETENTION_SECONDS", 7 * 86400.0)
# The Batch API (E5: gateway/batches.py, batch_runner.py). A batch file holds at most this many
# bytes (and the proxy reads no body over MAX_REQUEST_BODY_BYTES) and requests; its lines run as
# jobs of this workload class (the scavenger: lowest weight), at most BATCH_CONCURRENCY at once
# per worker process — fewer, down to one, while its lines find the fair queue contended
# (their queue wait over BATCH_IDLE_WAIT_SECONDS, or a bucket left under BATCH_HEADROOM of its
# capacity after their grant): batch work takes the capacity interactive traffic leaves idle.
# A batch's driver looks at it every BATCH_POLL_SECONDS when nothing ends.
BATCH_FILE_MAX_BYTES = env_int("BATCH_FILE_MAX_BYTES", 10 * 1024 * 1024)
BATCH_MAX_LINES = env_int("BATCH_MAX_LINES", 50_000)
BATCH_WORKLOAD = env_str("BATCH_WORKLOAD", "batch")
BATCH_CONCURRENCY = env_int("BATCH_CONCURRENCY", 8)
BATCH_IDLE_WAIT_SECONDS = env_float("BATCH_IDLE_WAIT_SECONDS", 0.05)
BATCH_HEADROOM = env_float("BATCH_HEADROOM", 0.25)
BATCH_POLL_SECONDS = env_float("BATCH_POLL_SECONDS", 0.5)
# E5: a batch sent to a provider's own batch API is looked at every PROVIDER_BATCH_POLL_SECONDS
# (gateway/provider_batches.py); a provider batch takes minutes to hours.
PROVIDER_BATCH_POLL_SECONDS = env_float("PROVIDER_BATCH_POLL_SECONDS", 10.0)
# A stored Responses answer (``store``) is deleted this long after it was made (s): OpenAI keeps
# them 30 days. Old ones are looked for this often (s).
RESPONSE_RETENTION_SECONDS = env_float("RESPONSE_RETENTION_SECONDS", 30 * 86400.0)
RESPONSE_FORGET_INTERVAL = env_float("RESPONSE_FORGET_INTERVAL", 60.0)
# How long a stored response is also kept in Redis, readable at once while the ledger stores
# its row (within about a second; this covers a ledger worker a minute behind).
RESPONSE_HOT_SECONDS = env_float("RESPONSE_HOT_SECONDS", 60.0)
CELERY_BEAT_SCHEDULE = {
    "ledger-flush": {"task": "gateway.tasks.ledger_flush", "schedule": LEDGER_FLUSH_INTERVAL},
    "lease-reap": {"task": "quotas.tasks.lease_reap", "schedule": LEASE_REAP_INTERVAL},
    "jobs-resume": {"task": "gateway.tasks.jobs_resume", "schedule": JOB_RESUME_INTERVAL},
    "batches-resume": {"task": "gateway.tasks.batches_resume", "schedule": JOB_RESUME_INTERVAL},
    "responses-forget": {
        "task": "gateway.tasks.responses_forget",
        "schedule": RESPONSE_FORGET_INTERVAL,
    },
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
# Filled by ``manage.py collectstatic`` (scripts/demo and scripts/test run it) and served from
# there by gateway/asgi.py. Names carry a hash of the content, so browsers keep a file for good
# (immutable); a gzip copy sits beside each. A page naming a file never collected is an error.
STATIC_ROOT = BASE_DIR / "var" / "static"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "servestatic.storage.CompressedManifestStaticFilesStorage"},
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["gateway.authentication.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "EXCEPTION_HANDLER": "gateway.errors.drf_exception_handler",
    "UNAUTHENTICATED_USER": None,
    # ?format= is not ours to interpret: it made /v1/generation?…&format=api answer 404.
    "URL_FORMAT_OVERRIDE": None,
}

# --- The proxy ---------------------------------------------------------------------------------
# Largest request body the proxy reads; larger bodies get 413 without being buffered.
MAX_REQUEST_BODY_BYTES = env_int("MAX_REQUEST_BODY_BYTES", 10 * 1024 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = MAX_REQUEST_BODY_BYTES
# Upstream timeouts (seconds): connecting, and waiting for the next bytes of an answer.
UPSTREAM_CONNECT_TIMEOUT = env_float("UPSTREAM_CONNECT_TIMEOUT", 5.0)
UPSTREAM_READ_TIMEOUT = env_float("UPSTREAM_READ_TIMEOUT", 120.0)
UPSTREAM_MAX_CONNECTIONS = env_int("UPSTREAM_MAX_CONNECTIONS", 512)
# Reservations are leases (C9): an abandoned one gives its concurrency back after this long;
# long requests and streams renew theirs every third of it.
RESERVATION_LEASE_SECONDS = env_float("RESERVATION_LEASE_SECONDS", 30.0)
# Allowances (quotas/allowances.py): while every bucket of a request's set has plenty left, a
# process reserves for up to this many requests at once and grants them without a Redis call
# each (a third more requests a second at 16 connections, bench/results/redis.md). 64, not 32:
# at a few requests a second a set's allowance ends at its age before it is spent, so fewer
# takes and reconciles; more is held at once (still a tenth of any bucket at most), not
# longer. 0: every request reserves on its own.
BROKER_ALLOWANCE_REQUESTS = env_int("BROKER_ALLOWANCE_REQUESTS", 64)
# --- The router ---------------------------------------------------------------------------
# routing_cost (the default) or price_only (the old behaviour, for switchback experiments).
ROUTING_STRATEGY = env_str("ROUTING_STRATEGY", "routing_cost")
# Deployment-wide overrides of routing/core/parameters.py as JSON, beneath each model's own
# (tests shorten half-lives here): e.g. ROUTING_PARAMETERS='{"fast_half_life_s": 5}'.
ROUTING_PARAMETERS = env_json("ROUTING_PARAMETERS", {})
# How often each process merges its live endpoint statistics with the other processes' (s).
ROUTING_SYNC_INTERVAL = env_float("ROUTING_SYNC_INTERVAL", 1.0)
# Provider refill buckets are counted short by what refills in this many seconds: the spread
# of dispatch delays between our grant and the provider's count (quotas/snapshot.py).
PROVIDER_HEADROOM_SECONDS = env_float("PROVIDER_HEADROOM_SECONDS", 1.0)
# A provider account with no configured concurrency limit learns one from the 429s no known
# limit explains (quotas/core/learned.py); each provider may opt out (learn_concurrency).
LEARN_PROVIDER_CONCURRENCY = env_bool("LEARN_PROVIDER_CONCURRENCY", True)
# E3: how long an Idempotency-Key is remembered after its first request (seconds).
IDEMPOTENCY_TTL_SECONDS = env_int("IDEMPOTENCY_TTL_SECONDS", 24 * 3600)
# A2: how long a rotated API key's old secret keeps working beside the new one (seconds).
KEY_ROTATION_OVERLAP_SECONDS = env_float("KEY_ROTATION_OVERLAP_SECONDS", 24 * 3600)
# How often each process checks the configuration version in Redis (seconds).
CONFIG_POLL_INTERVAL = env_float("CONFIG_POLL_INTERVAL", 0.5)
# Bearer tokens a Prometheus server sends for /metrics (comma-separated, so one can be rotated
# in before the old one goes); empty: staff sessions only.
METRICS_TOKENS = [t.strip() for t in os.environ.get("METRICS_TOKEN", "").split(",") if t.strip()]
# Each check of /readyz gives up after this long (seconds).
PROBE_TIMEOUT = env_float("PROBE_TIMEOUT", 1.0)


def _client_error_without_traceback(record: Any) -> bool:  # a logging.LogRecord
    """A 4xx logged by ``django.request`` (every admin 403 carries its PermissionDenied) is
    one line: its traceback would bury the real errors. 5xx keep theirs."""
    if getattr(record, "status_code", 500) < 500:
        record.exc_info, record.exc_text = None, None
    return True


LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "client_error_without_traceback": {
            "()": "django.utils.log.CallbackFilter",
            "callback": _client_error_without_traceback,
        }
    },
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django.request": {"filters": ["client_error_without_traceback"]}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "WARNING")},
}
