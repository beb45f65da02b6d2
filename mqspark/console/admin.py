"""The console's admin actions, only with ``--admin`` and a signed-in browser or the token: put a
test message, purge, inhibit or allow puts and gets, alter attributes; and the audit table they are
recorded in. Each page action asks for confirmation: the operator types the queue's name. The same
actions are in the REST API under ``/api/v1/admin``."""

from __future__ import annotations

import json
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from mqspark.console import audit
from mqspark.console.api import MAX_BODY_BYTES, error_response, read_body
from mqspark.console.pages import Render, failed, segment
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


class _Admin:
    """The admin page, its form actions and the admin API."""

    def __init__(self, reads: Reads, security: Security, render: Render) -> None:
        self.reads, self.managers, self.security, self.render = reads, reads.managers, security, render

    def routes(self) -> list[Route]:
        return [
            Route("/qmgr/{qmgr}/queue/{queue}/admin", self.page, methods=["GET"]),
            Route("/qmgr/{qmgr}/queue/{queue}/admin/{action}", self.form_action, methods=["POST"]),
            Route("/api/v1/admin/qmgr/{qmgr}/queue/{queue}/{action}", self.api_action, methods=["POST"]),
            Route("/api/v1/admin/qmgr/{qmgr}/audit", self.audit_api, methods=["GET"]),
        ]

    def recorded(self, request: Request, action: str, values: dict[str, Any]) -> Any:
        """Do the action and record it in the audit table, done or failed."""
        qmgr, queue = request.path_params["qmgr"], request.path_params["queue"]
        qm = self.managers.get(qmgr)
        detail = {key: value for key, value in values.items() if key != "payload"}
        who = self.security.who(request)
        try:
            result = act(qm, queue, action, values)
        except MQError as error:
            audit.record(qm, who, action, queue, detail, False, str(error))
            raise
        finally:
            self.reads.changed(qmgr)
        audit.record(qm, who, action, queue, detail, True, result)
        return result

    def page(self, request: Request) -> Response:
        qmgr = request.path_params["qmgr"]
        try:
            qm = self.managers.get(qmgr)
            definition = qm.inquire_queue(request.path_params["queue"])
            # What admins did is for admins: the audit shows only to a signed-in browser.
            actions = audit.read(qm, 20) if self.security.signed_in(request) else []
        except Exception as error:  # noqa: BLE001 - every failure is shown as a page
            return failed(self.render, request, error)
        attributes = {name: getattr(definition, name, None) for name in ALTERABLE}
        values = {"qmgr": qmgr, "queue": definition.name, "attributes": attributes, "actions": actions}
        return self.render(request, "admin.html", done=request.query_params.get("done"), **values)

    async def form_action(self, request: Request) -> Response:
        qmgr, queue, action = (request.path_params[key] for key in ("qmgr", "queue", "action"))
        form = await request.form()
        token = form.get(CSRF_FIELD)
        try:
            self.security.check_write(request, token if isinstance(token, str) else None)
            if form.get("confirm") != queue:
                raise MQValidationError(f"{action}: type the queue's name ({queue}) to confirm")
            await run_in_threadpool(self.recorded, request, action, _form_values(action, form))
        except Exception as error:  # noqa: BLE001 - every failure is shown as a page
            return failed(self.render, request, error)
        return RedirectResponse(f"/qmgr/{segment(qmgr)}/queue/{segment(queue)}/admin?done={action}", status_code=303)

    async def api_action(self, request: Request) -> Response:
        action = request.path_params["action"]
        try:
            self.security.check_write(request)
            raw = await read_body(request, MAX_BODY_BYTES)
            try:
                values = json.loads(raw) if raw else {}
            except ValueError as error:
                raise MQValidationError(f"{action}: the body must be JSON: {error}") from None
            if not isinstance(values, dict):
                raise MQValidationError(f"{action}: the body must be a JSON object")
            return JSONResponse(await run_in_threadpool(self.recorded, request, action, values))
        except Exception as error:  # noqa: BLE001 - every failure answers as JSON
            return error_response(error)

    def audit_api(self, request: Request) -> Response:
        try:
            self.security.check_admin_read(request)
            return JSONResponse({"audit": audit.read(self.managers.get(request.path_params["qmgr"]))})
        except Exception as error:  # noqa: BLE001 - every failure answers as JSON
            return error_response(error)


def routes(reads: Reads, security: Security, render: Render) -> list[Route]:
    """The admin page, its form actions and the admin API."""
    return _Admin(reads, security, render).routes()


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
