"""Personas for tenant-isolation tests (STYLE item 4), on the reference configuration:

- ``alice`` (tenant admin) and ``bob`` (viewer) belong to tenant A, ``acme``;
- ``carol`` (tenant admin) belongs to tenant B, ``globex``, and must see nothing of A (and
  alice nothing of B);
- ``staff`` is a superuser (platform staff) and sees everything.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from common import redis as gateway_redis
from configfile.apply import config_load
from gateway.models import Batch, BatchFile, Generation, Job
from quotas.models import Bucket
from tenants.identity import Principal
from tenants.models import ApiKey, App, Team, Tenant, TenantMembership
from tenants.scoping import membership_grant

REFERENCE = Path(__file__).resolve().parents[1] / "config" / "switchyard.yaml"
# Secrets of the reference file's keys.
ACME_KEY = "sk-sy-test-acme-web-0001"
GLOBEX_KEY = "sk-sy-test-globex-0001"


def redis_prefix_scope(settings: Any) -> Iterator[str]:
    """A Redis key prefix of one test alone; its keys are deleted afterwards."""
    prefix = f"sy-test-personas-{uuid.uuid4().hex[:12]}"
    settings.REDIS_PREFIX = prefix
    yield prefix
    client = gateway_redis.sync_client()
    for name in client.scan_iter(match=f"{prefix}:*"):
        client.delete(name)


@dataclass
class Personas:
    acme: Tenant
    globex: Tenant
    alice: User
    bob: User
    carol: User
    staff: User

    def client(self, user: User) -> Client:
        client = Client()
        client.force_login(user)
        return client


def personas_create() -> Personas:
    """Load the reference configuration and create the four users."""
    config_load(REFERENCE, env={"ALPHA_API_KEY": "alpha-credential"})
    acme, globex = Tenant.objects.get(name="acme"), Tenant.objects.get(name="globex")
    # No passwords: tests sign in with force_login, and hashing one costs a quarter second.
    users = {name: User.objects.create_user(name) for name in ("alice", "bob", "carol")}
    membership_grant(user=users["alice"], tenant=acme, role=TenantMembership.Role.ADMIN)
    membership_grant(user=users["bob"], tenant=acme, role=TenantMembership.Role.VIEWER)
    membership_grant(user=users["carol"], tenant=globex, role=TenantMembership.Role.ADMIN)
    staff = User.objects.create_superuser("staff", email=None, password=None)
    return Personas(acme=acme, globex=globex, staff=staff, **users)


def generation_create(tenant: Tenant, n: int, **fields: Any) -> Generation:
    """A ledger row of ``tenant``, ``n`` minutes after a fixed start (larger n is newer)."""
    app = App.objects.filter(team__tenant=tenant).first()
    values: dict[str, Any] = {
        "id": f"gen-{tenant.name}-{n:04d}",
        "created_at": datetime(2030, 1, 1, tzinfo=UTC) + timedelta(minutes=n),
        "tenant_id": tenant.pk,
        "app_id": app.pk if app else None,
        "model": "acme/chat-large",
        "provider": "alpha",
        "upstream_model": "chat-large",
        "status": 200,
        "input_tokens": 100 + n,
        "output_tokens": 20,
        "cached_input_tokens": 5,
        "cost": "0.00012300",
        "latency_ms": 812.4,
        "ttft_ms": 140.6,
        "finish_reason": "stop",
        "workload_class": "interactive",
    }
    values.update(fields)
    return Generation.objects.create(**values)


def job_create(tenant: Tenant, n: int, **fields: Any) -> Job:
    """A deferred job of ``tenant`` (finished, so nothing would run it)."""
    app = App.objects.filter(team__tenant=tenant).first()
    created = datetime(2030, 1, 1, tzinfo=UTC) + timedelta(minutes=n)
    values: dict[str, Any] = {
        "id": f"job-{tenant.name}-{n:04d}",
        "generation_id": f"gen-{tenant.name}-job-{n:04d}",
        "created_at": created,
        "deadline_at": created + timedelta(minutes=30),
        "tenant_id": tenant.pk,
        "app_id": app.pk if app else 0,
        "api_key_id": 0,
        "workload_class": "background",
        "model": "acme/chat-small",
        "request": {"model": "acme/chat-small", "messages": []},
        "status": Job.Status.SUCCEEDED,
        "finished_at": created,
    }
    values.update(fields)
    return Job.objects.create(**values)


def batch_create(tenant: Tenant, n: int) -> Batch:
    """A batch of ``tenant`` with its input file (cancelled, so nothing would run it)."""
    app = App.objects.filter(team__tenant=tenant).first()
    created = datetime(2030, 1, 1, tzinfo=UTC) + timedelta(minutes=n)
    file = BatchFile.objects.create(
        id=f"file-{tenant.name}{n:04d}",
        created_at=created,
        tenant_id=tenant.pk,
        app_id=app.pk if app else 0,
        purpose=BatchFile.Purpose.BATCH,
        filename=f"{tenant.name}-{n}.jsonl",
        content=b"{}\n",
    )
    return Batch.objects.create(
        id=f"batch_{tenant.name}{n:04d}",
        created_at=created,
        tenant_id=tenant.pk,
        app_id=app.pk if app else 0,
        api_key_id=0,
        endpoint="/v1/chat/completions",
        input_file=file,
        expires_at=created + timedelta(hours=24),
        status=Batch.Status.CANCELLED,
    )


def owner_of(obj: Any) -> int | None:
    """The tenant id an object belongs to, or None for platform objects (derived independently
    of the code under test)."""
    if isinstance(obj, Tenant):
        return int(obj.pk)
    if isinstance(obj, Team):
        return obj.tenant_id
    if isinstance(obj, App):
        return obj.team.tenant_id
    if isinstance(obj, ApiKey):
        return obj.app.team.tenant_id
    if isinstance(obj, Generation | Job | TenantMembership | Batch | BatchFile):
        return int(obj.tenant_id)
    if isinstance(obj, Bucket):
        scope = obj.scope_object()
        return owner_of(scope) if obj.scope_kind in ("tenant", "team", "app", "api_key") else None
    return None


def admin_url(model: Any, view: str, *args: object) -> str:
    """The admin page ``view`` ('changelist', 'add', 'change', …) of ``model``."""
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


def field_errors(answer: Any, field: str) -> str:
    """The admin form's errors on ``field`` after a POST the admin refused (200, not saved)."""
    assert answer.status_code == 200, "saved"
    errors = answer.context["adminform"].form.errors
    assert field in errors, errors
    return " ".join(errors[field])


# acme's web key as the snapshot resolves it, for tests that need a caller without the database
# (``dataclasses.replace`` it for another app, team or tenant).
ACME_WEB = Principal(
    key_id=1,
    key_name="ci",
    key_prefix="sk-sy-test-a",
    app_id=11,
    app_name="web",
    environment="production",
    team_id=5,
    team_name="search",
    tenant_id=3,
    tenant_name="acme",
    tenant_weight=1.0,
    tenant_default_sort="",
    partner_id=None,
    partner_name=None,
    workload="interactive",
    allowed_models=None,
    expires_at=None,
    revoked=False,
)
