"""The console in a browser (textual-serve), bound to localhost, optionally behind a token.

textual-serve has no authentication: anyone who can open the port gets a console that can run
experiments as this user. So every request is checked for who is asking (`caller_middleware`):
- its `Host` must be a loopback name (localhost, 127.0.0.0/8, [::1], any port): a web page on
  another site that makes its own name resolve to 127.0.0.1 (DNS rebinding) sends its own name;
- its `Origin`, when it has one (a browser sends it with every websocket), must be this page: a
  loopback name with the port the request came to. Any web page may open a websocket to
  localhost, and browsers send no preflight for it; the Origin is what tells them apart. Loopback
  names count as one (the page's own URLs say `localhost` even when it was opened as 127.0.0.1).
Others get 403 and no upgrade. With a token, every request must carry it as well, either in the URL
(`?token=...`, the link printed at start) or in the cookie that first visit sets, which is how the
page's own websocket and static files get through.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from textual_serve.server import Server

DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def _loopback(hostname: str | None) -> bool:
    if not hostname:
        return False
    if hostname.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


def loopback_port(host: str | None, scheme: str = "http") -> int | None:
    """The port of a `Host` header value (`localhost:8000`, `[::1]`, `127.0.0.2:80`) that names a
    loopback address; None for any other host, or a header that is not one."""
    if not host or any(c in host for c in "/?#@ \t"):
        return None
    try:
        parts = urlsplit(f"//{host}")
        port = parts.port
    except ValueError:
        return None
    if not _loopback(parts.hostname):
        return None
    return port if port is not None else DEFAULT_PORTS.get(scheme, 80)


def origin_port(origin: str) -> int | None:
    """The port of an `Origin` (`http://localhost:8000`) on a loopback name; None otherwise
    (another site, `null`, a file)."""
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or parts.path not in ("", "/") or not _loopback(parts.hostname):
        return None
    return port if port is not None else DEFAULT_PORTS[parts.scheme]


def caller_allowed(host: str | None, origin: str | None) -> bool:
    """Whether a request with these headers comes from this machine's browser on this console's
    page: a loopback `Host`, and an `Origin` (when present) on a loopback name with the same port."""
    port = loopback_port(host)
    if port is None:
        return False
    return origin is None or origin_port(origin) == port


def caller_middleware() -> Any:
    """An aiohttp middleware answering 403, before any handler (so no websocket upgrade), to a
    request whose Host is not a loopback name or whose Origin is another page."""

    @web.middleware
    async def check_caller(request: web.Request, handler: Any) -> web.StreamResponse:
        if not caller_allowed(request.headers.get("Host"), request.headers.get("Origin")):
            return web.Response(status=403, text="anatomy-tui: this console answers only its own page on localhost "
                                                 "(open http://localhost:PORT on this machine or through ssh -L)\n")
        return await handler(request)

    return check_caller


def token_middleware(token: str, cookie: str) -> Any:
    """An aiohttp middleware answering 403 to any request without `token` (URL or cookie)."""

    @web.middleware
    async def require_token(request: web.Request, handler: Any) -> web.StreamResponse:
        given = request.query.get("token") or request.cookies.get(cookie) or ""
        if not hmac.compare_digest(given.encode(), token.encode()):
            return web.Response(status=403, text="anatomy-tui: open the URL with the token printed at start\n")
        response = await handler(request)
        if request.query.get("token") and isinstance(response, web.Response | web.FileResponse):
            response.set_cookie(cookie, token, httponly=True, samesite="Strict")
        return response

    return require_token


class TokenServer(Server):
    """textual-serve's server on localhost, answering only its own page on localhost (Host and
    Origin checked); with `token=True`, a random token guards every route as well."""

    def __init__(self, command: str, port: int, token: bool) -> None:
        super().__init__(command, host="localhost", port=port, title="anatomy-tui")
        self.token = secrets.token_urlsafe(24) if token else ""

    @property
    def entry_url(self) -> str:
        return f"{self.public_url}/?token={self.token}" if self.token else self.public_url

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(caller_middleware())
        if self.token:
            app.middlewares.append(token_middleware(self.token, f"anatomy_tui_token_{self.port}"))
        return app
