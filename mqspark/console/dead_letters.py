"""Failed messages in the console: the page of a queue manager's dead-letter, backout and error
queues with MQ's dead-letter header (reason code and text, original queue, consumer group, backout
count), and their redrive, of selected messages or all, at a rate, with its progress; the same
redrive in the REST API under ``/api/v1/admin``. Every redrive is recorded in the audit table."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from mqspark.console import audit
from mqspark.console.api import error_response, message_filter
from mqspark.console.jobs import DEFAULT_RATE, Redrive, Redrives
from mqspark.console.reads import PAGE, Reads
from mqspark.console.security import CSRF_FIELD, Security
from mqspark.errors import MQError, MQValidationError, Reason

Render = Callable[..., HTMLResponse]


def routes(reads: Reads, security: Security, redrives: Redrives, render: Render) -> list[Route]:
    """The dead letters' page and redrive routes; ``render`` renders a template for a request."""

    def page(request: Request) -> Response:
        qmgr = request.path_params["qmgr"]
        query = request.query_params
        try:
            queues = reads.failure_queues(qmgr)
            chosen = query.get("queue") or reads.managers.get(qmgr).dead_letter_queue
            offset = _offset(query.get("offset"))
            messages = reads.messages(qmgr, chosen, message_filter(query), offset=offset, limit=PAGE)
        except MQError as error:
            return render(request, "error.html", status=error_response(error).status_code, error=str(error))
        return render(request, "dead_letters.html", qmgr=qmgr, queues=queues, page=messages, query=dict(query))

    def started(redrive: Redrive, request: Request) -> None:
        qm = reads.managers.get(redrive.qmgr)
        detail = {"msg_ids": len(redrive.msg_ids), "rate": redrive.rate, "redrive": redrive.id}
        audit.record(qm, security.who(request), "redrive", redrive.queue, detail, True, "started")

    def finished(request: Request) -> Callable[[Redrive], None]:
        who = security.who(request)

        def record(redrive: Redrive) -> None:
            qm = reads.managers.get(redrive.qmgr)
            detail = {"redrive": redrive.id, "done": redrive.done}
            audit.record(qm, who, "redrive", redrive.queue, detail, redrive.state == "done", redrive.as_dict())

        return record

    async def redrive_form(request: Request) -> Response:
        form = await request.form()
        token = form.get(CSRF_FIELD)
        try:
            security.check_write(request, token if isinstance(token, str) else None)
            msg_ids = None if form.get("all") == "1" else [str(value) for value in form.getlist("msg_id")]
            if msg_ids == []:
                raise MQValidationError("redrive: select messages, or redrive all of them")
            redrive = redrives.start(
                request.path_params["qmgr"],
                request.path_params["queue"],
                msg_ids,
                _rate(form.get("rate")),
                finished(request),
            )
        except MQError as error:
            return render(request, "error.html", status=error_response(error).status_code, error=str(error))
        started(redrive, request)
        return RedirectResponse(f"/redrive/{redrive.id}", status_code=303)

    def progress(request: Request) -> Response:
        redrive = redrives.get(request.path_params["id"])
        if redrive is None:
            return render(request, "error.html", status=404, error=f"no redrive {request.path_params['id']} here")
        if not request.headers.get("hx-request"):
            return render(request, "redrive.html", redrive=redrive.as_dict())
        # htmx stops polling on 286 once the redrive ended.
        status = 200 if redrive.state == "running" else 286
        return render(request, "redrive_progress.html", status=status, redrive=redrive.as_dict())

    async def redrive_api(request: Request) -> Response:
        try:
            security.check_write(request)
            body = await _json_body(request)
            redrive = redrives.start(
                request.path_params["qmgr"],
                request.path_params["queue"],
                body.get("msg_ids"),
                body.get("rate", DEFAULT_RATE),
                finished(request),
            )
        except MQError as error:
            return error_response(error)
        started(redrive, request)
        return JSONResponse(redrive.as_dict(), status_code=202)

    def redrive_state(request: Request) -> Response:
        redrive = redrives.get(request.path_params["id"])
        if redrive is None:
            message = f"no redrive {request.path_params['id']} here"
            return error_response(MQError(message, Reason.MQRC_UNKNOWN_OBJECT_NAME))
        return JSONResponse(redrive.as_dict())

    return [
        Route("/qmgr/{qmgr}/dead-letters", page, methods=["GET"]),
        Route("/qmgr/{qmgr}/dead-letters/{queue}/redrive", redrive_form, methods=["POST"]),
        Route("/redrive/{id}", progress, methods=["GET"]),
        Route("/api/v1/admin/qmgr/{qmgr}/queue/{queue}/redrive", redrive_api, methods=["POST"]),
        Route("/api/v1/admin/redrive/{id}", redrive_state, methods=["GET"]),
    ]


def _offset(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        raise MQValidationError(f"option offset must be a whole number, got {value!r}") from None


def _rate(value: Any) -> int:
    if value in (None, ""):
        return DEFAULT_RATE
    try:
        return int(value)
    except (TypeError, ValueError):
        raise MQValidationError(f"redrive: option rate must be a whole number, got {value!r}") from None


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except ValueError as error:
        raise MQValidationError(f"redrive: the body must be a JSON object: {error}") from None
    if not isinstance(body, dict):
        raise MQValidationError(f"redrive: the body must be a JSON object, got {type(body).__name__}")
    return body
