"""One shared connection pool per provider and process (aiohttp), and two ways to use it.

- ``session_for``: aiohttp itself, for every completion and embedding
  (``dispatch.attempt_send``; a streamed answer's body is read as an ``UpstreamStream``).
  Through httpx's models the same call cost ~200 µs of the worker's CPU against ~70 µs
  (``bench/upstream_client.py``): its Request and Response objects, header models and send
  machinery, on top of aiohttp's own.
- ``client_for``: httpx's API over the same pool (``AiohttpTransport``), for the provider
  batch API.

Transport retries stay off (SPEC F4): one logical request must not become gateway × HTTP ×
provider retries; the broker owns the retry budget.

A provider is reached through the egress proxy the environment names for it (``HTTPS_PROXY``
/ ``HTTP_PROXY``, unless ``NO_PROXY`` lists its host), read once per provider and process
(``proxy_for``): aiohttp's own ``trust_env`` reads the environment on every request.

The pool keeps no cookies. It is shared by every tenant's requests to a provider, so a
cookie one answer set (a CDN's bot-management cookie, say) would ride along with another
caller's request; and httpx's jar parsed every answer for ``Set-Cookie`` through urllib's
cookie machinery (~3 % of a worker's CPU per request at 16 connections, py-spy).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import httpx
from aiohttp.helpers import get_env_proxy_for_url
from django.conf import settings
from httpx_aiohttp import AiohttpTransport
from yarl import URL


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


class UpstreamStream:
    """A streamed answer's body as ``gateway.streaming`` reads it: each network read as it
    comes, and closed early when the relay stops (a client gone, a stream cut)."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response

    def aiter_bytes(self) -> AsyncIterator[bytes]:
        return self.response.content.iter_any()

    async def aclose(self) -> None:
        """Back to the pool when read to its end; otherwise the connection is closed, which
        is how the provider learns to stop generating."""
        if self.response.content.at_eof():
            self.response.release()
        else:
            self.response.close()


class _PoolTransport(AiohttpTransport):
    """httpx over the provider's shared session (``session_for``), whichever loop runs."""

    def __init__(self, base_url: str) -> None:
        super().__init__(retries=0)
        self.base_url = base_url

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.client = session_for(self.base_url)
        proxy = proxy_for(self.base_url)
        self.proxy = None if proxy.url is None else httpx.Proxy(str(proxy.url))
        return await super().handle_async_request(request)

    async def aclose(self) -> None:
        return None  # the session is the pool's, closed by clients_close


@dataclass(frozen=True)
class EgressProxy:
    """A provider's egress proxy and its credentials, or none (``url`` None)."""

    url: URL | None = None
    auth: aiohttp.BasicAuth | None = None


_sessions: dict[str, aiohttp.ClientSession] = {}
_proxies: dict[str, EgressProxy] = {}
_clients: dict[str, httpx.AsyncClient] = {}
_urls: dict[tuple[str, str], tuple[httpx.URL, URL]] = {}


def timeout() -> aiohttp.ClientTimeout:
    """The read timeout between two reads of an answer, the connect timeout for a new
    connection, and the same again for a free connection of the pool (httpx's ``pool``)."""
    return aiohttp.ClientTimeout(
        total=None,
        sock_read=settings.UPSTREAM_READ_TIMEOUT,
        sock_connect=settings.UPSTREAM_CONNECT_TIMEOUT,
        connect=settings.UPSTREAM_CONNECT_TIMEOUT,
    )


def session_for(base_url: str) -> aiohttp.ClientSession:
    """The provider's pool for this process's loop (a test's next ``asyncio.run`` gets one of
    its own: a session belongs to the loop it was made in)."""
    session = _sessions.get(base_url)
    if session is None or session.closed or session._loop is not asyncio.get_running_loop():
        connector = aiohttp.TCPConnector(
            limit=settings.UPSTREAM_MAX_CONNECTIONS,
            limit_per_host=0,
            keepalive_timeout=5.0,  # httpx's keep-alive expiry, as before
        )
        session = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=timeout(),
            auto_decompress=True,
        )
        _sessions[base_url] = session
    return session


def proxy_for(base_url: str) -> EgressProxy:
    """The egress proxy for a provider, as the environment names it when first asked: none
    when it names none, when ``NO_PROXY`` lists the provider's host, or for a provider on this
    machine's loopback (a local simulator or sidecar is never behind the egress proxy, whatever
    ``NO_PROXY`` forgot)."""
    proxy = _proxies.get(base_url)
    if proxy is None:
        url = URL(base_url)
        proxy = EgressProxy()
        if not _loopback(url.host or ""):
            with contextlib.suppress(LookupError):
                proxy = EgressProxy(*get_env_proxy_for_url(url))
        _proxies[base_url] = proxy
    return proxy


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def client_for(base_url: str) -> httpx.AsyncClient:
    client = _clients.get(base_url)
    if client is None or client.is_closed:
        client = UpstreamClient(
            base_url=base_url,
            transport=_PoolTransport(base_url),
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
    return _joined(base_url, path)[0]


def session_url(base_url: str, path: str) -> URL:
    """``url_for``'s URL as aiohttp takes it without parsing it again (``yarl.URL``)."""
    return _joined(base_url, path)[1]


def _joined(base_url: str, path: str) -> tuple[httpx.URL, URL]:
    urls = _urls.get((base_url, path))
    if urls is None:
        url = client_for(base_url).build_request("POST", path).url
        urls = _urls[base_url, path] = (url, URL(str(url), encoded=True))
    return urls


async def clients_close() -> None:
    for client in list(_clients.values()):
        await client.aclose()
    _clients.clear()
    for session in list(_sessions.values()):
        if not session.closed and session._loop is asyncio.get_running_loop():
            await session.close()
    _sessions.clear()
    _proxies.clear()
