"""The ``mqspark`` commands that administer a queue manager and its queues: ``qmgr``, ``queue``,
``consumer`` (a queue's consumer groups), ``depth`` and ``apply`` (a TOML definition file)."""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
from typing import Any

from mqspark.cli.parser import Commands, add_attribute_options, checked_root, open_root
from mqspark.errors import MQError
from mqspark.model.definitions import ATTRIBUTE_NAMES, MAX_DESCRIPTION_LENGTH, RECONNECT_MODES, QueueDefinition
from mqspark.qmgr import QueueManager, engine
from mqspark.status import FAILURE_KEYS, HEALTH_KEYS, depths


def add_qmgr(commands: Commands, output: argparse.ArgumentParser) -> None:
    """``qmgr create``, ``qmgr show`` and ``qmgr alter``."""
    qmgr = commands.add_parser("qmgr", help="create, alter or show the queue manager").add_subparsers(
        dest="action", required=True
    )
    create = qmgr.add_parser("create", parents=[output], help="create a queue manager at --root")
    create.add_argument("name")
    create.set_defaults(handler=_create_qmgr)
    qmgr.add_parser("show", parents=[output], help="show the queue manager").set_defaults(handler=_show_qmgr)
    alter = qmgr.add_parser("alter", parents=[output], help="alter the queue manager's attributes")
    alter.add_argument("--description", help=f"text, up to {MAX_DESCRIPTION_LENGTH} characters")
    alter.add_argument(
        "--default-reconnect",
        choices=RECONNECT_MODES,
        help=f"{', '.join(RECONNECT_MODES)}: the reconnect mode of clients that give none; disabled overrides "
        "every client's (DefRecon)",
    )
    alter.set_defaults(handler=_alter_qmgr)


def _create_qmgr(args: argparse.Namespace) -> dict[str, Any]:
    qm = QueueManager.create(checked_root(args.root), args.name)
    return {"name": qm.name, "root": qm.root, "dead_letter_queue": engine(qm).dead_letter_queue}


def _show_qmgr(args: argparse.Namespace) -> dict[str, Any]:
    return _qmgr_attributes(open_root(args.root, args.clock))


def _alter_qmgr(args: argparse.Namespace) -> dict[str, Any]:
    qm = open_root(args.root, args.clock)
    given = {"description": args.description, "default_reconnect": args.default_reconnect}
    qm.alter_qmgr(**{name: value for name, value in given.items() if value is not None})
    return _qmgr_attributes(qm)


def _qmgr_attributes(qm: QueueManager) -> dict[str, Any]:
    definition = engine(qm).definition
    return {
        "name": qm.name,
        "qmid": qm.qmid,
        "root": qm.root,
        "dead_letter_queue": definition.dead_letter_queue,
        "default_reconnect": definition.default_reconnect,
        "description": definition.description,
        "queues": len(qm.queues()),
    }


def add_queue(commands: Commands, output: argparse.ArgumentParser) -> None:
    """``queue define``, ``alter``, ``show``, ``list`` and ``delete``."""
    queue = commands.add_parser("queue", help="define, alter, show, list or delete queues").add_subparsers(
        dest="action", required=True
    )
    for action, handler in (("define", _define_queue), ("alter", _alter_queue)):
        sub = queue.add_parser(action, parents=[output], help=f"{action} a queue")
        sub.add_argument("name")
        add_attribute_options(sub, defined=action == "define")
        sub.set_defaults(handler=handler)
    show = queue.add_parser("show", parents=[output], help="show a queue's attributes")
    show.add_argument("name")
    show.set_defaults(handler=_show_queue)
    queue.add_parser("list", parents=[output], help="list the queues").set_defaults(handler=_list_queues)
    delete = queue.add_parser("delete", parents=[output], help="delete a queue")
    delete.add_argument("name")
    delete.add_argument("--purge", action="store_true", help="discard the queue's messages")
    delete.set_defaults(handler=_delete_queue)


def _attributes(args: argparse.Namespace) -> dict[str, Any]:
    """The queue attributes given as options."""
    return {name: getattr(args, name) for name in ATTRIBUTE_NAMES if hasattr(args, name)}


def _define_queue(args: argparse.Namespace) -> dict[str, Any]:
    return open_root(args.root, args.clock).define_queue(args.name, **_attributes(args)).attributes()


def _alter_queue(args: argparse.Namespace) -> dict[str, Any]:
    return open_root(args.root, args.clock).alter_queue(args.name, **_attributes(args)).attributes()


def _show_queue(args: argparse.Namespace) -> dict[str, Any]:
    shown = open_root(args.root, args.clock).inquire_queue(args.name)
    # A cluster queue defined elsewhere shows its advertised attributes only.
    return shown.attributes() if isinstance(shown, QueueDefinition) else dataclasses.asdict(shown)


def _list_queues(args: argparse.Namespace) -> list[dict[str, Any]]:
    qm = open_root(args.root, args.clock)
    return [
        {"name": q.name, "type": q.type, "depth": qm.depth(q.name), "description": q.description} for q in qm.queues()
    ]


def _delete_queue(args: argparse.Namespace) -> dict[str, Any]:
    open_root(args.root, args.clock).delete_queue(args.name, purge=args.purge)
    return {"deleted": args.name}


