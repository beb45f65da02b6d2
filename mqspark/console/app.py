"""The console application: the REST API, the pages, the sign-in and the vendored static files in
one Starlette app, with headers that keep a page from running anything but the console's own
scripts; and :func:`serve`, which runs it with uvicorn."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mqspark.clock import SYSTEM_CLOCK, Clock
from mqspark.console import api, dead_letters, pages
from mqspark.console.admin import routes as admin_routes
from mqspark.console.jobs import Redrives
from mqspark.console.managers import Managers
from mqspark.console.reader import renice
from mqspark.console.reads import Reads
from mqspark.console.security import Security

STATIC = Path(__file__).with_name("static")
# The host names a console answers for unless told more.
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
# Only the console's own scripts, styles and images run on its pages: a payload that slipped
# through escaping still could not run.
_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


class _SecurityHeaders:
    """Adds ``_HEADERS`` to every response that has not set them (a pure ASGI middleware: Starlette's
    ``BaseHTTPMiddleware`` costs a task and a stream per request); static files may be cached."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        static = scope["path"].startswith("/static/")

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in _HEADERS.items():
                    if not (static and name == "cache-control"):
                        headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, sending)


def build_app(
    roots: Sequence[str],
    admin: bool = False,
    token: str | None = None,
    hosts: Sequence[str] = LOCAL_HOSTS,
    clock: Clock = SYSTEM_CLOCK,
) -> Starlette:
    """The console over the queue managers at ``roots``; writes need ``admin`` and ``token``. It
    answers only requests for ``hosts``: a page of another site that points its own name at this
    machine (DNS rebinding) is refused. ``clock`` is the time its queue managers and redrives read
    in this process (its reader process reads the system's)."""
    reads = Reads(Managers(roots, clock))
    security = Security(admin=admin, token=token)
    redrives = Redrives(reads.managers)
    routes = [
        *api.routes(reads, security),
        *pages.routes(reads, security),
        *dead_letters.routes(reads, security, redrives, pages.renderer(security)),
        *admin_routes(reads, security, pages.renderer(security)),
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
    ]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=list(hosts)), Middleware(_SecurityHeaders)]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        reads.close()

    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)


# The nice value the console serves pages at: a request wakes a thread at once, and at nice 0 those
# wake-ups cost a streaming get on a busy machine more than their CPU (see docs/architecture.md).
SERVING_NICE = 10
# How long an idle connection is kept: longer than the pages poll (every 5 s), so a browser's next
# poll never meets a connection the console is closing (uvicorn's default is 5 s; nginx's is 75 s).
KEEP_ALIVE_SECONDS = 75


def serve(
    roots: Sequence[str], host: str, port: int, admin: bool, token: str | None, hosts: Sequence[str] = ()
) -> None:
    """Serve the console on ``host`` until interrupted, at nice ``SERVING_NICE`` (its reader process
    at :data:`~mqspark.console.reader.NICE`); it answers for the local names, ``host`` and ``hosts``."""
    renice(SERVING_NICE)
    names = [*LOCAL_HOSTS, host, *hosts]
    app = build_app(roots, admin, token, names)
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_keep_alive=KEEP_ALIVE_SECONDS)
