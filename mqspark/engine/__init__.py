"""The engine: queue semantics without Spark and without the facade. The queues of a queue manager
(``queues``, ``catalog``), consumer groups and their leases (``consumer_groups``, ``leases``), order
(``ordering``), the planner and its index (``planner``, ``pending``), the Python get (``get``), depth
(``depth``), failed messages (``backout``) and maintenance (``maintenance``)."""
