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

The token is printed once, in the link at start, and nowhere else: the access log names the path
without its query (`PathAccessLogger`), and every log record is masked on its way out
(`TokenMask`), tracebacks included, with a bad request's bytes left out. A connection whose request
has not fully arrived within `REQUEST_TIMEOUT_S` (a half-sent request, slowloris) is closed.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import secrets
import signal
import traceback
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import HttpProcessingError
from textual_serve.server import Server

DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
# aiohttp's keep-alive timer starts when a connection opens and closes it if no whole request has
# arrived by then (web_protocol.py _process_keepalive); an upgraded websocket is never idle, so it stays.
REQUEST_TIMEOUT_S = 5.0


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


class PathAccessLogger(AbstractAccessLogger):
    """The access log without query strings or headers: the URL's `?token=` and the Referer (the
    page's URL, token included) never reach it."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.info('%s "%s %s" %s %.3fs', request.remote, request.method, request.path, response.status, time)


class TokenMask(logging.Filter):
    """Masks the token in every record a handler writes: its message, and its traceback formatted
    here without locals (rich would print the request's bytes and the server's attributes); a bad
    request (HttpProcessingError: too long, malformed) is one line, without the bytes it quoted."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self.token = token

    def mask(self, text: str) -> str:
        return text.replace(self.token, "***") if self.token else text

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            message += f": {error.code} {type(error).__name__}"
        elif error is not None:
            message += "\n" + "".join(traceback.format_exception(error)).rstrip()
        record.msg, record.args, record.exc_info, record.exc_text = self.mask(message), (), None, None
        return True


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

    def initialize_logging(self) -> None:
        super().initialize_logging()
        for handler in logging.getLogger().handlers:
            handler.addFilter(TokenMask(self.token))

    def serve(self, debug: bool = False) -> None:
        """textual-serve's `serve`, with the access log and the request timeout of this module."""
        self.debug = debug
        self.initialize_logging()
        loop = asyncio.new_event_loop()
        loop.add_signal_handler(signal.SIGINT, self.request_exit)
        loop.add_signal_handler(signal.SIGTERM, self.request_exit)
        web.run_app(self._make_app(), host=self.host, port=self.port, handle_signals=False, loop=loop,
                    print=lambda *args: None, access_log_class=PathAccessLogger,
                    keepalive_timeout=REQUEST_TIMEOUT_S)  # fmt: skip
