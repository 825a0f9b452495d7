"""The console in a browser (textual-serve), bound to localhost, optionally behind a token.

textual-serve has no authentication: anyone who can open the port gets a console that can run
experiments as this user. With a token, every request must carry it, either in the URL
(`?token=...`, the link printed at start) or in the cookie that first visit sets, which is how the
page's own websocket and static files get through.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Any

from aiohttp import web
from textual_serve.server import Server


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
    """textual-serve's server on localhost; with `token=True`, a random token guards every route."""

    def __init__(self, command: str, port: int, token: bool) -> None:
        super().__init__(command, host="localhost", port=port, title="anatomy-tui")
        self.token = secrets.token_urlsafe(24) if token else ""

    @property
    def entry_url(self) -> str:
        return f"{self.public_url}/?token={self.token}" if self.token else self.public_url

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        if self.token:
            app.middlewares.append(token_middleware(self.token, f"anatomy_tui_token_{self.port}"))
        return app
