from django.contrib import admin
from django.urls import path

from gateway import views

urlpatterns = [
    path("v1/chat/completions", views.chat_completions, name="chat-completions"),
    path("v1/models", views.models_list, name="models-list"),
    path("admin/", admin.site.urls),
]

handler404 = "gateway.views.not_found"
handler500 = "gateway.views.server_error"
