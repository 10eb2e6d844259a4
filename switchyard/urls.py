from django.contrib import admin
from django.urls import include, path

from gateway import api, jobs_api, responses_api, views
from ops.scrape import metrics_view

urlpatterns = [
    path("v1/chat/completions", views.chat_completions, name="chat-completions"),
    path("v1/messages", views.messages, name="messages"),
    path("v1/messages/count_tokens", views.messages_count_tokens, name="messages-count-tokens"),
    path("v1/embeddings", views.embeddings, name="embeddings"),
    path("v1/models", views.models_list, name="models-list"),
    path("v1/models/<path:model_id>", views.model_detail, name="model-detail"),
    path("v1/generation", api.GenerationDetail.as_view(), name="generation"),
    path("v1/jobs/<str:job_id>", jobs_api.JobDetail.as_view(), name="job-detail"),
    path("v1/responses", views.responses_create, name="responses"),
    path(
        "v1/responses/<str:response_id>",
        responses_api.ResponseDetail.as_view(),
        name="response-detail",
    ),
    path("v1/openapi.json", views.openapi_json, name="openapi"),
    path("ops/", include("ops.urls")),
    path("admin/", admin.site.urls),
    path("metrics", metrics_view, name="metrics"),
]

handler404 = "gateway.views.not_found"
handler500 = "gateway.views.server_error"
