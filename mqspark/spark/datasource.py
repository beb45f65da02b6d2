"""The ``mq`` Spark data source: the options users give, checked on the driver, and the reader and writers.

- ``spark.read.format("mq").option("queue", Q).load(root)``: browse (:mod:`mqspark.spark.browse`);
- ``spark.readStream.format("mq").option("queue", Q).load(root)``: streaming get, destructive for
  its consumer group (:mod:`mqspark.spark.stream`);
- ``df.write.format("mq").option("queue", Q).mode("append").save(root)``: batch put (:mod:`mqspark.spark.sink`);
- ``df.writeStream.format("mq").option("queue", Q).option("checkpointLocation", C).start(root)``:
  streaming put, exactly once per micro-batch (:mod:`mqspark.spark.sink`).

Spark hands data sources their options with lower-cased keys. Mistakes are reported where Spark
calls the driver first (``load()``, ``save()``, ``start()``), naming the option and the value.
"""

from __future__ import annotations

import difflib
from datetime import UTC, datetime, timedelta
from typing import TypedDict

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from mqspark.engine.leases import DEFAULT_LEASE_TIMEOUT
from mqspark.engine.ordering import DeliveryOptions
from mqspark.engine.queues import Queues
from mqspark.errors import MQValidationError
from mqspark.model.definitions import validate_name
from mqspark.model.messages import BROWSE_SCHEMA
from mqspark.reconnect import DEFAULT_RECONNECT_TIMEOUT, Reconnect, ReconnectMode, reconnect_mode
from mqspark.spark.browse import BrowsePlan, BrowseReader
from mqspark.spark.plain import without_frames
from mqspark.spark.routing import cluster_names
from mqspark.spark.sink import QueueStreamWriter, QueueWriter, SinkPlan
from mqspark.spark.stream import DEFAULT_MAINTENANCE_INTERVAL, GetOptions, QueueStreamReader

SEGMENTATION = {"allowed": True, "not_allowed": False}
# Browse options that select or cap messages; the streaming get has its own limits instead.
BROWSE_ONLY = ("msgId", "correlId", "groupId", "msgSeqNumber", "limit")
# Options both reads take.
_READS = ("queue", "order", "allMessagesAvailable", "completeMessage")
# The streaming get's own options: its consumer group, limits, lease, services and reconnection.
GET_ONLY = (
    "consumer",
    "maxMessagesPerTrigger",
    "maxBytesPerTrigger",
    "leaseTimeout",
    "instance",
    "maintenanceInterval",
    "reconnect",
    "reconnectTimeout",
)
PUT_OPTIONS = ("queue", "segmentation", "producerId", "cluster", "bind", "qmgr", "reconnect", "reconnectTimeout")
# Keys Spark itself hands the source: the root given to load()/save(), a streaming write's checkpoint
# and its query's name (writeStream.queryName(), which Declarative Pipelines set on every flow's query).
_SPARK_KEYS = ("path", "checkpointLocation", "queryName")


class MQDataSource(DataSource):
    """Format ``mq``: queues of the queue manager whose root is the path."""

    @classmethod
    def name(cls) -> str:
        return "mq"

    @without_frames
    def schema(self) -> StructType:
        # schema() is what load() calls, for read and readStream alike: checking the options here
        # reports mistakes at load time.
        options = dict(self.options)
        # Spark does not tell schema() whether a read or a stream asks: each refuses the other's
        # options later (reader(), streamReader()).
        _known_options(options, (*_READS, *BROWSE_ONLY, *GET_ONLY), 'spark.read or spark.readStream .format("mq")')
        _stream_limits(options)
        _instance(options)
        _reconnect(options)
        _browse_options(options)
        return from_arrow_schema(BROWSE_SCHEMA)

    @without_frames
    def reader(self, schema: StructType) -> DataSourceReader:
        options = dict(self.options)
        _only_for(options, GET_ONLY, "the streaming get (spark.readStream)", "browse")
        return BrowseReader(_browse_options(options))

    @without_frames
    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return QueueStreamReader(_get_options(dict(self.options)))

    @without_frames
    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return QueueWriter(_sink_plan(dict(self.options), schema, overwrite))

    @without_frames
    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        # Spark makes the writer again for each micro-batch: a root gone since is out of reach (2009).
        return QueueStreamWriter(_sink_plan(dict(self.options), schema, overwrite, reopen=True))


def _known_options(options: dict[str, str], known: tuple[str, ...], where: str) -> None:
    """Refuse an option ``where`` does not take, naming the closest known one (Spark lower-cases keys)."""
    spelled = {name.lower(): name for name in (*known, *_SPARK_KEYS)}
    for key in options:
        if key not in spelled:
            close = difflib.get_close_matches(key, spelled, n=1)
            hint = f"did you mean {spelled[close[0]]}? " if close else ""
            raise MQValidationError(
                f"option {key} is unknown to {where}: {hint}its options are {', '.join(dict.fromkeys(known))}"
            )


def _only_for(options: dict[str, str], names: tuple[str, ...], owner: str, reader: str) -> None:
    """Refuse, for ``reader``, an option of ``names``: those only ``owner`` takes."""
    for name in names:
        if name.lower() in options:
            raise MQValidationError(f"option {name} is for {owner}; {reader} does not take it")


def _required(options: dict[str, str], name: str, example: str) -> str:
    value = options.get(name.lower())
    if not value:
        raise MQValidationError(f"option {name} is missing: {example}")
    return value


def _root(options: dict[str, str]) -> str:
    return _required(options, "path", 'give the queue manager root, as in .load("/data/qm")')


def _flag(options: dict[str, str], name: str) -> bool:
    value = options.get(name.lower(), "false").lower()
    if value not in ("true", "false"):
        raise MQValidationError(f"option {name} must be true or false, got {options[name.lower()]!r}")
    return value == "true"


