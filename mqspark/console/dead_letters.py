"""Failed messages in the console: the page of a queue manager's dead-letter, backout and error
queues with MQ's dead-letter header (reason code and text, original queue, consumer group, backout
count), and their redrive, of selected messages or all, at a rate, with its progress; the same
redrive in the REST API under ``/api/v1/admin``. Every redrive is recorded in the audit table."""

from __future__ import annotations

import json
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from mqspark.console import audit
from mqspark.console.api import MAX_BODY_BYTES, error_response, message_filter, read_body
from mqspark.console.jobs import DEFAULT_RATE, Redrive, Redrives
from mqspark.console.pages import Render, failed, offset_option
from mqspark.console.reads import PAGE, Reads
from mqspark.console.security import CSRF_FIELD, Security
from mqspark.errors import MQError, MQValidationError, Reason
from mqspark.qmgr import engine


class _DeadLetters:
    """The dead letters' page and redrive handlers."""

    def __init__(self, reads: Reads, security: Security, redrives: Redrives, render: Render) -> None:
        self.reads, self.security, self.redrives, self.render = reads, security, redrives, render

    def routes(self) -> list[Route]:
        return [
            Route("/qmgr/{qmgr}/dead-letters", self.page, methods=["GET"]),
            Route("/qmgr/{qmgr}/dead-letters/{queue}/redrive", self.redrive_form, methods=["POST"]),
            Route("/redrive/{id}", self.progress, methods=["GET"]),
            Route("/api/v1/admin/qmgr/{qmgr}/queue/{queue}/redrive", self.redrive_api, methods=["POST"]),
            Route("/api/v1/admin/redrive/{id}", self.redrive_state, methods=["GET"]),
        ]

    def page(self, request: Request) -> Response:
        qmgr = request.path_params["qmgr"]
        query = request.query_params
        try:
            queues = self.reads.failure_queues(qmgr)
            chosen = query.get("queue") or engine(self.reads.managers.get(qmgr)).dead_letter_queue
            offset = offset_option(query.get("offset"))
            messages = self.reads.messages(qmgr, chosen, message_filter(query), offset=offset, limit=PAGE)
        except Exception as error:  # noqa: BLE001 - every failure is shown as a page
            return failed(self.render, request, error)
        values = {"queues": queues.value, "updated": queues.at, "page": messages, "query": dict(query)}
        return self.render(request, "dead_letters.html", qmgr=qmgr, **values)

    def _start(self, request: Request, msg_ids: list[str] | None, rate: int) -> Redrive:
        """Start a redrive for the request, recorded in the audit table as it starts and ends."""
        qmgr, queue = request.path_params["qmgr"], request.path_params["queue"]
        who = self.security.who(request)

        def record(redrive: Redrive, ok: bool, result: Any) -> None:
            self.reads.changed(redrive.qmgr)
            detail = {"redrive": redrive.id, "msg_ids": len(redrive.msg_ids), "rate": redrive.rate}
            audit.record(self.reads.managers.get(redrive.qmgr), who, "redrive", redrive.queue, detail, ok, result)

        return self.redrives.start(
            qmgr,
            queue,
            msg_ids,
            rate,
            started=lambda redrive: record(redrive, True, "started"),
            finished=lambda redrive: record(redrive, redrive.state == "done", redrive.as_dict()),
        )

    async def redrive_form(self, request: Request) -> Response:
        form = await request.form()
        token = form.get(CSRF_FIELD)
        try:
            self.security.check_write(request, token if isinstance(token, str) else None)
            msg_ids = None if form.get("all") == "1" else [str(value) for value in form.getlist("msg_id")]
            if msg_ids == []:
                raise MQValidationError("redrive: select messages, or redrive all of them")
            redrive = await run_in_threadpool(self._start, request, msg_ids, _rate(form.get("rate")))
        except Exception as error:  # noqa: BLE001 - every failure is shown as a page
            return failed(self.render, request, error)
        return RedirectResponse(f"/redrive/{redrive.id}", status_code=303)

    def progress(self, request: Request) -> Response:
        try:
            self.security.check_admin_read(request)
            redrive = self._redrive(request.path_params["id"])
        except MQError as error:
            return failed(self.render, request, error)
        if not request.headers.get("hx-request"):
            return self.render(request, "redrive.html", redrive=redrive.as_dict())
        # htmx stops polling on 286 once the redrive ended.
        status = 200 if redrive.state == "running" else 286
        return self.render(request, "redrive_progress.html", status=status, redrive=redrive.as_dict())

    async def redrive_api(self, request: Request) -> Response:
        try:
            self.security.check_write(request)
            body = await _json_body(request)
            rate = body.get("rate", DEFAULT_RATE)
            redrive = await run_in_threadpool(self._start, request, body.get("msg_ids"), rate)
        except Exception as error:  # noqa: BLE001 - every failure answers as JSON
            return error_response(error)
        return JSONResponse(redrive.as_dict(), status_code=202)

    def redrive_state(self, request: Request) -> Response:
        try:
            self.security.check_admin_read(request)
            return JSONResponse(self._redrive(request.path_params["id"]).as_dict())
        except MQError as error:
            return error_response(error)

    def _redrive(self, redrive_id: str) -> Redrive:
        redrive = self.redrives.get(redrive_id)
        if redrive is None:
            raise MQError(f"no redrive {redrive_id} here", Reason.MQRC_UNKNOWN_OBJECT_NAME)
        return redrive


def routes(reads: Reads, security: Security, redrives: Redrives, render: Render) -> list[Route]:
    """The dead letters' page and redrive routes; ``render`` renders a template for a request."""
    return _DeadLetters(reads, security, redrives, render).routes()


def _rate(value: Any) -> int:
    if value in (None, ""):
        return DEFAULT_RATE
    try:
        return int(value)
    except (TypeError, ValueError):
        raise MQValidationError(f"redrive: option rate must be a whole number, got {value!r}") from None


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await read_body(request, MAX_BODY_BYTES)
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except ValueError as error:
        raise MQValidationError(f"redrive: the body must be a JSON object: {error}") from None
    if not isinstance(body, dict):
        raise MQValidationError(f"redrive: the body must be a JSON object, got {type(body).__name__}")
    return body
