"""The one door to the Kubernetes API: configuration, raw requests, error classification.

kubernetes_asyncio does the configuration (kubeconfig or in-cluster service account), TLS, auth
(token refresh, exec plugins) and owns the aiohttp session. The bridge then sends every request
through `ApiClient.call_api(..., _preload_content=False)` and reads the JSON itself: pods stay plain
dicts (no V1Pod models: deserializing 10,000 of them is slow and heavy), and streams (watch, logs)
are read chunk by chunk.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.config import ConfigException, load_incluster_config, load_kube_config
from yarl import URL

import bridge
from bridge.clients.kube.errors import KubeConfigError, error_for_status
from bridge.clients.kube.lines import LineSplitter
from bridge.core import json_text
from bridge.core.errors import KubeUnavailable

REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=30, connect=10)
"""Ordinary (non-streaming) requests: the API server answers these in milliseconds when healthy."""

_TRUST_ERRORS = (aiohttp.ClientConnectorCertificateError, aiohttp.ServerFingerprintMismatch)
"""Transport errors that retrying cannot fix: the server's certificate is not the one we trust."""

_TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError, OSError)

REQUESTS_SENT: Counter[str] = Counter()
"""Requests this process sent to API servers, by HTTP verb, watches, log streams and exec upgrades
included. Process-wide, like the process' CPU time: every request goes through `request`."""


async def make_api_client(
    kubeconfig: str | None, *, context: str | None = None, max_connections: int = 256
) -> ApiClient:
    """An ApiClient for the kubeconfig file `kubeconfig`, or for the in-cluster service account if None.

    The configuration is private to the returned client (the library's global default is not
    touched). `max_connections` caps concurrent HTTP connections: every followed log stream and the
    watch hold one for as long as they run. The caller closes the client (`await client.close()`).
    """
    config = Configuration()
    try:
        if kubeconfig is None:
            load_incluster_config(client_configuration=config)
        else:
            await load_kube_config(config_file=kubeconfig, context=context, client_configuration=config)
    except (ConfigException, OSError, ValueError) as error:
        source = kubeconfig or "the in-cluster service account (KUBERNETES_SERVICE_HOST, token, ca.crt)"
        raise KubeConfigError(f"cannot load Kubernetes configuration from {source}: {error}") from error
    config.connection_pool_maxsize = max_connections
    _settle_proxy(config)
    client = ApiClient(configuration=config)
    client.user_agent = f"slurm-k8s-bridge/{bridge.__version__}"
    without_environment_lookups(client)
    return client


def _settle_proxy(config: Configuration) -> None:
    """The proxy of HTTPS_PROXY/NO_PROXY (and ~/.netrc's login for it) for the API server, looked
    up once here, where kubernetes_asyncio's session looked it up before every request. (A changed
    proxy or login then needs a restart, as any other setting does.)"""
    if config.proxy:
        return  # the kubeconfig's proxy-url decides
    try:
        proxy, proxy_auth = get_env_proxy_for_url(URL(config.host or ""))
    except LookupError:
        return  # none, or NO_PROXY names the API server
    config.proxy = str(proxy)
    if proxy_auth is not None:
        # A header of the CONNECT (API servers speak only TLS), never part of the URL: aiohttp
        # prints the proxy's URL in its errors, which the daemon logs.
        config.proxy_headers = {**(config.proxy_headers or {}), "Proxy-Authorization": proxy_auth.encode()}


def without_environment_lookups(client: ApiClient) -> None:
    """kubernetes_asyncio's session trusts the environment: each request then reads ~/.netrc and
    the proxy variables in a worker thread, twice (~5 % of the daemon's CPU under load), and a
    netrc login for the API server's host clashes with the bearer token (aiohttp refuses the
    request). The proxy is settled (_settle_proxy), so the session is replaced by one on the same
    connector that does not look."""
    rest = client.rest_client
    trusting = rest.pool_manager
    connector = trusting.connector
    trusting.detach()  # closed without closing the connector, which the new session now owns
    # The library's read buffer: a watch event of a large object can exceed aiohttp's default.
    rest.pool_manager = aiohttp.ClientSession(connector=connector, trust_env=False, read_bufsize=2**21)