def _whole_number(options: dict[str, str], name: str, low: int) -> int | None:
    value = options.get(name.lower())
    if value is None:
        return None
    if not value.isdigit() or int(value) < low:
        raise MQValidationError(f"option {name} must be a whole number >= {low}, got {value!r}")
    return int(value)


def _delivery(options: dict[str, str]) -> DeliveryOptions:
    return DeliveryOptions(
        order=options.get("order", "logical"),
        all_messages_available=_flag(options, "allMessagesAvailable"),
        complete_message=_flag(options, "completeMessage"),
        msg_id=options.get("msgid"),
        correl_id=options.get("correlid"),
        group_id=options.get("groupid"),
        msg_seq_number=_whole_number(options, "msgSeqNumber", 1),
    )


def _browse_options(options: dict[str, str]) -> BrowsePlan:
    """Check the browse options, and fix the moment and table version every partition reads."""
    root = _root(options)
    queue = _required(options, "queue", 'give the queue to read, as in .option("queue", "ORDERS")')
    delivery = _delivery(options)
    limit = _whole_number(options, "limit", 0)
    qm = Queues.open(root)
    version = qm.queue_version(queue)
    return BrowsePlan(qm.root, queue, delivery, limit, datetime.now(UTC), version)


def _get_options(options: dict[str, str]) -> GetOptions:
    """Check the streaming get's options; the queue itself is checked when the query plans."""
    _only_for(options, BROWSE_ONLY, "browse (spark.read)", "the streaming get")
    root = _root(options)
    queue = _required(options, "queue", 'give the queue to read, as in .option("queue", "ORDERS")')
    consumer, max_messages, max_bytes, lease = _stream_limits(options)
    qm, reconnect = Reconnect.open(root, *_reconnect(options), f"streaming get of queue {queue}")
    return GetOptions(
        root=qm.root,
        queue=validate_name(queue),
        consumer=consumer,
        delivery=_delivery(options),
        max_messages=max_messages,
        max_bytes=max_bytes,
        lease_timeout=lease,
        maintenance_interval=_maintenance_interval(options),
        instance=_instance(options),
        reconnect=reconnect,
    )


def _instance(options: dict[str, str]) -> str | None:
    """Option instance: the service instance (:class:`mqspark.services.instances.Instance`) the
    query runs for; its id holds the group's lease."""
    instance = options.get("instance")
    if instance is not None and (not instance.strip() or len(instance) > 200):
        raise MQValidationError(f"option instance must be an instance id of 1-200 characters, got {instance!r}")
    return instance


def _reconnect(options: dict[str, str]) -> tuple[ReconnectMode | None, timedelta]:
    """Options reconnect (no, yes, qmgr; default: the queue manager's default_reconnect) and
    reconnectTimeout (seconds, default 1800)."""
    mode = reconnect_mode(options.get("reconnect"), "option reconnect")
    seconds = _whole_number(options, "reconnectTimeout", 0)
    return mode, DEFAULT_RECONNECT_TIMEOUT if seconds is None else timedelta(seconds=seconds)


def _maintenance_interval(options: dict[str, str]) -> timedelta | None:
    """Option maintenanceInterval: seconds between the maintenance runs the query starts (0: none)."""
    seconds = _whole_number(options, "maintenanceInterval", 0)
    if seconds is None:
        return DEFAULT_MAINTENANCE_INTERVAL
    return timedelta(seconds=seconds) if seconds else None


def _stream_limits(options: dict[str, str]) -> tuple[str, int | None, int | None, timedelta]:
    """The streaming get's own options: consumer group, per-trigger limits and lease timeout."""
    consumer = validate_name(options.get("consumer", "default"), "consumer group")
    lease = _whole_number(options, "leaseTimeout", 1)
    return (
        consumer,
        _whole_number(options, "maxMessagesPerTrigger", 1),
        _whole_number(options, "maxBytesPerTrigger", 1),
        DEFAULT_LEASE_TIMEOUT if lease is None else timedelta(seconds=lease),
    )


class _Routing(TypedDict, total=False):
    """The sink's routing options, as :meth:`SinkPlan.build` takes them (none: a put to a local queue)."""

    cluster: tuple[str, ...]
    bind: str
    qmgr: str | None


def _sink_plan(options: dict[str, str], schema: StructType, overwrite: bool, reopen: bool = False) -> SinkPlan:
    if overwrite:
        raise MQValidationError('the mq sink only appends: use mode("append"), not overwrite')
    _known_options(options, PUT_OPTIONS, 'df.write or df.writeStream .format("mq")')
    root = _root(options)
    queue = _required(options, "queue", 'give the queue to put to, as in .option("queue", "ORDERS")')
    segmentation = options.get("segmentation", "not_allowed")
    if segmentation not in SEGMENTATION:
        raise MQValidationError(f"option segmentation must be one of allowed, not_allowed; got {segmentation!r}")
    producer = options.get("producerid")
    if producer is not None and not producer.strip():
        raise MQValidationError("option producerId must not be blank")
    routing: _Routing = {}
    if "cluster" in options:
        routing = {
            "cluster": cluster_names(options["cluster"]),
            "bind": options.get("bind", "as_q_def"),
            "qmgr": options.get("qmgr"),
        }
    elif "bind" in options or "qmgr" in options:
        raise MQValidationError("options bind and qmgr route a put to a cluster queue: give option cluster too")
    return SinkPlan.build(
        root,
        queue,
        schema,
        segmentation=SEGMENTATION[segmentation],
        producer=producer,
        reconnect=_reconnect(options),
        reopen=reopen,
        **routing,
    )
