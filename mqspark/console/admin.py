"""The console's admin actions, only with ``--admin`` and a signed-in browser or the token: put a
test message, purge, inhibit or allow puts and gets, alter attributes; and the audit table they are
recorded in. Each page action asks for confirmation: the operator types the queue's name. The same
actions are in the REST API under ``/api/v1/admin``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from mqspark.console import audit
from mqspark.console.api import error_response
from mqspark.console.reads import Reads
from mqspark.console.security import CSRF_FIELD, Security
from mqspark.errors import MQError, MQValidationError
from mqspark.model.definitions import ATTRIBUTE_NAMES, QueueDefinition
from mqspark.qmgr import QueueManager
from mqspark.services.instances import switchover

ACTIONS = ("put", "purge", "inhibit_put", "allow_put", "inhibit_get", "allow_get", "alter", "switchover")
# The attributes an admin may alter from the page (type and cluster membership need the CLI).
ALTERABLE = tuple(name for name in ATTRIBUTE_NAMES if name not in ("type", "target_queue", "cluster"))


def act(qm: QueueManager, queue: str, action: str, values: dict[str, Any]) -> Any:
    """Do admin ``action`` on ``queue``; its result as JSON shows it."""
    if action == "put":
        payload = values.get("payload")
        if not isinstance(payload, str):
            raise MQValidationError(f"put: queue {queue}: field payload must be text, got {payload!r}")
        row: dict[str, Any] = {"payload": payload.encode()}
        if values.get("priority") not in (None, ""):
            row["priority"] = _whole(values["priority"], "priority")
        return {"msg_ids": qm.put(queue, [row])}
    if action == "purge":
        return {"purged": qm.purge(queue)}
    if action in ("inhibit_put", "allow_put", "inhibit_get", "allow_get"):
        verb, what = action.split("_")
        definition = qm.alter_queue(queue, **{f"{what}_inhibited": verb == "inhibit"})
        return {f"{what}_inhibited": getattr(definition, f"{what}_inhibited")}
    if action == "alter":
        attributes = values.get("attributes")
        if not isinstance(attributes, dict) or not attributes:
            raise MQValidationError(
                f"alter: queue {queue}: attributes must be an object of attributes, got {attributes!r}"
            )
        unknown = sorted(set(attributes) - set(ALTERABLE))
        if unknown:
            raise MQValidationError(f"alter: queue {queue}: attribute {unknown[0]!r} cannot be altered here")
        definition = qm.alter_queue(queue, **attributes)
        return {name: getattr(definition, name) for name in attributes}
    if action == "switchover":
        consumer = values.get("consumer")
        if not isinstance(consumer, str) or not consumer:
            raise MQValidationError(f"switchover: queue {queue}: field consumer must name the consumer group")
        switchover(qm, queue, consumer)
        return {"switchover": consumer}
    raise MQValidationError(f"admin: action must be one of {', '.join(ACTIONS)}, got {action!r}")


def routes(reads: Reads, security: Security, render: Callable[..., HTMLResponse]) -> list[Route]:
    """The admin page, its form actions and the admin API."""
    managers = reads.managers

    def recorded(request: Request, qmgr: str, queue: str, action: str, values: dict[str, Any]) -> Any:
        """Do the action and record it in the audit table, done or failed."""
        qm = managers.get(qmgr)
        detail = {key: value for key, value in values.items() if key != "payload"}
        try:
            result = act(qm, queue, action, values)
        except MQError as error:
            audit.record(qm, security.who(request), action, queue, detail, False, str(error))
            raise
        audit.record(qm, security.who(request), action, queue, detail, True, result)
        return result

    def page(request: Request) -> Response:
        qmgr, queue = request.path_params["qmgr"], request.path_params["queue"]
        try:
            definition = managers.get(qmgr).inquire_queue(queue)
            actions = audit.read(managers.get(qmgr), 20)
        except MQError as error:
            return render(request, "error.html", status=error_response(error).status_code, error=str(error))
        attributes = {name: getattr(definition, name, None) for name in ALTERABLE}
        done = request.query_params.get("done")
        return render(
            request, "admin.html", qmgr=qmgr, queue=definition.name, attributes=attributes, actions=actions, done=done
        )

    async def form_action(request: Request) -> Response:
        qmgr, queue, action = (request.path_params[key] for key in ("qmgr", "queue", "action"))
        form = await request.form()
        token = form.get(CSRF_FIELD)
        try:
            security.check_write(request, token if isinstance(token, str) else None)
            if form.get("confirm") != queue:
                raise MQValidationError(f"{action}: type the queue's name ({queue}) to confirm")
            recorded(request, qmgr, queue, action, _form_values(action, form))
        except MQError as error:
            return render(request, "error.html", status=error_response(error).status_code, error=str(error))
        return RedirectResponse(f"/qmgr/{qmgr}/queue/{queue}/admin?done={action}", status_code=303)

    async def api_action(request: Request) -> Response:
        qmgr, queue, action = (request.path_params[key] for key in ("qmgr", "queue", "action"))
        try:
            security.check_write(request)
            raw = await request.body()
            values = json.loads(raw) if raw else {}
            if not isinstance(values, dict):
                raise MQValidationError(f"{action}: the body must be a JSON object")
            return JSONResponse(recorded(request, qmgr, queue, action, values))
        except ValueError as error:
            if isinstance(error, MQError):
                return error_response(error)
            return error_response(MQValidationError(f"{action}: the body must be JSON: {error}"))
        except MQError as error:
            return error_response(error)

    def audit_api(request: Request) -> Response:
        try:
            security.check_write(request)
            return JSONResponse({"audit": audit.read(managers.get(request.path_params["qmgr"]))})
        except MQError as error:
            return error_response(error)

    return [
        Route("/qmgr/{qmgr}/queue/{queue}/admin", page, methods=["GET"]),
        Route("/qmgr/{qmgr}/queue/{queue}/admin/{action}", form_action, methods=["POST"]),
        Route("/api/v1/admin/qmgr/{qmgr}/queue/{queue}/{action}", api_action, methods=["POST"]),
        Route("/api/v1/admin/qmgr/{qmgr}/audit", audit_api, methods=["GET"]),
    ]


def _form_values(action: str, form: FormData) -> dict[str, Any]:
    """What a page's form gives an action: the test message, or the attributes it changes."""
    if action == "put":
        return {"payload": form.get("payload"), "priority": form.get("priority")}
    if action == "switchover":
        return {"consumer": form.get("consumer")}
    if action != "alter":
        return {}
    defaults = QueueDefinition(name="DEFAULTS")
    attributes = {}
    for name in ALTERABLE:
        value = form.get(name)
        if isinstance(value, str) and value != "":
            attributes[name] = _typed(name, value, getattr(defaults, name))
    return {"attributes": attributes}


def _typed(name: str, text: str, default: Any) -> Any:
    """An attribute's value from a form, typed as its default is."""
    if isinstance(default, bool):
        if text not in ("true", "false"):
            raise MQValidationError(f"attribute {name} must be true or false, got {text!r}")
        return text == "true"
    if isinstance(default, int):
        return _whole(text, name)
    if isinstance(default, float):
        try:
            return float(text)
        except ValueError:
            raise MQValidationError(f"attribute {name} must be a number, got {text!r}") from None
    return text


def _whole(value: Any, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise MQValidationError(f"field {name} must be a whole number, got {value!r}") from None
