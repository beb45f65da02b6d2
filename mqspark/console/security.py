"""Who may write through the console. Reads are open to whoever reaches it (it binds to 127.0.0.1
unless told otherwise); writes (put, get, redrive) and the admin actions need a console started with
``--admin`` and its token: a program sends it as ``Authorization: Bearer TOKEN``; a browser signs in
once with it, and then sends its session cookie (``HttpOnly``, ``SameSite=Strict``) with a CSRF token
from the page, from the console's own origin."""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.requests import Request

from mqspark.errors import MQError, Reason

SESSION_COOKIE = "mqspark_console"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf_token"


def new_token() -> str:
    """A fresh admin token: 32 random bytes, URL-safe."""
    return secrets.token_urlsafe(32)


@dataclass
class Security:
    """The console's write permission: ``admin`` (started with ``--admin``) and its ``token``."""

    admin: bool
    token: str | None
    # Sessions of browsers that signed in, and the secret their CSRF tokens are derived with.
    sessions: set[str] = field(default_factory=set)
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    def __post_init__(self) -> None:
        if self.admin and not self.token:
            raise MQError("console: --admin needs a token (given or generated)")

    def sign_in(self, token: str) -> str:
        """A new session for a browser that gave the right ``token``; raises 2035 otherwise."""
        self._check_admin()
        if not self._token_matches(token):
            raise MQError("console: wrong admin token", Reason.MQRC_NOT_AUTHORIZED)
        session = secrets.token_urlsafe(32)
        self.sessions.add(session)
        return session

    def csrf_token(self, request: Request) -> str | None:
        """The CSRF token the pages of a signed-in browser carry, None for one not signed in."""
        session = request.cookies.get(SESSION_COOKIE)
        if session is None or session not in self.sessions:
            return None
        return hmac.new(self.secret, session.encode(), "sha256").hexdigest()

    def signed_in(self, request: Request) -> bool:
        """Whether the request comes from a browser that signed in."""
        return self.csrf_token(request) is not None

    def check_write(self, request: Request, form_token: str | None = None) -> None:
        """Let a write through, or raise ``MQRC_NOT_AUTHORIZED`` (2035): the console must run with
        ``--admin``; the request carries the token, or a session cookie with its CSRF token (in
        the ``X-CSRF-Token`` header or the form's ``csrf_token``) from this console's origin."""
        self._check_admin()
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            if self._token_matches(given.strip()):
                return
            raise MQError("console: wrong admin token", Reason.MQRC_NOT_AUTHORIZED)
        expected = self.csrf_token(request)
        if expected is None:
            raise MQError(
                "console: a write needs the admin token (Authorization: Bearer TOKEN) or a signed-in session",
                Reason.MQRC_NOT_AUTHORIZED,
            )
        sent = request.headers.get(CSRF_HEADER) or form_token or ""
        if not hmac.compare_digest(sent, expected) or not _same_origin(request):
            raise MQError(
                "console: the request's CSRF token or origin is not this console's", Reason.MQRC_NOT_AUTHORIZED
            )

    def who(self, request: Request) -> str:
        """Who made a write, as the audit records it: the token's holder, or a signed-in browser
        (named by its CSRF token's first characters, never by its session)."""
        if request.headers.get("authorization", "").lower().startswith("bearer "):
            return f"token ({request.client.host if request.client else 'unknown'})"
        csrf = self.csrf_token(request)
        return f"browser {csrf[:8]} ({request.client.host if request.client else 'unknown'})" if csrf else "unknown"

    def _check_admin(self) -> None:
        if not self.admin:
            raise MQError("console: writes need a console started with --admin", Reason.MQRC_NOT_AUTHORIZED)

    def _token_matches(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given.encode(), self.token.encode())


def _same_origin(request: Request) -> bool:
    """Whether the request's ``Origin`` (else its ``Referer``) is the console's own host; a browser
    sends one with every form post and fetch."""
    source = request.headers.get("origin") or request.headers.get("referer")
    if not source:
        return False
    return urlsplit(source).netloc == request.headers.get("host")
