"""Everything Spark calls: the session and jars, the ``mq`` data source, the sink, the streaming get,
the browse reader and the routing UDF. Spark is imported only by code under this package."""
