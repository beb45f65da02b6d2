"""The engine: queue semantics without Spark and without the facade. The queues of a queue manager
(``queues``, ``catalog``), consumer groups and their leases (``consumer_groups``, with the state
table's rows, handle, reads, commits and compaction in ``state_rows``, ``state_table``,
``state_reads``, ``state_commit``, ``state_compaction``, and ``leases``), order (``ordering``),
planning (``planner``, ``plans``, ``pending``), the Python get (``get``), depth (``depth``), failed
messages (``backout``, ``redrive``) and maintenance (``maintenance``)."""
