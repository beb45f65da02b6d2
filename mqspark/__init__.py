"""mqspark: transactional message queues on Delta tables for Apache Spark."""

from .cluster.repository import Cluster
from .definitions import QueueDefinition, QueueManagerDefinition
from .errors import MQError, MQValidationError, Reason
from .qmgr import QueueManager

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
    "connect",
    "forward",
    "register",
    "request",
    "route",
    "session",
]

__version__ = "0.1.0"


def __getattr__(name: str):
    # Spark is imported only by those who use it: the CLI and plain puts start in well under a second.
    if name in ("session", "register"):
        from .spark import session as spark

        return getattr(spark, name)
    if name in ("connect", "Connection"):
        from . import connection

        return getattr(connection, name)
    if name == "backout":
        from .services.backout import backout

        return backout
    if name in ("forward", "request", "ServiceError"):
        from .services import forward

        return getattr(forward, name)
    if name == "route":
        from .spark.workload import route

        return route
    raise AttributeError(name)
