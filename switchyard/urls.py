from django.contrib import admin
from django.urls import include, path

from gateway import api, batches_api, jobs_api, responses_api, views
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
    path("v1/files", batches_api.FileList.as_view(), name="files"),
    path("v1/files/<str:file_id>", batches_api.FileDetail.as_view(), name="file-detail"),
    path(
        "v1/files/<str:file_id>/content",
        batches_api.FileContent.as_view(),
        name="file-content",
    ),
    path("v1/batches", batches_api.BatchList.as_view(), name="batches"),
    path("v1/batches/<str:batch_id>", batches_api.BatchDetail.as_view(), name="batch-detail"),
    path(
        "v1/batches/<str:batch_id>/cancel",
        batches_api.BatchCancel.as_view(),
        name="batch-cancel",
    ),
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