async def request(
    api: ApiClient,
    method: str,
    path: str,
    what: str,
    *,
    query: Mapping[str, str | int] | None = None,
    body: Any = None,
    timeout: aiohttp.ClientTimeout = REQUEST_TIMEOUT,
    content_type: str | None = None,
    accept: str = "application/json, */*",
) -> aiohttp.ClientResponse:
    """Send one request; return the open response if it is 2xx, else raise the classified error.

    `what` describes the request for error messages ("create pods in namespace slurm"). The caller
    must release the returned response (`async with response:` or `response.release()`).
    `content_type` is for PATCH bodies (application/merge-patch+json, ...); `accept` may ask for
    another form of the answer (a metadata-only list).
    """
    headers = {"Accept": accept}
    if content_type:
        headers["Content-Type"] = content_type
    REQUESTS_SENT[method] += 1
    try:
        response: aiohttp.ClientResponse = await api.call_api(
            path,
            method,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=timeout,
        )
    except _TRUST_ERRORS as error:
        raise KubeConfigError(
            f"cannot {what}: the API server's TLS certificate is not trusted: {error}"
        ) from error
    except _TRANSPORT_ERRORS as error:
        raise KubeUnavailable(f"cannot {what}: {type(error).__name__}: {error}") from error
    if 200 <= response.status < 300:
        return response
    async with response:
        try:
            error_body = await response.read()
        except _TRANSPORT_ERRORS:
            error_body = b""
    raise error_for_status(response.status, error_body, what)


async def request_json(
    api: ApiClient,
    method: str,
    path: str,
    what: str,
    *,
    query: Mapping[str, str | int] | None = None,
    body: Any = None,
    timeout: aiohttp.ClientTimeout = REQUEST_TIMEOUT,
    content_type: str | None = None,
    accept: str = "application/json, */*",
) -> dict[str, Any]:
    """`request`, then read and parse the JSON body."""
    response = await request(
        api, method, path, what, query=query, body=body, timeout=timeout, content_type=content_type,
        accept=accept,
    )
    async with response:
        try:
            raw = await response.read()
        except _TRANSPORT_ERRORS as error:
            raise KubeUnavailable(f"cannot {what}: reading the answer: {error}") from error
    try:
        parsed = json_text.loads(raw)
    except ValueError as error:
        raise KubeUnavailable(f"cannot {what}: the answer is not JSON: {raw[:200]!r}") from error
    return parsed if isinstance(parsed, dict) else {}


async def iter_lines(response: aiohttp.ClientResponse, what: str) -> AsyncGenerator[bytes, None]:
    """The lines of a streamed response body (without `\\n`), including a last unterminated one.

    Transport errors while reading become KubeUnavailable. Ends when the server ends the stream.
    The response is released when the iteration ends, fails or is abandoned.
    """
    async with contextlib.aclosing(iter_pieces(response, what)) as pieces:
        async for line, _ in pieces:
            yield line


async def iter_pieces(
    response: aiohttp.ClientResponse, what: str
) -> AsyncGenerator[tuple[bytes, bool], None]:
    """As iter_lines, each with whether it ends its line (False: a piece of a line too long to
    hold, whose rest follows)."""
    splitter = LineSplitter()
    finished = False
    try:
        try:
            async for chunk in response.content.iter_any():
                for piece in splitter.feed_pieces(chunk):
                    yield piece
        except _TRANSPORT_ERRORS as error:
            raise KubeUnavailable(f"cannot {what}: stream broke: {type(error).__name__}: {error}") from error
        finished = True
        last = splitter.flush()
        if last is not None:
            yield last, True
    finally:
        # A fully read response may go back to the pool; an abandoned one must not.
        if finished:
            response.release()
        else:
            response.close()


async def server_version(api: ApiClient) -> str:
    """The API server's gitVersion (e.g. "v1.32.4"): a cheap reachability and credentials check."""
    body = await request_json(api, "GET", "/version", "read the API server version")
    return str(body.get("gitVersion", "unknown"))
