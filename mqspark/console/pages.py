"""The console's pages, rendered on the server from Jinja templates (every value escaped): the
overview of queue managers and queues, a queue, its messages and one message, and the sign-in of
an admin's browser. The overview's table refreshes itself through htmx, from the same route."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from mqspark.console.api import error_response, message_filter, payload_option
from mqspark.console.reads import PAGE, PREVIEW_BYTES, Reads, message_rows
from mqspark.console.security import CSRF_FIELD, SESSION_COOKIE, Security
from mqspark.errors import MQError, MQValidationError

TEMPLATES = Environment(loader=PackageLoader("mqspark.console"), autoescape=select_autoescape(default=True))
# The overview's columns a click sorts by.
SORTS = ("qmgr", "name", "type", "depth", "oldest_age_s")


def renderer(security: Security) -> Callable[..., HTMLResponse]:
    """Renders a template for a request, with what every page shows of who is signed in."""

    def render(request: Request, template: str, status: int = 200, **values: Any) -> HTMLResponse:
        values.update(admin=security.admin, signed_in=security.signed_in(request))
        values.update(csrf_token=security.csrf_token(request), csrf_field=CSRF_FIELD)
        return HTMLResponse(TEMPLATES.get_template(template).render(**values), status_code=status)

    return render


def routes(reads: Reads, security: Security) -> list[Route]:
    """The pages' routes over ``reads``; ``security`` says who signed in."""
    render = renderer(security)

    def failed(request: Request, error: MQError) -> HTMLResponse:
        status = error_response(error).status_code
        return render(request, "error.html", status=status, error=str(error))

    def overview(request: Request) -> Response:
        query = request.query_params
        sort = query.get("sort") or "qmgr"
        if sort not in SORTS:
            return failed(request, MQValidationError(f"option sort must be one of {', '.join(SORTS)}, got {sort!r}"))
        descending = query.get("desc") == "1"
        name_filter = (query.get("filter") or "").strip()
        rows = [
            {"qmgr": qmgr["name"], **queue}
            for qmgr in reads.qmgrs()
            for queue in reads.queues(qmgr["name"])
            if name_filter.lower() in queue["name"].lower()
        ]
        rows.sort(key=lambda row: (row["qmgr"], row["name"]))
        rows.sort(key=lambda row: _sort_key(row, sort), reverse=descending)
        template = "overview_rows.html" if request.headers.get("hx-request") else "overview.html"
        return render(request, template, qmgrs=reads.qmgrs(), rows=rows, sort=sort, desc=descending, filter=name_filter)

    def queue(request: Request) -> Response:
        qmgr, name = request.path_params["qmgr"], request.path_params["queue"]
        try:
            return render(request, "queue.html", queue=reads.queue(qmgr, name))
        except MQError as error:
            return failed(request, error)

    def messages(request: Request) -> Response:
        qmgr, name = request.path_params["qmgr"], request.path_params["queue"]
        query = request.query_params
        try:
            offset = int(query.get("offset") or 0)
            page = reads.messages(qmgr, name, message_filter(query), offset=offset, limit=PAGE)
        except ValueError:
            return failed(
                request, MQValidationError(f"option offset must be a whole number, got {query.get('offset')!r}")
            )
        except MQError as error:
            return failed(request, error)
        return render(request, "messages.html", page=page, query=dict(query))

    def message(request: Request) -> Response:
        qmgr, name, msg_id = (request.path_params[key] for key in ("qmgr", "queue", "msg_id"))
        query = request.query_params
        try:
            view = query.get("payload") or "text"
            if view != "json":
                view = payload_option(query)
            qm = reads.managers.get(qmgr)
            browsed = qm.browse(name, msg_id=msg_id, order="physical")
        except MQError as error:
            return failed(request, error)
        if browsed.num_rows == 0:
            return render(request, "error.html", status=404, error=f"queue {name}: no message {msg_id}")
        rows = message_rows(browsed, PREVIEW_BYTES, "text" if view == "json" else view)
        shown = rows[0]
        if view == "json":
            shown = {**shown, "payload": _pretty_json(shown["payload"], shown["payload_encoding"])}
        return render(
            request, "message.html", qmgr=qmgr, queue=name, message=shown, view=view, preview_bytes=PREVIEW_BYTES
        )

    def instances_page(request: Request) -> Response:
        qmgr = request.path_params["qmgr"]
        try:
            return render(
                request, "instances.html", qmgr=qmgr, groups=reads.instances(qmgr), clusters=reads.clusters(qmgr)
            )
        except MQError as error:
            return failed(request, error)

    async def sign_in(request: Request) -> Response:
        form = await request.form()
        token = form.get("token")
        try:
            session = security.sign_in(token if isinstance(token, str) else "")
        except MQError as error:
            return failed(request, error)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(SESSION_COOKIE, session, httponly=True, samesite="strict")
        return response

    return [
        Route("/", overview, methods=["GET"]),
        Route("/qmgr/{qmgr}/queue/{queue}", queue, methods=["GET"]),
        Route("/qmgr/{qmgr}/queue/{queue}/messages", messages, methods=["GET"]),
        Route("/qmgr/{qmgr}/queue/{queue}/messages/{msg_id}", message, methods=["GET"]),
        Route("/qmgr/{qmgr}/instances", instances_page, methods=["GET"]),
        Route("/sign-in", sign_in, methods=["POST"]),
    ]


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
