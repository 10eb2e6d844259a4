"""Multi-tenant admin (SPEC A4): platform staff see everything, a tenant's members only theirs.

Who is who:
- a superuser is platform staff and sees everything;
- a user with a ``TenantMembership`` is a tenant member: every admin page, form choice, filter
  and autocomplete is restricted to the member's tenant, whatever Django permissions the user
  also holds (the membership, not a permission checkbox, decides);
- any other staff user is a platform operator governed by Django's model permissions.

Admin classes opt in to tenant members: an admin shows nothing to them unless it names the path
from its model to the tenant (``tenant_lookup``) or declares its rows public catalogue data, and
says what members may do there (``tenant_access``). A new admin is closed to tenants by default.
An object of another tenant is answered exactly like a missing one (404), so ids do not leak.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from django.contrib import admin
from django.contrib.admin.exceptions import NotRegistered
from django.db import models
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest

from tenants.models import Tenant, TenantMembership

_MEMBERSHIP = "_switchyard_membership"
_OWNER_CHECK = "_switchyard_owner_check"
_MISSING = object()


class Access(StrEnum):
    """What a tenant member may do with an admin's (own-tenant) objects."""

    NONE = "none"  # not shown at all
    VIEW = "view"  # read-only
    CHANGE = "change"  # change existing objects; no add, no delete
    EDIT = "edit"  # add, change and delete


def tenant_member(user: Any) -> TenantMembership | None:
    """The user's membership when pages must be scoped to one tenant; None for platform staff."""
    if not getattr(user, "is_authenticated", False) or user.is_superuser:
        return None
    cached = getattr(user, _MEMBERSHIP, _MISSING)
    if cached is _MISSING:
        cached = TenantMembership.objects.filter(user_id=user.pk).first()
        setattr(user, _MEMBERSHIP, cached)  # once per request: request.user lives one request
    return cached  # type: ignore[return-value]


def membership_grant(*, user: Any, tenant: Tenant, role: str) -> TenantMembership:
    """Make ``user`` a member of ``tenant`` who can sign in to the admin (staff, not superuser)."""
    membership, _ = TenantMembership.objects.update_or_create(
        user=user, defaults={"tenant": tenant, "role": role}
    )
    if not user.is_staff:
        user.is_staff = True
        user.save(update_fields=["is_staff"])
    return membership


def tenant_visible(user: Any, tenant: Tenant) -> bool:
    """Whether ``user`` may see ``tenant``'s ops pages: its members and platform staff."""
    if not getattr(user, "is_authenticated", False) or not user.is_active:
        return False
    member = tenant_member(user)
    if member is not None:
        return member.tenant_id == tenant.pk
    return bool(user.is_superuser or user.has_perm("tenants.view_tenant"))


def tenant_get_visible(*, user: Any, name: str) -> Tenant:
    """The tenant called ``name`` if ``user`` may see it, else 404 as if it did not exist."""
    tenant = Tenant.objects.filter(name=name).first()
    if tenant is None or not tenant_visible(user, tenant):
        raise Http404("No such tenant.")
    return tenant


def tenant_choices(
    site: admin.AdminSite, request: HttpRequest, model: type[models.Model]
) -> QuerySet[Any]:
    """The objects of ``model`` a tenant member may pick in a form: their own, or the catalogue."""
    member = tenant_member(request.user)
    manager = model._default_manager
    if member is None:
        return manager.all()
    try:
        related_admin = site.get_model_admin(model)
    except NotRegistered:
        return manager.none()
    if not isinstance(related_admin, TenantScopedAdmin):
        return manager.none()
    if related_admin.tenant_access == Access.NONE:
        return manager.none()
    queryset = manager.filter(related_admin.tenant_filter(member.tenant_id))
    ordering = related_admin.get_ordering(request)
    return queryset.order_by(*ordering) if ordering else queryset


class TenantScopedAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """A ModelAdmin that tenant members see only through their tenant (see the module doc)."""

    # ORM path from this model to its tenant's id: "tenant_id", "team__tenant_id", "pk" (Tenant).
    tenant_lookup: str | None = None
    # Rows are public reference data (models, endpoints, prices): members see all of them.
    catalogue = False
    tenant_access = Access.NONE
    # Never shown to members (forms, lists, filters), and shown to them read-only.
    tenant_hidden_fields: tuple[str, ...] = ()
    tenant_readonly_fields: tuple[str, ...] = ()

    def tenant_filter(self, tenant_id: int) -> Q:
        """The rows of this admin's model that belong to tenant ``tenant_id``."""
        if self.catalogue:
            return Q()
        if self.tenant_lookup is None:
            return Q(pk__in=[])
        return Q(**{self.tenant_lookup: tenant_id})

    def tenant_editable(self, obj: Any) -> bool:
        """Whether a member with edit rights may change this own-tenant object (hook)."""
        return True

    # --- rows ---------------------------------------------------------------------------------
    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        queryset = super().get_queryset(request)
        member = tenant_member(request.user)
        if member is None:
            return queryset
        return queryset.filter(self.tenant_filter(member.tenant_id))

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Any:
        obj = super().get_object(request, object_id, from_field)
        if obj is None and tenant_member(request.user) is not None:
            # Another tenant's object and a missing one get the same plain 404.
            raise Http404("No such object.")
        return obj

    def _owns(self, member: TenantMembership, obj: Any) -> bool:
        if obj is None or self.catalogue:
            return True
        # Permission checks ask about the same object many times per page: one query per object.
        memo = obj.__dict__.get(_OWNER_CHECK)
        if memo is None:
            memo = (
                member.tenant_id,
                self.model._default_manager.filter(
                    self.tenant_filter(member.tenant_id), pk=obj.pk
                ).exists(),
            )
            obj.__dict__[_OWNER_CHECK] = memo
        return bool(memo[0] == member.tenant_id and memo[1])

    # --- permissions --------------------------------------------------------------------------
    def has_module_permission(self, request: HttpRequest) -> bool:
        member = tenant_member(request.user)
        if member is None:
            return bool(super().has_module_permission(request))
        return self.tenant_access != Access.NONE

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        member = tenant_member(request.user)
        if member is None:
            return bool(super().has_view_permission(request, obj))
        return self.tenant_access != Access.NONE and self._owns(member, obj)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        member = tenant_member(request.user)
        if member is None:
            return bool(super().has_change_permission(request, obj))
        return (
            self.tenant_access in (Access.CHANGE, Access.EDIT)
            and member.can_edit
            and self._owns(member, obj)
            and (obj is None or self.tenant_editable(obj))
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        member = tenant_member(request.user)
        if member is None:
            return bool(super().has_add_permission(request))
        return self.tenant_access == Access.EDIT and member.can_edit

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        member = tenant_member(request.user)
        if member is None:
            return bool(super().has_delete_permission(request, obj))
        return (
            self.tenant_access == Access.EDIT
            and member.can_edit
            and self._owns(member, obj)
            and (obj is None or self.tenant_editable(obj))
        )

    # --- what members see of the forms and lists ----------------------------------------------
    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if tenant_member(request.user) is not None and "queryset" not in kwargs:
            kwargs["queryset"] = tenant_choices(self.admin_site, request, db_field.related_model)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = list(super().get_readonly_fields(request, obj))
        if tenant_member(request.user) is None:
            return fields
        return fields + [f for f in self.tenant_readonly_fields if f not in fields]

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        initial: dict[str, Any] = super().get_changeform_initial_data(request)
        member = tenant_member(request.user)
        tenant_fields = [f for f in self.model._meta.fields if f.related_model is Tenant]
        if member is not None and tenant_fields:  # their only choice, chosen for them
            initial.setdefault(tenant_fields[0].name, member.tenant_id)
        return initial

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self._visible(request, super().get_fields(request, obj))

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if tenant_member(request.user) is None or not self.tenant_hidden_fields:
            return fieldsets
        return [
            (name, {**options, "fields": self._visible(request, options["fields"])})
            for name, options in fieldsets
        ]

    def get_list_display(self, request: HttpRequest) -> Any:
        return self._visible(request, super().get_list_display(request))

    def get_list_filter(self, request: HttpRequest) -> Any:
        filters = super().get_list_filter(request)
        if tenant_member(request.user) is None:
            return filters
        return [f for f in filters if _filter_field(f) not in self.tenant_hidden_fields]

    def _visible(self, request: HttpRequest, names: Any) -> Any:
        if tenant_member(request.user) is None or not self.tenant_hidden_fields:
            return names
        return [name for name in names if name not in self.tenant_hidden_fields]


def _filter_field(entry: Any) -> str:
    if isinstance(entry, str):
        return entry.split("__")[0]
    if isinstance(entry, tuple | list):
        return str(entry[0]).split("__")[0]
    return ""


class TenantScopedInline(admin.options.InlineModelAdmin):  # type: ignore[type-arg]
    """An inline on a scoped admin's page: the parent is already the member's own object."""

    tenant_access = Access.NONE
    tenant_readonly_fields: tuple[str, ...] = ()

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        member = tenant_member(request.user)
        if member is None:
            return bool(super().has_view_permission(request, obj))
        return self.tenant_access != Access.NONE

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        member = tenant_member(request.user)
        if member is None:
            return bool(super().has_change_permission(request, obj))
        return self.tenant_access in (Access.CHANGE, Access.EDIT) and member.can_edit

    def has_add_permission(self, request: HttpRequest, obj: Any) -> bool:
        member = tenant_member(request.user)
        if member is None:
            return bool(super().has_add_permission(request, obj))
        return self.tenant_access == Access.EDIT and member.can_edit

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        member = tenant_member(request.user)
        if member is None:
            return bool(super().has_delete_permission(request, obj))
        return self.tenant_access == Access.EDIT and member.can_edit

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if tenant_member(request.user) is not None and "queryset" not in kwargs:
            kwargs["queryset"] = tenant_choices(self.admin_site, request, db_field.related_model)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = list(super().get_readonly_fields(request, obj))
        if tenant_member(request.user) is None:
            return fields
        return fields + [f for f in self.tenant_readonly_fields if f not in fields]
