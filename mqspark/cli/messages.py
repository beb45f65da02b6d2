"""The ``mqspark`` commands on a queue's messages: ``put``, ``browse``, ``get``, ``maintain``, ``purge``
and ``redrive``, and how ``browse`` and ``get`` show messages (with MQ's dead-letter header where it
applies)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import pyarrow as pa

from mqspark.cli.parser import Commands, duration, key_value, open_root
from mqspark.engine.browse import browse_queue
from mqspark.engine.maintenance import DEFAULT_RETENTION
from mqspark.engine.ordering import ORDERS, DeliveryOptions
from mqspark.errors import MQError, MQValidationError, Reason
from mqspark.model.messages import BROWSE_SCHEMA, DEAD_LETTER_FIELDS
from mqspark.qmgr import QueueManager, engine
from mqspark.status import PAYLOAD_VIEWS, holds_failed_messages, payload_view

# What put prints before it reads messages from a terminal.
STDIN_NOTICE = "mqspark put: reading messages from standard input, one per line; end them with Ctrl-D"
# The block consumer's prefetch for ``get --count``: Kafka's default max.poll.records.
_COUNT_PREFETCH = 500
_BROWSE_COLUMNS = ("msg_id", "priority", "group_id", "msg_seq_number", "offset", "correl_id", "put_time", "payload")
# Shown by browse for the queues failed messages go to, before the payload: MQ's dead-letter header.
_HEADER_COLUMNS = ("backout_count", *DEAD_LETTER_FIELDS)


def add_put(commands: Commands, output: argparse.ArgumentParser) -> None:
    """``put``: payloads as arguments, lines of a file or lines of stdin."""
    put = commands.add_parser("put", parents=[output], help="put messages: arguments, --file lines, or stdin lines")
    put.add_argument("queue")
    put.add_argument("payloads", nargs="*", metavar="PAYLOAD")
    put.add_argument("--file", help="put one message per line of this file ('-' for stdin)")
    put.add_argument("--priority", type=int, help="0-9, higher first (default: the queue's default_priority)")
    put.add_argument("--correl-id", help="correlation id, any text (a reply carries the request's)")
    put.add_argument("--reply-to-queue", help="the queue a reply goes to (a queue name)")
    put.add_argument("--reply-to-qmgr", help="the queue manager of --reply-to-queue (a queue manager name)")
    put.add_argument("--failure-queue", help="where a forwarding service puts the request when it finally fails")
    put.add_argument("--group-id", help="put the messages as one complete group, numbered 1..N")
    put.add_argument(
        "--property",
        action="append",
        type=key_value,
        default=[],
        metavar="KEY=VALUE",
        help="a message property, text KEY=VALUE (repeatable)",
    )
    put.add_argument(
        "--segmentation", action="store_true", help="split payloads longer than the queue's max_message_length (bytes)"
    )
    put.add_argument("--top-of-queue", action="store_true", help="put ahead of every message of its priority")
    put.add_argument("--before-msg-id", help="put just before this message")
    put.set_defaults(handler=_put)


def _put(args: argparse.Namespace) -> dict[str, Any]:
    qm = open_root(args.root, args.clock)
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


def _payloads(args: argparse.Namespace) -> list[str]:
    if args.payloads and args.file:
        raise MQError("give payloads as arguments or with --file, not both")
    if args.payloads:
        return args.payloads
    if args.file and args.file != "-":
        with open(args.file, encoding="utf-8") as handle:
            return handle.read().splitlines()
    if sys.stdin.isatty():
        # Else the command seems to hang, waiting for input nobody knew it wanted.
        print(STDIN_NOTICE, file=sys.stderr, flush=True)
    return sys.stdin.read().splitlines()


def add_browse(commands: Commands, output: argparse.ArgumentParser) -> None:
    """``browse``: messages shown, not removed."""
    browse = commands.add_parser("browse", parents=[output], help="show messages without removing them")
    browse.add_argument("queue")
    browse.add_argument(
        "--order",
        choices=ORDERS,
        default="logical",
        help="logical (default): the order gets take them, a group's messages together; physical: as stored",
    )
    browse.add_argument("--all-messages-available", action="store_true", help="only complete groups")
    browse.add_argument("--complete-message", action="store_true", help="join segments into whole messages")
    browse.add_argument("--msg-id", help="only the message with this msg_id")
    browse.add_argument("--correl-id", help="only messages with this correl_id")
    browse.add_argument("--group-id", help="only the messages of this group")
    browse.add_argument("--msg-seq-number", type=int, help="only this message of the --group-id group, numbered from 1")
    browse.add_argument("--limit", type=int, help="at most this many messages (default: every one)")
    _add_payload_option(browse)
    browse.set_defaults(handler=_browse)


def _browse(args: argparse.Namespace) -> pa.Table:
    qm = open_root(args.root, args.clock)
    options = DeliveryOptions(
        args.order,
        args.all_messages_available,
        args.complete_message,
        args.msg_id,
        args.correl_id,
        args.group_id,
        args.msg_seq_number,
    )
    return _messages(qm, args, browse_queue(engine(qm), args.queue, options, limit=args.limit))


def add_get(commands: Commands, output: argparse.ArgumentParser) -> None:
    """``get``: messages removed for a consumer group."""
    get = commands.add_parser(
        "get", parents=[output], help="get messages destructively for a consumer group, in logical order (amqsget)"
    )
    get.add_argument("queue")
    get.add_argument("--consumer", default="default", help="consumer group (default: default)")
    get.add_argument(
        "--wait", type=float, default=0.0, help="seconds to wait for a first message (default 0: do not wait)"
    )
    how_many = get.add_mutually_exclusive_group()
    how_many.add_argument(
        "--max", type=int, default=1, dest="max_messages", help="most messages, 1 or more, in one get (default 1)"
    )
    how_many.add_argument(
        "--count",
        type=int,
        help="get this many messages (1 or more) with the block consumer, waiting up to --wait seconds for each "
        "(ends early when none comes)",
    )
    get.add_argument("--correl-id", help="only a message with this correl_id")
    get.add_argument("--msg-id", help="only the message with this msg_id")
    _add_payload_option(get)
    get.set_defaults(handler=_get)


def _get(args: argparse.Namespace) -> pa.Table:
    qm = open_root(args.root, args.clock)
    if args.count is not None:
        table = _get_count(qm, args)
    else:
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


def _get_count(qm: QueueManager, args: argparse.Namespace) -> pa.Table:
    """Up to ``--count`` messages taken with the block consumer, which claims them a block at a time
    and never more than are asked for: only the messages taken are consumed."""
    count = args.count
    if count < 1:
        raise MQValidationError(f"get: queue {args.queue}: --count must be an integer >= 1, got {count}")
    if args.msg_id or args.correl_id:
        raise MQValidationError(
            f"get: queue {args.queue}: --count takes messages in order; --msg-id and --correl-id need --max"
        )
    rows = []
    with qm.consumer(args.queue, args.consumer, prefetch=min(count, _COUNT_PREFETCH), wait=args.wait) as consumer:
        for message in consumer:
            rows.append(message)
            if len(rows) == count:
                break
    return pa.Table.from_pylist(rows, schema=BROWSE_SCHEMA)


def _add_payload_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--payload",
        choices=PAYLOAD_VIEWS,
        default="text",
        help="text (default): UTF-8 text, escaped in tables; with --json, base64 for a payload that is not "
        "UTF-8, as payload_encoding says. hex or base64: every payload so",
    )


def _messages(qm: QueueManager, args: argparse.Namespace, table: pa.Table) -> pa.Table:
    """Messages as ``browse`` and ``get`` print them: every column with ``--json``, else the usual
    ones, with the dead-letter header where it applies; the payload as ``--payload`` says."""
    payload, encoding = payload_view(table["payload"].to_pylist(), args.payload, args.json)
    table = table.set_column(table.schema.get_field_index("payload"), "payload", payload)
    if args.json:
        return table.append_column("payload_encoding", encoding)
    columns = list(_BROWSE_COLUMNS)
    if holds_failed_messages(qm, args.queue, table):
        columns[-1:-1] = _HEADER_COLUMNS
    return table.select(columns)


def add_maintain(commands: Commands, output: argparse.ArgumentParser) -> None:
    """``maintain``: one local queue, or every one."""
    maintain = commands.add_parser(
        "maintain",
        parents=[output],
        help="remove consumed and expired messages, compact files, clean up the log and vacuum "
        "(every local queue when none is named)",
    )
    maintain.add_argument("queue", nargs="?")
    maintain.add_argument(
        "--retention",
        type=duration,
        default=DEFAULT_RETENTION,
        help="keep removed files and log entries this long for time travel: seconds, or with s, m, h or d (default 1h)",
    )
    maintain.set_defaults(handler=_maintain)


def _maintain(args: argparse.Namespace) -> list[dict[str, Any]]:
    qm = open_root(args.root, args.clock)
    names = [args.queue] if args.queue else [q.name for q in qm.queues() if q.type == "local"]
    return [qm.maintain(name, retention=args.retention).as_dict() for name in names]


def add_purge(commands: Commands, output: argparse.ArgumentParser) -> None:
    """``purge``: CLEAR QLOCAL."""
    purge = commands.add_parser(
        "purge", parents=[output], help="remove every message of a local queue for every consumer group (CLEAR QLOCAL)"
    )
    purge.add_argument("queue")
    purge.set_defaults(handler=_purge)


def _purge(args: argparse.Namespace) -> dict[str, Any]:
    return {"queue": args.queue, "purged": open_root(args.root, args.clock).purge(args.queue)}


def add_redrive(commands: Commands, output: argparse.ArgumentParser) -> None:
    """``redrive``: failed messages back to the queues they came from."""
    redrive = commands.add_parser(
        "redrive",
        parents=[output],
        help="move messages of a backout, error or dead-letter queue back to the queues they came from",
    )
    redrive.add_argument("queue")
    redrive.add_argument("--msg-id", action="append", dest="msg_ids", help="only this msg_id (repeatable)")
    redrive.add_argument("--correl-id", action="append", dest="correl_ids", help="only this correl_id (repeatable)")
    redrive.add_argument(
        "--reason",
        action="append",
        type=int,
        dest="reasons",
        help="only messages with this dlq_reason, a reason code such as 2362 (repeatable)",
    )
    redrive.set_defaults(handler=_redrive)


def _redrive(args: argparse.Namespace) -> list[dict[str, Any]]:
    qm = open_root(args.root, args.clock)
    moved = qm.redrive(args.queue, msg_ids=args.msg_ids, correl_ids=args.correl_ids, reasons=args.reasons)
    return [{"queue": args.queue, "to": target, "messages": count} for target, count in moved.items()]
