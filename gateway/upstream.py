"""One shared HTTP client per provider and process: httpx's API over aiohttp's transport.

Transport retries stay off (SPEC F4): one logical request must not become gateway × HTTP ×
provider retries; the broker owns the retry budget.

The client keeps no cookies. It is shared by every tenant's requests to a provider, so a
cookie one answer set (a CDN's bot-management cookie, say) would ride along with another
caller's request; and httpx's jar parsed every answer for ``Set-Cookie`` through urllib's
cookie machinery (~3 % of a worker's CPU per request at 16 connections, py-spy).
"""

from __future__ import annotations

import httpx
from django.conf import settings
from httpx_aiohttp import AiohttpTransport


class _NoCookies(httpx.Cookies):
    """A jar that stays empty: answers' cookies are not read, so none is ever sent."""

    def extract_cookies(self, response: httpx.Response) -> None:
        return None


_NO_COOKIES = _NoCookies()


class UpstreamClient(httpx.AsyncClient):
    @property
    def cookies(self) -> httpx.Cookies:
        return _NO_COOKIES

    @cookies.setter
    def cookies(self, cookies: object) -> None:
        raise TypeError("the upstream client keeps no cookies")


_clients: dict[str, httpx.AsyncClient] = {}
_urls: dict[tuple[str, str], httpx.URL] = {}


def client_for(base_url: str) -> httpx.AsyncClient:
    client = _clients.get(base_url)
    if client is None or client.is_closed:
        limits = httpx.Limits(
            max_connections=settings.UPSTREAM_MAX_CONNECTIONS,
            max_keepalive_connections=settings.UPSTREAM_MAX_CONNECTIONS,
        )
        client = UpstreamClient(
            base_url=base_url,
            transport=AiohttpTransport(limits=limits, retries=0),
            timeout=httpx.Timeout(
                settings.UPSTREAM_READ_TIMEOUT,
                connect=settings.UPSTREAM_CONNECT_TIMEOUT,
                pool=settings.UPSTREAM_CONNECT_TIMEOUT,
            ),
            follow_redirects=False,
        )
        _clients[base_url] = client
    return client


def url_for(base_url: str, path: str) -> httpx.URL:
    """The absolute URL of ``path`` at a provider, joined as httpx joins it, once: httpx
    re-parses and merges a relative path with the base URL on every request (~40 µs)."""
    url = _urls.get((base_url, path))
    if url is None:
        url = _urls[base_url, path] = client_for(base_url).build_request("POST", path).url
    return url


async def clients_close() -> None:
    for client in list(_clients.values()):
        await client.aclose()
    _clients.clear()
