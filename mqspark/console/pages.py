"""The console's pages, rendered on the server from Jinja templates (every value escaped): the
overview of queue managers and queues, a queue, its messages and one message, the instances and
clusters, and the sign-in of an admin's browser. The overview's table refreshes itself through
htmx, from the same route."""

from __future__ import annotations

import json
import operator
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from mqspark.console.api import as_mq_error, error_response, message_filter, payload_option
from mqspark.console.reads import BUSY_REFRESH_SECONDS, PAGE, PREVIEW_BYTES, REFRESH_SECONDS, Reads, message_rows
from mqspark.console.security import CSRF_FIELD, SESSION_COOKIE, Security
from mqspark.console.snapshots import NotReady, polled
from mqspark.errors import MQError, MQValidationError


def segment(name: str) -> str:
    """A name as one segment of a URL path: every character but letters, digits and ``-._~``
    escaped (``/`` and ``%`` too, which Jinja's ``urlencode`` leaves as they are)."""
    return quote(name, safe="")


def clock(at: float) -> str:
    """A ``time.time()`` as the pages show when an answer was computed: UTC, to the second."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


# The templates are installed with the package and never change while it runs: not looked at again.
TEMPLATES = Environment(
    loader=PackageLoader("mqspark.console"), autoescape=select_autoescape(default=True), auto_reload=False
)
TEMPLATES.filters["segment"] = segment
TEMPLATES.filters["clock"] = clock
TEMPLATES.globals.update(refresh_seconds=REFRESH_SECONDS, busy_refresh_seconds=BUSY_REFRESH_SECONDS)
# The overview's columns a click sorts by.
SORTS = ("qmgr", "name", "type", "depth", "oldest_age_s")
Render = Callable[..., HTMLResponse]


def renderer(security: Security) -> Render:
    """Renders a template for a request, with what every page shows of who is signed in."""

    def render(request: Request, template: str, status: int = 200, **values: Any) -> HTMLResponse:
        values.update(admin=security.admin, signed_in=security.signed_in(request))
        values.update(csrf_token=security.csrf_token(request), csrf_field=CSRF_FIELD)
        return HTMLResponse(TEMPLATES.get_template(template).render(**values), status_code=status)

    return render


def failed(render: Render, request: Request, error: Exception) -> HTMLResponse:
    """The error page of ``error``, with the HTTP status the API gives it."""
    error = as_mq_error(error)
    return render(request, "error.html", status=error_response(error).status_code, error=str(error))


def offset_option(value: str | None) -> int:
    """The ``offset`` of a paged list: a whole number, 0 when not given."""
    try:
        return int(value or 0)
    except ValueError:
        raise MQValidationError(f"option offset must be a whole number, got {value!r}") from None


class _Pages:
    """The pages' handlers over ``reads``; ``security`` says who signed in."""

    def __init__(self, reads: Reads, security: Security) -> None:
        self.reads, self.security, self.render = reads, security, renderer(security)
        # The overview's rows by order, with the answers they were rendered from.
        self._overview_rows: dict[tuple[str, bool], tuple[tuple, Markup]] = {}

    def routes(self) -> list[Route]:
        return [
            Route("/", self._polled(self.overview), methods=["GET"]),
            Route("/qmgr/{qmgr}/queue/{queue}", self._polled(self.queue), methods=["GET"]),
            Route("/qmgr/{qmgr}/queue/{queue}/messages", self._answering(self.messages), methods=["GET"]),
            Route("/qmgr/{qmgr}/queue/{queue}/messages/{msg_id}", self._answering(self.message), methods=["GET"]),
            Route("/qmgr/{qmgr}/instances", self._answering(self.instances), methods=["GET"]),
            Route("/sign-in", self.sign_in, methods=["POST"]),
        ]

    def _answering(self, handler: Callable[[Request], Response]) -> Callable[[Request], Response]:
        """``handler``, with any error it raises shown on the error page."""

        def endpoint(request: Request) -> Response:
            try:
                return handler(request)
            except NotReady:
                raise
            except Exception as error:  # noqa: BLE001 - every failure is shown as a page, never a bare 500
                return failed(self.render, request, error)

        return endpoint

    def _polled(self, handler: Callable[[Request], Response]) -> Callable[[Request], Awaitable[Response]]:
        """``handler`` of a page clients poll (see :func:`~mqspark.console.snapshots.polled`)."""
        return polled(self._answering(handler))

    def overview(self, request: Request) -> Response:
        query = request.query_params
        sort = query.get("sort") or "qmgr"
        if sort not in SORTS:
            raise MQValidationError(f"option sort must be one of {', '.join(SORTS)}, got {sort!r}")
        descending = query.get("desc") == "1"
        name_filter = (query.get("filter") or "").strip()
        qmgrs = self.reads.qmgrs()
        dated = (qmgrs, *(self.reads.queues(qmgr["name"]) for qmgr in qmgrs.value))
        answers = tuple(answer.value for answer in dated)
        updated = min(answer.at for answer in dated)
        rows = self._rows(answers, sort, descending, name_filter)
        if request.headers.get("hx-request"):
            # The time of the answers shown is swapped into the page beside the rows (htmx out of band).
            updated_html = Markup(TEMPLATES.get_template("updated.html").render(updated=updated, swap=True))
            return HTMLResponse(rows + updated_html)
        values = {"qmgrs": qmgrs.value, "rows": rows, "updated": updated}
        values.update(sort=sort, desc=descending, filter=name_filter)
        return self.render(request, "overview.html", **values)

    def _rows(self, answers: tuple, sort: str, descending: bool, name_filter: str) -> Markup:
        """The overview's queue rows, rendered once per answers and order for every client that
        asks without a filter (what the 5 s polls ask)."""
        kept = self._overview_rows.get((sort, descending)) if not name_filter else None
        if kept is not None and len(kept[0]) == len(answers) and all(map(operator.is_, kept[0], answers)):
            return kept[1]
        qmgrs, *queues = answers
        rows = [
            {"qmgr": qmgr["name"], **queue}
            for qmgr, listed in zip(qmgrs, queues, strict=True)
            for queue in listed
            if name_filter.lower() in queue["name"].lower()
        ]
        rows.sort(key=lambda row: (row["qmgr"], row["name"]))
        rows.sort(key=lambda row: _sort_key(row, sort), reverse=descending)
        rendered = Markup(TEMPLATES.get_template("overview_rows.html").render(rows=rows))
        if not name_filter:
            self._overview_rows[(sort, descending)] = (answers, rendered)
        return rendered

    def queue(self, request: Request) -> Response:
        queue = self.reads.queue(request.path_params["qmgr"], request.path_params["queue"])
        return self.render(request, "queue.html", queue=queue.value, updated=queue.at)

    def messages(self, request: Request) -> Response:
        qmgr, name = request.path_params["qmgr"], request.path_params["queue"]
        query = request.query_params
        offset = offset_option(query.get("offset"))
        page = self.reads.messages(qmgr, name, message_filter(query), offset=offset, limit=PAGE)
        return self.render(request, "messages.html", page=page, query=dict(query))

    def message(self, request: Request) -> Response:
        qmgr, name, msg_id = (request.path_params[key] for key in ("qmgr", "queue", "msg_id"))
        view = request.query_params.get("payload") or "text"
        if view != "json":
            view = payload_option(request.query_params)
        browsed = self.reads.managers.get(qmgr).browse(name, msg_id=msg_id, order="physical")
        if browsed.num_rows == 0:
            return self.render(request, "error.html", status=404, error=f"queue {name}: no message {msg_id}")
        shown = message_rows(browsed, PREVIEW_BYTES, "text" if view == "json" else view)[0]
        if view == "json":
            shown = {**shown, "payload": _pretty_json(shown["payload"], shown["payload_encoding"])}
        values = {"qmgr": qmgr, "queue": name, "message": shown, "view": view, "preview_bytes": PREVIEW_BYTES}
        return self.render(request, "message.html", **values)

    def instances(self, request: Request) -> Response:
        qmgr = request.path_params["qmgr"]
        groups, clusters = self.reads.instances(qmgr), self.reads.clusters(qmgr)
        values = {"groups": groups.value, "clusters": clusters.value, "updated": min(groups.at, clusters.at)}
        return self.render(request, "instances.html", qmgr=qmgr, **values)

    async def sign_in(self, request: Request) -> Response:
        form = await request.form()
        token = form.get("token")
        try:
            session = self.security.sign_in(token if isinstance(token, str) else "")
        except MQError as error:
            return failed(self.render, request, error)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(
            SESSION_COOKIE, session, httponly=True, samesite="strict", secure=request.url.scheme == "https"
        )
        return response


def routes(reads: Reads, security: Security) -> list[Route]:
    """The pages' routes over ``reads``; ``security`` says who signed in."""
    return _Pages(reads, security).routes()


def _sort_key(row: dict[str, Any], column: str) -> tuple:
    """Sorts rows by ``column``, rows without a value counting as the lowest (a stable sort keeps
    queue manager and name order among equals, also in descending order)."""
    value = row[column]
    return (value is not None, value if value is not None else 0)


def _pretty_json(text: str | None, encoding: str | None) -> str:
    """A payload that is JSON, indented; any other says why it is not shown so."""
    if text is None or encoding != "text":
        return "(not shown as JSON: the payload is not UTF-8 text)"
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError as error:
        return f"(not shown as JSON: {error})"
