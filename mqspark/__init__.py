"""mqspark: transactional message queues on Delta tables for Apache Spark."""

from typing import Any

from mqspark.cluster.repository import Cluster
from mqspark.errors import MQError, MQValidationError, Reason
from mqspark.model.definitions import QueueDefinition, QueueManagerDefinition
from mqspark.qmgr import QueueManager

__all__ = [
    "Cluster",
    "Connection",
    "MQError",
    "MQValidationError",
    "QueueDefinition",
    "QueueManager",
    "QueueManagerDefinition",
    "Reason",
    "ServiceError",
    "backout",
    "brief",
    "connect",
    "forward",
    "register",
    "request",
    "route",
    "session",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Spark is imported only by those who use it: the CLI and plain puts start in well under a second.
    if name in ("session", "register"):
        from mqspark.spark import session as spark

        return getattr(spark, name)
    if name in ("connect", "Connection"):
        from mqspark import reconnect

        return getattr(reconnect, name)
    if name == "backout":
        from mqspark.engine.backout import backout

        return backout
    if name == "forward":
        from mqspark.spark.forward import forward

        return forward
    if name in ("request", "ServiceError"):
        from mqspark.services import forward as service

        return getattr(service, name)
    if name == "brief":
        from mqspark.spark.display import brief

        return brief
    if name == "route":
        from mqspark.spark.routing import route

        return route
    raise AttributeError(name)
