"""The ``mqspark`` command line: queue managers, queues, put, browse, depth and clusters, with table or JSON output."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import tomllib
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from mqspark import jobs
from mqspark.cluster.records import ROUTE_STATES
from mqspark.cluster.repository import Cluster
from mqspark.engine.maintenance import DEFAULT_RETENTION
from mqspark.engine.ordering import ORDERS, DeliveryOptions
from mqspark.errors import MQError, Reason
from mqspark.model.definitions import ATTRIBUTE_NAMES, RECONNECT_MODES, QueueDefinition
from mqspark.model.messages import DEAD_LETTER_FIELDS
from mqspark.qmgr import QueueManager
from mqspark.services.backlog_judge import Verdict
from mqspark.services.instances import instances, switchover
from mqspark.services.monitor import Monitor, group_health

DEFAULT_ROOT = "./mq-data"
# Job files under mqspark/jobs, for spark-submit.
JOBS = ("forward",)
_BROWSE_COLUMNS = ("msg_id", "priority", "group_id", "msg_seq_number", "offset", "correl_id", "put_time", "payload")
# Shown by browse for the queues failed messages go to, before the payload: MQ's dead-letter header.
_HEADER_COLUMNS = ("backout_count", *DEAD_LETTER_FIELDS)
# Shown by depth beside each source queue: its failure queues and its failed messages waiting there.
_FAILURE_KEYS = ("backout_queue", "backed_out", "error_queue", "errors", "dead_letters")
_HEALTH_KEYS = ("status", "claimable_age_s", "rate_per_s", "held_by")


def _boolean(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "yes", "1", "on"):
        return True
    if lowered in ("false", "no", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _cluster(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _attribute_parser(default: Any):
    if isinstance(default, bool):
        return _boolean
    if isinstance(default, int):
        return int
    if isinstance(default, float):
        return float
    if isinstance(default, tuple):
        return _cluster
    return str


def _add_attribute_options(parser: argparse.ArgumentParser) -> None:
    defaults = QueueDefinition(name="DEFAULTS")
    for name in ATTRIBUTE_NAMES:
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            type=_attribute_parser(getattr(defaults, name)),
            default=argparse.SUPPRESS,
            metavar=name.upper(),
        )


def _duration(text: str) -> timedelta:
    """A duration: whole seconds, or a number with s, m, h or d."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "s")
    try:
        return timedelta(seconds=float(number) * units[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a duration is seconds, or a number with s, m, h or d; got {text!r}"
        ) from None


def _property(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mqspark", description="Message queues on Delta tables.")
    parser.add_argument(
        "--root",
        default=os.environ.get("MQSPARK_ROOT", DEFAULT_ROOT),
        help=f"queue manager root (default: $MQSPARK_ROOT or {DEFAULT_ROOT})",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    # --json is accepted after the command too (mqspark browse Q --json).
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    commands = parser.add_subparsers(dest="command", required=True)

    qmgr = commands.add_parser("qmgr", help="create, alter or show the queue manager").add_subparsers(
        dest="action", required=True
    )
    qmgr.add_parser("create", parents=[output], help="create a queue manager at --root").add_argument("name")
    qmgr.add_parser("show", parents=[output], help="show the queue manager")
    alter_qmgr = qmgr.add_parser("alter", parents=[output], help="alter the queue manager's attributes")
    alter_qmgr.add_argument("--description")
    alter_qmgr.add_argument(
        "--default-reconnect",
        choices=RECONNECT_MODES,
        help="the reconnect mode of clients that give none; disabled overrides every client's (DefRecon)",
    )

    queue = commands.add_parser("queue", help="define, alter, show, list or delete queues").add_subparsers(
        dest="action", required=True
    )
    for action in ("define", "alter"):
        sub = queue.add_parser(action, parents=[output], help=f"{action} a queue")
        sub.add_argument("name")
        _add_attribute_options(sub)
    queue.add_parser("show", parents=[output], help="show a queue's attributes").add_argument("name")
    queue.add_parser("list", parents=[output], help="list the queues")
    delete = queue.add_parser("delete", parents=[output], help="delete a queue")
    delete.add_argument("name")
    delete.add_argument("--purge", action="store_true", help="discard the queue's messages")

    put = commands.add_parser("put", parents=[output], help="put messages: arguments, --file lines, or stdin lines")
    put.add_argument("queue")
    put.add_argument("payloads", nargs="*", metavar="PAYLOAD")
    put.add_argument("--file", help="put one message per line of this file ('-' for stdin)")
    put.add_argument("--priority", type=int)
    put.add_argument("--correl-id")
    put.add_argument("--reply-to-queue")
    put.add_argument("--reply-to-qmgr")
    put.add_argument("--failure-queue", help="where a forwarding service puts the request when it finally fails")
    put.add_argument("--group-id", help="put the messages as one complete group, numbered 1..N")
    put.add_argument("--property", action="append", type=_property, default=[], metavar="KEY=VALUE")
    put.add_argument("--segmentation", action="store_true", help="split payloads longer than max_message_length")
    put.add_argument("--top-of-queue", action="store_true", help="put ahead of every message of its priority")
    put.add_argument("--before-msg-id", help="put just before this message")

    commands.add_parser("jars", help="print Delta's jars (resolved once) for spark-submit --jars, comma-separated")
    job = commands.add_parser("job", help="print the path of a job file to run with spark-submit")
    job.add_argument("name", choices=JOBS, help="forward: the forwarding service")

    browse = commands.add_parser("browse", parents=[output], help="show messages without removing them")
    browse.add_argument("queue")
    browse.add_argument("--order", choices=ORDERS, default="logical")
    browse.add_argument("--all-messages-available", action="store_true", help="only complete groups")
    browse.add_argument("--complete-message", action="store_true", help="join segments into whole messages")
    browse.add_argument("--msg-id")
    browse.add_argument("--correl-id")
    browse.add_argument("--group-id")
    browse.add_argument("--msg-seq-number", type=int)
    browse.add_argument("--limit", type=int)

    get = commands.add_parser(
        "get", parents=[output], help="get messages destructively for a consumer group, in logical order (amqsget)"
    )
    get.add_argument("queue")
    get.add_argument("--consumer", default="default", help="consumer group (default: default)")
    get.add_argument("--wait", type=float, default=0.0, help="seconds to wait for a first message (default 0)")
    get.add_argument("--max", type=int, default=1, dest="max_messages", help="most messages to get (default 1)")
    get.add_argument("--correl-id")
    get.add_argument("--msg-id")

    depth = commands.add_parser(
        "depth",
        parents=[output],
        help="queue depth and oldest message age, in all and per consumer group (every queue when none is named)",
    )
    depth.add_argument("queue", nargs="?")

    monitor = commands.add_parser(
        "monitor",
        parents=[output],
        help="the OpenTP1 backlog monitor of a queue and consumer group: a line per point (JSON with "
        "--json); exit code 2 on an abort verdict",
    )
    monitor.add_argument("--queue", required=True)
    monitor.add_argument("--consumer", default="default", help="consumer group (default: default)")
    monitor.add_argument("--watch-interval", type=float, required=True, help="seconds between points")
    monitor.add_argument("--watch-count", type=int, required=True, help="backlog at which judging starts")
    monitor.add_argument(
        "--expected-count", type=int, required=True, help="messages the group is expected to process per interval"
    )
    monitor.add_argument("--abort", type=_boolean, default=False, help="yes: stop the group's query on falling behind")
    monitor.add_argument("--points", type=int, help="stop after this many points (default: run until interrupted)")
    monitor.add_argument("--window", type=int, default=10, help="points the group's status is judged over")
    monitor.add_argument("--depth-high", type=float, default=80.0, help="depth high event, %% of max_depth")
    monitor.add_argument("--depth-low", type=float, default=20.0, help="depth low event, %% of max_depth")
    monitor.add_argument("--service-interval", type=float, help="seconds without a get before that event")

    apply = commands.add_parser(
        "apply", parents=[output], help="create or update a queue manager from a TOML definition file"
    )
    apply.add_argument("file")

    maintain = commands.add_parser(
        "maintain",
        parents=[output],
        help="remove consumed and expired messages, compact files, clean up the log and vacuum "
        "(every local queue when none is named)",
    )
    maintain.add_argument("queue", nargs="?")
    maintain.add_argument(
        "--retention",
        type=_duration,
        default=DEFAULT_RETENTION,
        help="keep removed files and log entries this long for time travel: seconds, or with s, m, h or d (default 1h)",
    )
    purge = commands.add_parser(
        "purge", parents=[output], help="remove every message of a local queue for every consumer group (CLEAR QLOCAL)"
    )
    purge.add_argument("queue")
    redrive = commands.add_parser(
        "redrive",
        parents=[output],
        help="move messages of a backout, error or dead-letter queue back to the queues they came from",
    )
    redrive.add_argument("queue")
    redrive.add_argument("--msg-id", action="append", dest="msg_ids", help="only this msg_id (repeatable)")
    redrive.add_argument("--correl-id", action="append", dest="correl_ids", help="only this correl_id (repeatable)")
    redrive.add_argument(
        "--reason", action="append", type=int, dest="reasons", help="only this dlq_reason (repeatable)"
    )

    consumer = commands.add_parser("consumer", help="declare, delete or list a queue's consumer groups").add_subparsers(
        dest="action", required=True
    )
    for action, text in (
        ("declare", "declare a consumer group before it first reads, so messages wait for it"),
        ("delete", "delete a consumer group, releasing the messages that wait only for it"),
    ):
        sub = consumer.add_parser(action, parents=[output], help=text)
        sub.add_argument("queue")
        sub.add_argument("group")
    consumer.add_parser("list", parents=[output], help="the consumer groups that count for the depth").add_argument(
        "queue"
    )

    instance = commands.add_parser(
        "instance", help="the instances of a consumer group's service: active and standby"
    ).add_subparsers(dest="action", required=True)
    listing = instance.add_parser("list", parents=[output], help="each instance: role, host, pid, since, heartbeat")
    listing.add_argument("queue")
    listing.add_argument("--consumer", default="default", help="consumer group (default: default)")
    listing.add_argument(
        "--lease-timeout", type=float, default=30.0, help="the service's lease timeout in seconds (default 30)"
    )
    handover = instance.add_parser(
        "switchover", parents=[output], help="ask the active instance to hand over to a standby (endmqm -s)"
    )
    handover.add_argument("queue")
    handover.add_argument("--consumer", default="default", help="consumer group (default: default)")
    _add_cluster_commands(commands, output)
    return parser


def _add_cluster_commands(commands: Any, output: argparse.ArgumentParser) -> None:
    cluster = commands.add_parser(
        "cluster",
        help="cluster repositories: create, join, leave, advertise queues, route states, health check",
        description="Every command but create names the cluster with --cluster-root CLUSTER_ROOT, or with "
        "--cluster NAME, a cluster the --root queue manager has joined. --qmgr defaults to the --root queue manager.",
    ).add_subparsers(dest="action", required=True)
    create = cluster.add_parser(
        "create", parents=[output], help="create the repository of cluster NAME at CLUSTER_ROOT"
    )
    create.add_argument("name", metavar="NAME")
    create.add_argument("cluster_root", metavar="CLUSTER_ROOT")

    which = argparse.ArgumentParser(add_help=False)
    named = which.add_mutually_exclusive_group(required=True)
    named.add_argument("--cluster-root", metavar="CLUSTER_ROOT", help="root of the cluster repository")
    named.add_argument("--cluster", metavar="NAME", help="a cluster the --root queue manager has joined")
    member = argparse.ArgumentParser(add_help=False)
    member.add_argument("--qmgr", metavar="QMGR", help="the member (default: the --root queue manager)")

    join = cluster.add_parser("join", parents=[output, which], help="the --root queue manager joins the cluster")
    join.add_argument("--network-priority", type=int, default=0, metavar="0-9")
    cluster.add_parser("leave", parents=[output, which, member], help="a member leaves, with its advertisements")
    cluster.add_parser(
        "advertise", parents=[output, which], help="advertise a local queue of the --root queue manager"
    ).add_argument("queue", metavar="QUEUE")
    cluster.add_parser(
        "unadvertise", parents=[output, which, member], help="withdraw a member's advertisement of QUEUE"
    ).add_argument("queue", metavar="QUEUE")
    cluster.add_parser(
        "suspend", parents=[output, which, member], help="suspend a member (routing prefers resumed ones)"
    )
    cluster.add_parser("resume", parents=[output, which, member], help="resume a suspended member")
    route_state = cluster.add_parser(
        "route-state",
        parents=[output, which, member],
        help="set a member's route state, kept by the health check; auto hands it back to the health check",
    )
    route_state.add_argument(
        "state", choices=[*ROUTE_STATES, "auto"], metavar="STATE", help=f"{', '.join(ROUTE_STATES)} or auto"
    )
    route_state.add_argument("--by", help="who sets it (default: the operating-system user)")
    cluster.add_parser(
        "priority", parents=[output, which, member], help="set a member's network priority (0-9)"
    ).add_argument("network_priority", type=int, metavar="N")
    show = cluster.add_parser("show", parents=[output, which], help="the members (or advertised queues, or bindings)")
    shown = show.add_mutually_exclusive_group()
    shown.add_argument("--queues", action="store_true", help="show the advertised queues")
    shown.add_argument("--bindings", action="store_true", help="show the bindings of producers and groups")
    show.add_argument("--snapshot", type=int, metavar="VERSION", help="as at this version of the repository")
    trim = cluster.add_parser(
        "maintain",
        parents=[output, which],
        help="trim the repository's history, keeping every snapshot a producer's replay may route with",
    )
    trim.add_argument("--retention", type=_duration, default=DEFAULT_RETENTION, help="as for maintain (default 1h)")
    cluster.add_parser(
        "refresh", parents=[output, which], help="health-check every member, then show the members"
    ).add_argument("--active-within", type=float, default=300.0, metavar="SECONDS", help="default: 300")


def _payloads(args: argparse.Namespace) -> list[str]:
    if args.payloads and args.file:
        raise MQError("give payloads as arguments or with --file, not both")
    if args.payloads:
        return args.payloads
    if args.file and args.file != "-":
        with open(args.file, encoding="utf-8") as handle:
            return handle.read().splitlines()
    return sys.stdin.read().splitlines()


def _put(qm: QueueManager, args: argparse.Namespace) -> dict[str, Any]:
    payloads = _payloads(args)
    common = {
        "priority": args.priority,
        "correl_id": args.correl_id,
        "reply_to_queue": args.reply_to_queue,
        "reply_to_qmgr": args.reply_to_qmgr,
        "failure_queue": args.failure_queue,
        "properties": dict(args.property) or None,
        "top_of_queue": args.top_of_queue or None,
        "before_msg_id": args.before_msg_id,
    }
    rows = [{key: value for key, value in common.items() if value is not None} | {"payload": p} for p in payloads]
    if args.group_id:
        for number, row in enumerate(rows, start=1):
            row.update(group_id=args.group_id, msg_seq_number=number, last_in_group=number == len(rows))
    msg_ids = qm.put(args.queue, rows, segmentation=args.segmentation)
    return {"queue": args.queue, "msg_ids": msg_ids}


def _apply(root: str, path: str) -> dict[str, Any]:
    with open(path, "rb") as handle:
        document = tomllib.load(handle)
    name = document.get("queue_manager", {}).get("name")
    if not name:
        raise MQError(f"{path}: [queue_manager] name is missing")
    try:
        qm = QueueManager.open(root)
    except MQError:
        qm = QueueManager.create(root, name)
    if qm.name != name:
        raise MQError(f"{path}: the queue manager at {qm.root} is {qm.name}, not {name}")
    existing = {q.name: q for q in qm.queues()}
    planned = dict(existing)
    # Validate every queue, alias targets included, before changing any, so a bad file changes nothing.
    for queue, attributes in document.get("queues", {}).items():
        if queue in existing:
            current = existing[queue].type
            if attributes.get("type", current) != current:
                raise MQError(f"{path}: queue {queue} is {current}; its type cannot change to {attributes['type']}")
            planned[queue] = QueueDefinition.build(queue, base=existing[queue], **attributes)
        else:
            planned[queue] = QueueDefinition.build(queue, **attributes)
    for definition in planned.values():
        target = planned.get(definition.target_queue) if definition.type == "alias" else definition
        if target is None or target.type != "local":
            raise MQError(
                f"{path}: queue {definition.name}: target_queue {definition.target_queue} is not a local queue"
            )
    for definition in planned.values():
        for attribute in ("backout_queue", "error_queue"):
            named = getattr(definition, attribute)
            if named is not None and (named not in planned or named == definition.name):
                raise MQError(f"{path}: queue {definition.name}: {attribute} {named} is not another defined queue")
    changes = []

    def order(item: tuple[str, dict]) -> tuple[bool, bool]:
        # Local queues first, so that every alias finds its target; queues naming a backout or error
        # queue after the others, so that it exists.
        definition = planned[item[0]]
        return definition.type != "local", bool(definition.backout_queue or definition.error_queue)

    for queue, attributes in sorted(document.get("queues", {}).items(), key=order):
        if queue in existing:
            attributes = {key: value for key, value in attributes.items() if key != "type"}
            qm.alter_queue(queue, **attributes)
            changes.append({"queue": queue, "action": "altered"})
        else:
            qm.define_queue(queue, **attributes)
            changes.append({"queue": queue, "action": "defined"})
    return {"queue_manager": qm.name, "root": qm.root, "changes": changes}


def _rows(items: Sequence[Any]) -> list[dict[str, Any]]:
    """Cluster objects as table rows; every row is of the one cluster shown."""
    return [{key: value for key, value in dataclasses.asdict(item).items() if key != "cluster"} for item in items]


def _cluster_command(args: argparse.Namespace) -> Any:
    if args.action == "create":
        cluster = Cluster.create(args.cluster_root, args.name)
        return {"cluster": cluster.name, "root": cluster.root}
    if args.cluster_root is not None:
        cluster = Cluster.open(args.cluster_root)
    else:
        cluster = Cluster.open(QueueManager.open(args.root).cluster_repository(args.cluster))
    if args.action == "show":
        snapshot = cluster.snapshot(args.snapshot)
        return _rows(snapshot.queues if args.queues else snapshot.bindings if args.bindings else snapshot.members)
    if args.action == "refresh":
        return _rows(cluster.refresh(active_within=args.active_within).members)
    if args.action == "maintain":
        return {"cluster": cluster.name, **cluster.maintain(args.retention)}
    if args.action == "join":
        return dataclasses.asdict(cluster.join(QueueManager.open(args.root), network_priority=args.network_priority))
    if args.action == "advertise":
        return dataclasses.asdict(cluster.advertise(QueueManager.open(args.root), args.queue))
    qmgr = args.qmgr or QueueManager.open(args.root).name
    if args.action == "leave":
        cluster.leave(qmgr)
        return {"cluster": cluster.name, "left": qmgr}
    if args.action == "unadvertise":
        cluster.unadvertise(qmgr, args.queue)
        return {"cluster": cluster.name, "qmgr": qmgr, "unadvertised": args.queue}
    if args.action == "suspend":
        member = cluster.suspend(qmgr)
    elif args.action == "resume":
        member = cluster.resume(qmgr)
    elif args.action == "route-state":
        member = cluster.set_route_state(qmgr, None if args.state == "auto" else args.state, by=args.by)
    else:
        member = cluster.set_network_priority(qmgr, args.network_priority)
    return dataclasses.asdict(member)


def run(args: argparse.Namespace) -> Any:
    """Carry out one parsed command and return what it prints."""
    if args.command == "apply":
        return _apply(args.root, args.file)
    if args.command == "jars":
        from mqspark.spark.session import delta_jars

        return ",".join(delta_jars())
    if args.command == "job":
        return str(Path(jobs.__file__).with_name(f"{args.name}.py"))
    if args.command == "cluster":
        return _cluster_command(args)
    if args.command == "qmgr" and args.action == "create":
        qm = QueueManager.create(args.root, args.name)
        return {"name": qm.name, "root": qm.root, "dead_letter_queue": qm.dead_letter_queue}
    qm = QueueManager.open(args.root)
    if args.command == "qmgr":
        if args.action == "alter":
            given = {"description": args.description, "default_reconnect": args.default_reconnect}
            qm.alter_qmgr(**{name: value for name, value in given.items() if value is not None})
        return {
            "name": qm.name,
            "qmid": qm.qmid,
            "root": qm.root,
            "dead_letter_queue": qm.dead_letter_queue,
            "default_reconnect": qm.definition.default_reconnect,
            "description": qm.definition.description,
            "queues": len(qm.queues()),
        }
    if args.command == "queue":
        attributes = {name: getattr(args, name) for name in ATTRIBUTE_NAMES if hasattr(args, name)}
        if args.action == "define":
            return qm.define_queue(args.name, **attributes).attributes()
        if args.action == "alter":
            return qm.alter_queue(args.name, **attributes).attributes()
        if args.action == "show":
            shown = qm.inquire_queue(args.name)
            # A cluster queue defined elsewhere shows its advertised attributes only.
            return shown.attributes() if isinstance(shown, QueueDefinition) else dataclasses.asdict(shown)
        if args.action == "list":
            return [
                {"name": q.name, "type": q.type, "depth": qm.depth(q.name), "description": q.description}
                for q in qm.queues()
            ]
        qm.delete_queue(args.name, purge=args.purge)
        return {"deleted": args.name}
    if args.command == "put":
        return _put(qm, args)
    if args.command == "maintain":
        names = [args.queue] if args.queue else [q.name for q in qm.queues() if q.type == "local"]
        return [qm.maintain(name, retention=args.retention).as_dict() for name in names]
    if args.command == "purge":
        return {"queue": args.queue, "purged": qm.purge(args.queue)}
    if args.command == "redrive":
        moved = qm.redrive(args.queue, msg_ids=args.msg_ids, correl_ids=args.correl_ids, reasons=args.reasons)
        return [{"queue": args.queue, "to": target, "messages": count} for target, count in moved.items()]
    if args.command == "consumer":
        if args.action == "declare":
            qm.declare_consumer(args.queue, args.group)
        elif args.action == "delete":
            qm.delete_consumer(args.queue, args.group)
        return [{"queue": args.queue, "consumer": name} for name in qm.consumers(args.queue)]
    if args.command == "monitor":
        return _monitor(qm, args)
    if args.command == "instance" and args.action == "switchover":
        switchover(qm, args.queue, args.consumer)
        return {"queue": args.queue, "consumer": args.consumer, "switchover": "requested"}
    if args.command == "instance":
        timeout = timedelta(seconds=args.lease_timeout)
        return [info.as_dict() for info in instances(qm, args.queue, args.consumer, timeout)]
    if args.command == "get":
        table = qm.get(
            args.queue,
            args.consumer,
            max_messages=args.max_messages,
            wait=args.wait,
            msg_id=args.msg_id,
            correl_id=args.correl_id,
        )
        if table.num_rows == 0:
            raise MQError(f"queue {args.queue}: no message available", Reason.MQRC_NO_MSG_AVAILABLE)
        return _messages(qm, args, table)
    if args.command == "browse":
        options = DeliveryOptions(
            args.order,
            args.all_messages_available,
            args.complete_message,
            args.msg_id,
            args.correl_id,
            args.group_id,
            args.msg_seq_number,
        )
        return _messages(qm, args, qm.browse_with(args.queue, options, limit=args.limit))
    rows = _depths(qm, args.queue)
    if args.json:
        return rows
    hidden = set()
    if not any(row["consumer"] for row in rows):
        hidden.update(_HEALTH_KEYS)
    if not any(row["backout_queue"] or row["error_queue"] or row["dead_letters"] for row in rows):
        hidden.update(_FAILURE_KEYS)
    return [{key: value for key, value in row.items() if key not in hidden} for row in rows]


def _messages(qm: QueueManager, args: argparse.Namespace, table: pa.Table) -> pa.Table:
    """Messages as ``browse`` and ``get`` print them: every column with ``--json``, else the usual
    ones, with the dead-letter header where it applies."""
    if args.json:
        return table
    columns = list(_BROWSE_COLUMNS)
    if _holds_failed_messages(qm, args.queue, table):
        columns[-1:-1] = _HEADER_COLUMNS
    return table.select(columns)


def _holds_failed_messages(qm: QueueManager, queue: str, browsed: pa.Table) -> bool:
    """Whether browse shows the dead-letter header: for the dead-letter queue, a queue some queue
    names as its backout or error queue, and any queue holding messages that carry a header."""
    queues = qm.queues()
    failure_queues = {qm.dead_letter_queue}
    failure_queues |= {q.backout_queue for q in queues if q.backout_queue}
    failure_queues |= {q.error_queue for q in queues if q.error_queue}
    return qm.inquire_queue(queue).name in failure_queues or browsed["dlq_reason"].null_count < browsed.num_rows


class _Aborted(Exception):
    """The monitor's abort verdict: the command exits with code 2."""


def _monitor(qm: QueueManager, args: argparse.Namespace) -> None:
    """``monitor``: a point every ``--watch-interval`` seconds, printed as it is taken."""
    monitor = Monitor(
        qm,
        args.queue,
        args.consumer,
        watch_interval=args.watch_interval,
        watch_count=args.watch_count,
        expected_count=args.expected_count,
        abort=args.abort,
        window=args.window,
        depth_high=args.depth_high,
        depth_low=args.depth_low,
        service_interval=args.service_interval,
    )

    def show(point: Any) -> None:
        print(json.dumps(point.as_dict()) if args.json else point.line(), flush=True)

    warnings = logging.StreamHandler(sys.stderr)
    warnings.setFormatter(logging.Formatter("mqspark: warning: %(message)s"))
    logging.getLogger("mqspark.monitor").addHandler(warnings)

    try:
        last = monitor.run(args.points, show)
    except KeyboardInterrupt:
        return None
    if last.verdict is Verdict.ABORT:
        raise _Aborted(str(monitor.error))
    return None


def _depths(qm: QueueManager, queue: str | None) -> list[dict[str, Any]]:
    """``depth``: each queue's depth and oldest age, in all and per consumer group, with each group's
    health (:func:`mqspark.monitor.group_health`: status, oldest claimable age, rate); beside each
    source queue, how many of its failed messages wait on its backout queue, its error queue and the
    dead-letter queue (``--json`` always has these keys; the table shows them when one is set or
    a dead letter waits)."""
    queues = {q.name: q for q in qm.queues() if q.type == "local"}
    names = [queue] if queue else list(queues)
    from_queue: dict[str, dict[str, int]] = {}

    def failed_on(failure_queue: str | None, source: str) -> int | None:
        if failure_queue is None or failure_queue not in queues:
            return None
        if failure_queue not in from_queue:
            from_queue[failure_queue] = qm.depth_by_original_queue(failure_queue)
        return from_queue[failure_queue].get(source, 0)

    rows = []
    now = datetime.now(UTC)
    for name in names:
        definition = queues.get(name)
        for consumer in [None, *qm.consumers(name)]:
            backlog = qm.backlog(name, consumer)
            age = backlog.oldest_age(now)
            row = {
                "queue": name,
                "consumer": consumer,
                "depth": backlog.depth,
                "oldest_age_s": _rounded(age),
                **dict.fromkeys(_HEALTH_KEYS),
                **dict.fromkeys(_FAILURE_KEYS),
            }
            if consumer is not None:
                health = group_health(qm, name, consumer, now)
                row.update(
                    {
                        "status": None if health.status is None else health.status.value,
                        "claimable_age_s": _rounded(health.oldest_claimable_age_s),
                        "rate_per_s": _rounded(health.rate_per_s),
                        "held_by": health.held_by,
                    }
                )
            if consumer is None and definition is not None and name != qm.dead_letter_queue:
                row.update(
                    {
                        "backout_queue": definition.backout_queue,
                        "backed_out": failed_on(definition.backout_queue, name),
                        "error_queue": definition.error_queue,
                        "errors": failed_on(definition.error_queue, name),
                        "dead_letters": failed_on(qm.dead_letter_queue, name),
                    }
                )
            rows.append(row)
    return rows


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="backslashreplace")
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list):
        return [_jsonable(item) for item in value]
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    return value


def _render_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(none)"
    columns = list(rows[0])
    cells = [[_cell(row[c]) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=False))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=False)).rstrip() for r in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    value = _jsonable(value)
    text = "" if value is None else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def render(result: Any, as_json: bool) -> str:
    if isinstance(result, str) and not as_json:
        return result
    if isinstance(result, pa.Table):
        result = result.to_pylist(maps_as_pydicts="strict")
    if as_json:
        return json.dumps(_jsonable(result), indent=2)
    if isinstance(result, dict):
        lines = []
        for key, value in result.items():
            if isinstance(value, list) and value:
                lines.append(f"{key}:")
                lines += [
                    f"  {' '.join(map(str, item.values())) if isinstance(item, dict) else item}" for item in value
                ]
            else:
                value = _jsonable(value)
                lines.append(f"{key}: {'' if value is None else value}".rstrip())
        return "\n".join(lines)
    return _render_table(result)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # Payloads may follow put's options (put Q --priority 9 "rush"); argparse leaves those over.
    args, extras = parser.parse_known_args(argv)
    if extras:
        if args.command != "put" or any(extra.startswith("-") for extra in extras):
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        args.payloads = [*args.payloads, *extras]
    try:
        result = run(args)
    except _Aborted as aborted:
        print(f"mqspark: error: {aborted}", file=sys.stderr)
        return 2
    except (MQError, OSError, tomllib.TOMLDecodeError) as error:
        print(f"mqspark: error: {error}", file=sys.stderr)
        return 1
    if result is not None:
        print(render(result, args.json))
    return 0


def entry() -> None:
    """The console command: run :func:`main`, then leave without running interpreter shutdown.

    delta-rs can abort the process at shutdown ("terminate called without an active exception",
    delta-io/delta-rs#2184) while its threads are torn down, turning a clean exit into SIGABRT.
    Everything is flushed and written by then, so the exit code is made final here.
    """
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
