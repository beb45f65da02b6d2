"""The ``mq`` data source for Spark's static lookup of Python data sources.

When a Spark driver first resolves a Python data source, it imports every top-level module named
``pyspark_*`` on its Python path that has a ``DefaultSource`` and registers that source for all of
its sessions. With this folder (``mqspark.spark.session.STATIC_SOURCES``) on the path of a Spark
Connect server's Python, ``format("mq")`` works in every session of that server without
``mqspark.register``: Spark Declarative Pipelines need that, since a source registered in the
pipeline's own session makes ``spark-pipelines`` 4.2 fail after the run (see docs/limits.md). The
module lives in a folder of its own, off the package's path, so that only servers that ask for it
get it.
"""

from mqspark.spark.datasource import MQDataSource as DefaultSource

__all__ = ["DefaultSource"]
