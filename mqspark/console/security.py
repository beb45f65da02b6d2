"""Who may do what through the console. Reads of queues and messages are open to whoever reaches it
(it binds to 127.0.0.1 and answers only for the host names it serves, unless told otherwise); writes
(put, get, redrive), the admin actions and what they record need a console started with ``--admin``
and its token: a program sends it as ``Authorization: Bearer TOKEN``; a browser signs in once with
it, and then sends its session cookie (``HttpOnly``, ``SameSite=Strict``) and, with each write, a
CSRF token from the page, from the console's own origin."""

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
# The variable ``mqspark console --admin`` reads its token from when ``--token`` is not given.
TOKEN_VARIABLE = "MQSPARK_CONSOLE_TOKEN"


class NotAdmin(MQError):
    """A write to a console started without ``--admin``: no token helps (HTTP 403)."""

    def __init__(self) -> None:
        super().__init__("console: writes need a console started with --admin", Reason.MQRC_NOT_AUTHORIZED)


def new_token() -> str:
    """A fresh admin token: 32 random bytes, URL-safe."""
    return secrets.token_urlsafe(32)


@dataclass
class Security:
    """The console's write permission: ``admin`` (started with ``--admin``) and its ``token``."""

    admin: bool
    token: str | None
    # Sessions of browsers that signed in, each with the name the audit knows it by.
    sessions: dict[str, str] = field(default_factory=dict)
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
        self.sessions[session] = f"browser-{secrets.token_hex(4)}"
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

    def check_admin_read(self, request: Request) -> None:
        """Let a read of what admins did (the audit, a redrive's progress) through, or raise 2035: it
        needs ``--admin`` and the token or a signed-in browser."""
        self._check_admin()
        if self._bearer(request) or self.signed_in(request):
            return
        raise MQError("console: this needs the admin token or a signed-in session", Reason.MQRC_NOT_AUTHORIZED)

    def check_write(self, request: Request, form_token: str | None = None) -> None:
        """Let a write through, or raise ``MQRC_NOT_AUTHORIZED`` (2035): the console must run with
        ``--admin``; the request carries the token, or a session cookie with its CSRF token (in
        the ``X-CSRF-Token`` header or the form's ``csrf_token``) from this console's origin."""
        self._check_admin()
        if self._bearer(request):
            return
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
        """Who made a write, as the audit records it: the token's holder, or a signed-in browser by
        the name it got at sign-in; with the address it came from."""
        address = request.client.host if request.client else "unknown"
        if request.headers.get("authorization", "").lower().startswith("bearer "):
            return f"token ({address})"
        name = self.sessions.get(request.cookies.get(SESSION_COOKIE) or "")
        return f"{name} ({address})" if name else f"unknown ({address})"

    def _bearer(self, request: Request) -> bool:
        """Whether the request carries the token; raises 2035 when it carries a wrong one."""
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        if not self._token_matches(given.strip()):
            raise MQError("console: wrong admin token", Reason.MQRC_NOT_AUTHORIZED)
        return True

    def _check_admin(self) -> None:
        if not self.admin:
            raise NotAdmin()

    def _token_matches(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given.encode(), self.token.encode())


def _same_origin(request: Request) -> bool:
    """Whether the request's ``Origin`` (else its ``Referer``) is the console's own host; a browser
    sends one with every form post and fetch."""
    source = request.headers.get("origin") or request.headers.get("referer")
    if not source:
        return False
    return urlsplit(source).netloc == request.headers.get("host")
