"""The proxy handler remembers the view of a path that names it whole (gateway/asgi.py's
``resolve_request``): the same view as Django's resolver gives, never a remembered one for a
path with an argument in it, and none from an URLconf no longer in use."""

from __future__ import annotations

from django.http import HttpResponse
from django.test import RequestFactory
from django.urls import path

from gateway import views
from gateway.asgi import ProxyHandler


def other_view(request):
    return HttpResponse("other")


urlpatterns = [path("v1/chat/completions", other_view)]


def resolve(handler: ProxyHandler, url: str):
    request = RequestFactory().post(url)
    match = handler.resolve_request(request)
    assert request.resolver_match is match
    return match


def test_a_fixed_endpoint_resolves_to_its_view_each_time():
    handler = ProxyHandler()
    for _ in range(2):
        assert resolve(handler, "/v1/chat/completions").func is views.chat_completions
    assert resolve(handler, "/v1/embeddings").func is views.embeddings


def test_a_path_with_an_argument_is_resolved_each_time():
    handler = ProxyHandler()
    assert resolve(handler, "/v1/models/a/b").kwargs == {"model_id": "a/b"}
    assert resolve(handler, "/v1/models/c").kwargs == {"model_id": "c"}


def test_it_follows_the_urlconf_in_use(settings):
    handler = ProxyHandler()
    assert resolve(handler, "/v1/chat/completions").func is views.chat_completions
    settings.ROOT_URLCONF = __name__
    assert resolve(handler, "/v1/chat/completions").func is other_view
