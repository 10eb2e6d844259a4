from django.contrib import admin
from django.urls import path

from ops import views

app_name = "ops"

urlpatterns = [
    path(
        "tenants/<slug:tenant>/activity/",
        admin.site.admin_view(views.tenant_activity),
        name="tenant-activity",
    ),
    path(
        "tenants/<slug:tenant>/saturation/",
        admin.site.admin_view(views.tenant_saturation),
        name="tenant-saturation",
    ),
]
