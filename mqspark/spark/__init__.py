"""Everything Spark calls: the session and jars, the ``mq`` data source, the sink, the streaming get,
the browse reader, routing on Spark, the forwarding service's query and reply data source, and what
Spark hands a data source's code (``tasks``). Spark is imported only by code under this package and
``mqspark.jobs``."""
