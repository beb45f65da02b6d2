"""The forwarding service as a ``spark-submit`` job:

    spark-submit "$(mqspark job forward)" --root R --queue Q --service module:function [--exit-when-empty]

It runs :func:`mqspark.forward` on the session ``spark-submit`` gives (its ``--master`` and
``--conf``), until the queue is drained with ``--exit-when-empty``, else until it is stopped. The
exit code is 0 when the query ended cleanly, 1 when it failed or its arguments were refused.

With ``--instance`` the job is one instance of the forwarding service
(:class:`~mqspark.services.instances.Instance`): it prints ``standby <id>``, waits while another
instance holds the consumer group, then prints ``active <id>`` once its query runs. The instances
share the default checkpoint under the queue manager root.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="forward", description="the mqspark forwarding service (TMQFORWARD)")
    parser.add_argument("--root", required=True, help="queue manager root")
    parser.add_argument("--queue", required=True, help="queue of requests")
    parser.add_argument("--service", required=True, help="the service, as module:function")
    parser.add_argument("--consumer", default="forward", help="consumer group (default: forward)")
    parser.add_argument("--exit-when-empty", action="store_true", help="stop once the queue is drained (-e)")
    parser.add_argument("--idle-interval", type=float, default=1.0, help="seconds between polls (-i)")
    parser.add_argument("--call-timeout", type=float, help="seconds a service call may take (-t)")
    parser.add_argument("--max-messages-per-trigger", type=int, help="most requests per micro-batch")
    parser.add_argument("--checkpoint", help="checkpoint location (default: under the queue manager root)")
    parser.add_argument("--instance", action="store_true", help="run as an active or standby instance")
    parser.add_argument("--lease-timeout", type=int, help="seconds the consumer group's lease lives unrenewed")
    args = parser.parse_args(argv)

    from mqspark.errors import MQError
    from mqspark.services.forward import load_service

    # A service that cannot be imported is refused before a Spark session is started for it.
    try:
        load_service(args.service)
    except MQError as error:
        print(f"forward: error: {error}", file=sys.stderr)
        return 1

    from pyspark.sql import SparkSession

    from mqspark.spark.forward import forward
    from mqspark.spark.session import azure_settings, register

    builder = SparkSession.builder.appName(f"mqspark-forward-{args.queue}")
    # The checkpoint lives under the root: on Azure, Spark's ABFS driver needs the credentials too.
    for key, value in azure_settings(os.environ).items():
        builder = builder.config(key, value)
    spark = register(builder.getOrCreate())
    options: dict[str, Any] = {}
    if args.max_messages_per_trigger is not None:
        options["maxMessagesPerTrigger"] = args.max_messages_per_trigger
    if args.lease_timeout is not None:
        options["leaseTimeout"] = args.lease_timeout

    def start(instance: str | None = None) -> StreamingQuery:
        given = options if instance is None else {**options, "instance": instance}
        return forward(
            spark,
            args.root,
            args.queue,
            args.service,
            consumer=args.consumer,
            exit_when_empty=args.exit_when_empty,
            idle_interval=args.idle_interval,
            call_timeout=args.call_timeout,
            checkpoint_location=args.checkpoint,
            **given,
        )

    try:
        if args.instance:
            query = _run_instance(args, spark, start)
        else:
            query = start()
    except MQError as error:
        print(f"forward: error: {error}", file=sys.stderr)
        return 1
    query.awaitTermination()
    if query.exception() is not None:
        print(f"forward: error: {query.exception()}", file=sys.stderr)
        return 1
    return 0


def _run_instance(
    args: argparse.Namespace, spark: SparkSession, start: Callable[[str], StreamingQuery]
) -> StreamingQuery:
    from datetime import timedelta

    from mqspark.engine.leases import DEFAULT_LEASE_TIMEOUT
    from mqspark.engine.queues import Queues
    from mqspark.services.instances import Instance

    lease = DEFAULT_LEASE_TIMEOUT if args.lease_timeout is None else timedelta(seconds=args.lease_timeout)
    instance = Instance(
        Queues.open(args.root), args.queue, args.consumer, service="forward", lease_timeout=lease, spark=spark
    )
    _say(f"standby {instance.id}")
    query = instance.run(start)
    _say(f"active {instance.id}")
    return query


def _say(line: str) -> None:
    """Print ``line`` whole. spark-submit runs the driver unbuffered (``PYTHONUNBUFFERED``), so
    ``print`` writes the text and its newline apart, and the JVM's log lines, which share the
    output, can land between them."""
    sys.stdout.write(f"{line}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