def add_consumer(commands: Commands, output: argparse.ArgumentParser) -> None:
    """``consumer declare``, ``delete`` and ``list``: a queue's consumer groups."""
    consumer = commands.add_parser("consumer", help="declare, delete or list a queue's consumer groups").add_subparsers(
        dest="action", required=True
    )
    for action, text, handler in (
        ("declare", "declare a consumer group before it first reads, so messages wait for it", _declare_consumer),
        ("delete", "delete a consumer group, releasing the messages that wait only for it", _delete_consumer),
    ):
        sub = consumer.add_parser(action, parents=[output], help=text)
        sub.add_argument("queue")
        sub.add_argument("group")
        sub.set_defaults(handler=handler)
    listing = consumer.add_parser("list", parents=[output], help="the consumer groups that count for the depth")
    listing.add_argument("queue")
    listing.set_defaults(handler=_list_consumers)


def _declare_consumer(args: argparse.Namespace) -> list[dict[str, Any]]:
    qm = open_root(args.root, args.clock)
    qm.declare_consumer(args.queue, args.group)
    return _consumers(qm, args.queue)


def _delete_consumer(args: argparse.Namespace) -> list[dict[str, Any]]:
    qm = open_root(args.root, args.clock)
    qm.delete_consumer(args.queue, args.group)
    return _consumers(qm, args.queue)


def _list_consumers(args: argparse.Namespace) -> list[dict[str, Any]]:
    return _consumers(open_root(args.root, args.clock), args.queue)


def _consumers(qm: QueueManager, queue: str) -> list[dict[str, Any]]:
    return [{"queue": queue, "consumer": name} for name in qm.consumers(queue)]


def add_depth(commands: Commands, output: argparse.ArgumentParser) -> None:
    """``depth``: every queue's, or one queue's."""
    depth = commands.add_parser(
        "depth",
        parents=[output],
        help="queue depth and oldest message age, in all and per consumer group (every queue when none is named)",
    )
    depth.add_argument("queue", nargs="?")
    depth.set_defaults(handler=_depth)


def _depth(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = depths(open_root(args.root, args.clock), args.queue)
    if args.json:
        return rows
    hidden: set[str] = set()
    if not any(row["consumer"] for row in rows):
        hidden.update(HEALTH_KEYS)
    if not any(row["backout_queue"] or row["error_queue"] or row["dead_letters"] for row in rows):
        hidden.update(FAILURE_KEYS)
    return [{key: value for key, value in row.items() if key not in hidden} for row in rows]


def add_apply(commands: Commands, output: argparse.ArgumentParser) -> None:
    """``apply``: create or update a queue manager from a TOML file."""
    apply = commands.add_parser(
        "apply",
        parents=[output],
        help="create or update a queue manager from a TOML definition file; each queue is reported as "
        "defined, altered or unchanged",
    )
    apply.add_argument("file", help="the TOML file (examples/queue-manager.toml is one)")
    apply.set_defaults(handler=_apply)


def _apply(args: argparse.Namespace) -> dict[str, Any]:
    path = args.file
    with open(path, "rb") as handle:
        document = tomllib.load(handle)
    name = document.get("queue_manager", {}).get("name")
    if not name:
        raise MQError(f"{path}: [queue_manager] name is missing")
    root = checked_root(args.root)
    try:
        qm = QueueManager.open(root)
    except MQError:
        qm = QueueManager.create(root, name)
    if qm.name != name:
        raise MQError(f"{path}: the queue manager at {qm.root} is {qm.name}, not {name}")
    existing = {q.name: q for q in qm.queues()}
    queues = document.get("queues", {})
    planned = _planned(path, existing, queues)
    changes = []

    def order(item: tuple[str, dict]) -> tuple[bool, bool]:
        # Local queues first, so that every alias finds its target; queues naming a backout or error
        # queue after the others, so that it exists.
        definition = planned[item[0]]
        return definition.type != "local", bool(definition.backout_queue or definition.error_queue)

    for queue, attributes in sorted(queues.items(), key=order):
        if planned[queue] == existing.get(queue):
            changes.append({"queue": queue, "action": "unchanged"})
        elif queue in existing:
            attributes = {key: value for key, value in attributes.items() if key != "type"}
            qm.alter_queue(queue, **attributes)
            changes.append({"queue": queue, "action": "altered"})
        else:
            qm.define_queue(queue, **attributes)
            changes.append({"queue": queue, "action": "defined"})
    return {"queue_manager": qm.name, "root": qm.root, "changes": changes}


def _planned(
    path: str, existing: dict[str, QueueDefinition], queues: dict[str, dict[str, Any]]
) -> dict[str, QueueDefinition]:
    """Every queue as the file leaves it, validated, alias targets and failure queues included, before
    any changes, so that a bad file changes nothing."""
    planned = dict(existing)
    for queue, attributes in queues.items():
        if queue in existing:
            current = existing[queue].type
            if attributes.get("type", current) != current:
                raise MQError(f"{path}: queue {queue} is {current}; its type cannot change to {attributes['type']}")
            planned[queue] = QueueDefinition.build(queue, base=existing[queue], **attributes)
        else:
            planned[queue] = QueueDefinition.build(queue, **attributes)
    for definition in planned.values():
        target = planned.get(definition.alias_target) if definition.type == "alias" else definition
        if target is None or target.type != "local":
            raise MQError(
                f"{path}: queue {definition.name}: target_queue {definition.target_queue} is not a local queue"
            )
    for definition in planned.values():
        for attribute in ("backout_queue", "error_queue"):
            named = getattr(definition, attribute)
            if named is not None and (named not in planned or named == definition.name):
                raise MQError(f"{path}: queue {definition.name}: {attribute} {named} is not another defined queue")
    return planned
