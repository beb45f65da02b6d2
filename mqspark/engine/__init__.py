"""The engine: queue semantics without Spark and without the facade. The queues of a queue manager
(``queues``, ``catalog``), consumer groups and their leases (``consumer_groups``, ``state_rows``,
``leases``), order (``ordering``), planning (``planner``, ``plans``, ``pending``), the Python get
(``get``), depth (``depth``), failed messages (``backout``, ``redrive``) and maintenance
(``maintenance``)."""
