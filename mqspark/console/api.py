"""The messaging REST API under ``/api/v1``, shaped after IBM MQ's: ``GET`` lists and browses, ``POST
.../message`` puts (the body is the payload, headers carry the message fields), ``DELETE .../message``
gets destructively for a consumer group. Errors are JSON with the MQ reason code and text, and an
HTTP status that says the same: 404 for 2085, 409 for 2042, 403 for an inhibited queue."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mqspark.console.reads import PAGE, PREVIEW_BYTES, MessageFilter, Reads, message_rows
from mqspark.console.security import NotAdmin, Security
from mqspark.console.snapshots import NotReady, polled
from mqspark.errors import MQError, MQValidationError, Reason
from mqspark.qmgr import engine
from mqspark.status import PAYLOAD_VIEWS

# The HTTP status of each reason code; any other validation error is 400, any other error 500.
STATUS = {
    Reason.MQRC_UNKNOWN_OBJECT_NAME: 404,
    Reason.MQRC_Q_DELETED: 404,
    Reason.MQRC_OBJECT_IN_USE: 409,
    Reason.MQRC_GET_INHIBITED: 403,
    Reason.MQRC_PUT_INHIBITED: 403,
    Reason.MQRC_CLUSTER_PUT_INHIBITED: 403,
    Reason.MQRC_NOT_AUTHORIZED: 401,
    Reason.MQRC_Q_FULL: 503,
    Reason.MQRC_MSG_TOO_BIG_FOR_Q: 413,
    Reason.MQRC_CONNECTION_BROKEN: 503,
    Reason.MQRC_Q_MGR_NOT_AVAILABLE: 503,
    Reason.MQRC_BACKED_OUT: 409,
}
# Headers of a put, each a message field (``mq-property: KEY=VALUE`` may repeat).
PUT_HEADERS = {
    "mq-priority": "priority",
    "mq-correl-id": "correl_id",
    "mq-group-id": "group_id",
    "mq-msg-seq-number": "msg_seq_number",
    "mq-last-in-group": "last_in_group",
    "mq-reply-to-queue": "reply_to_queue",
    "mq-reply-to-qmgr": "reply_to_qmgr",
}
_log = logging.getLogger(__name__)
# The longest JSON body an admin request may send.
MAX_BODY_BYTES = 16 * 1024 * 1024
# The longest wait a DELETE may ask for, in seconds.
MAX_WAIT = 60.0


def as_mq_error(error: Exception) -> MQError:
    """``error`` as an MQ error; one that is not (a bug, a store's own error) is logged with its
    traceback and named by its type and text."""
    if isinstance(error, MQError):
        return error
    _log.error("console: %s", error, exc_info=error)
    return MQError(f"console: {type(error).__name__}: {error}")


def error_response(error: Exception) -> JSONResponse:
    """``error`` as the API answers it: its reason code and text, with the matching HTTP status (an
    error that is not an MQ error is 500, logged with its traceback)."""
    error = as_mq_error(error)
    reason = error.reason
    headers = {}
    if isinstance(error, NotAdmin):
        status = 403
    elif reason in STATUS:
        status = STATUS[reason]
    else:
        status = 400 if isinstance(error, MQValidationError) else 500
    if status == 401:
        headers["www-authenticate"] = 'Bearer realm="mqspark console"'
    body = {
        "error": {
            "reason": None if reason is None else int(reason),
            "reason_code": None if reason is None else reason.name,
            "text": str(error),
        }
    }
    return JSONResponse(body, status_code=status, headers=headers)


def routes(reads: Reads, security: Security) -> list[Route]:
    """The API's routes over ``reads`` (and the queue managers behind them), writes checked by ``security``."""
    managers = reads.managers

    def qmgrs(request: Request) -> dict[str, Any]:
        return {"qmgr": reads.qmgrs().value}

    def queues(request: Request) -> dict[str, Any]:
        return {"queue": reads.queues(request.path_params["qmgr"]).value}

    def queue(request: Request) -> dict[str, Any]:
        return reads.queue(request.path_params["qmgr"], request.path_params["queue"]).value

    def history(request: Request) -> dict[str, Any]:
        minutes = _integer(request.query_params, "minutes", 60)
        return reads.history(request.path_params["qmgr"], request.path_params["queue"], minutes).value

    def browse(request: Request) -> dict[str, Any]:
        query = request.query_params
        return reads.messages(
            request.path_params["qmgr"],
            request.path_params["queue"],
            message_filter(query),
            offset=_integer(query, "offset", 0),
            limit=_integer(query, "limit", PAGE),
        )

    def put(request: Request, body: bytes) -> Response:
        qm = managers.get(request.path_params["qmgr"])
        row = _put_row(request, body)
        msg_ids = qm.put(request.path_params["queue"], [row])
        reads.changed(request.path_params["qmgr"])
        return JSONResponse({"msg_id": msg_ids[0]}, status_code=201, headers={"mq-msg-id": msg_ids[0]})

    def put_limit(request: Request) -> int:
        """The longest body a put may send: checked before any of it is read."""
        security.check_write(request)
        queues = engine(managers.get(request.path_params["qmgr"]))
        return queues.resolve_for_put(request.path_params["queue"]).max_message_length

    def get(request: Request) -> Response:
        security.check_write(request)
        query = request.query_params
        consumer = query.get("consumer")
        if not consumer:
            raise MQValidationError("option consumer is needed: the consumer group to get for")
        wait = _number(query, "wait", 0.0)
        if not 0 <= wait <= MAX_WAIT:
            raise MQValidationError(f"option wait must be 0-{MAX_WAIT:g} seconds, got {wait!r}")
        got = managers.get(request.path_params["qmgr"]).get(
            request.path_params["queue"],
            consumer,
            max_messages=_integer(query, "max", 1),
            wait=wait,
            msg_id=query.get("msg_id"),
            correl_id=query.get("correl_id"),
        )
        if got.num_rows == 0:
            return Response(status_code=204)
        reads.changed(request.path_params["qmgr"])
        return JSONResponse({"messages": message_rows(got, PREVIEW_BYTES, payload_option(query))})

    return [
        Route("/api/v1/qmgr", _json(qmgrs), methods=["GET"]),
        Route("/api/v1/qmgr/{qmgr}/queue", _json(queues), methods=["GET"]),
        Route("/api/v1/qmgr/{qmgr}/queue/{queue}", _json(queue), methods=["GET"]),
        Route("/api/v1/qmgr/{qmgr}/queue/{queue}/history", _json(history), methods=["GET"]),
        Route(
            "/api/v1/qmgr/{qmgr}/queue/{queue}/message",
            _message(browse, put_limit, put, get),
            methods=["GET", "POST", "DELETE"],
        ),
    ]


def _json(handler: Callable[[Request], dict[str, Any]]) -> Callable[[Request], Awaitable[Response]]:
    """``handler`` answering a polled answer as JSON (see :func:`~mqspark.console.snapshots.polled`)."""

    def endpoint(request: Request) -> Response:
        try:
            return JSONResponse(handler(request))
        except NotReady:
            raise
        except Exception as error:  # noqa: BLE001 - every failure answers as JSON, never a bare 500
            return error_response(error)

    return polled(endpoint)


def _message(
    browse: Callable[[Request], dict[str, Any]],
    put_limit: Callable[[Request], int],
    put: Callable[[Request, bytes], Response],
    get: Callable[[Request], Response],
) -> Callable[[Request], Any]:
    async def endpoint(request: Request) -> Response:
        try:
            if request.method == "GET":
                return JSONResponse(await run_in_threadpool(browse, request))
            if request.method == "POST":
                limit = await run_in_threadpool(put_limit, request)
                return await run_in_threadpool(put, request, await read_body(request, limit))
            return await run_in_threadpool(get, request)
        except Exception as error:  # noqa: BLE001 - every failure answers as JSON, never a bare 500
            return error_response(error)

    return endpoint


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused with 2030 as soon as it is longer than ``limit`` bytes."""
    too_long = MQError(
        f"queue {request.path_params.get('queue')}: the body is longer than {limit} bytes",
        Reason.MQRC_MSG_TOO_BIG_FOR_Q,
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_long
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_long
    return bytes(body)


def payload_option(query: Any) -> str:
    """How the request asks payloads shown: text (the default), hex or base64."""
    view = query.get("payload") or "text"
    if view not in PAYLOAD_VIEWS:
        raise MQValidationError(f"option payload must be one of {', '.join(PAYLOAD_VIEWS)}, got {view!r}")
    return view


def message_filter(query: Any) -> MessageFilter:
    """The browse filter a request's query asks for (the CLI's browse options, by the same names)."""
    return MessageFilter(
        order=query.get("order", "logical"),
        msg_id=query.get("msg_id") or None,
        correl_id=query.get("correl_id") or None,
        group_id=query.get("group_id") or None,
        msg_seq_number=_integer(query, "msg_seq_number", None),
        priority=_integer(query, "priority", None),
        put_after=_time(query, "put_after"),
        put_before=_time(query, "put_before"),
        complete_message=_flag(query, "complete_message"),
        all_messages_available=_flag(query, "all_messages_available"),
    )


def _put_row(request: Request, body: bytes) -> dict[str, Any]:
    """The message a put's body and headers describe."""
    row: dict[str, Any] = {"payload": body}
    for header, name in PUT_HEADERS.items():
        value = request.headers.get(header)
        if value is None:
            continue
        if name in ("priority", "msg_seq_number"):
            row[name] = _parsed_integer(f"header {header}", value)
        elif name == "last_in_group":
            row[name] = _parsed_flag(f"header {header}", value)
        else:
            row[name] = value
    properties = {}
    for value in request.headers.getlist("mq-property"):
        key, sep, text = value.partition("=")
        if not sep or not key.strip():
            raise MQValidationError(f"header mq-property must be KEY=VALUE, got {value!r}")
        properties[key.strip()] = text
    if properties:
        row["properties"] = properties
    return row


def _integer(query: Any, name: str, default: int | None) -> Any:
    value = query.get(name)
    return default if value in (None, "") else _parsed_integer(f"option {name}", value)


def _parsed_integer(what: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise MQValidationError(f"{what} must be a whole number, got {value!r}") from None


def _number(query: Any, name: str, default: float) -> float:
    value = query.get(name)
    if value in (None, ""):
        return default
    try:
        return float(value)
    except ValueError:
        raise MQValidationError(f"option {name} must be a number of seconds, got {value!r}") from None


def _flag(query: Any, name: str) -> bool:
    value = query.get(name)
    return False if value in (None, "") else _parsed_flag(f"option {name}", value)


def _parsed_flag(what: str, value: str) -> bool:
    lowered = value.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise MQValidationError(f"{what} must be true or false, got {value!r}")


def _time(query: Any, name: str) -> datetime | None:
    value = query.get(name)
    if value in (None, ""):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise MQValidationError(f"option {name} must be an ISO 8601 time, got {value!r}") from None
    if moment.tzinfo is None:
        raise MQValidationError(f"option {name} must name its time zone (as 2026-11-28T10:00:00Z), got {value!r}")
    return moment
