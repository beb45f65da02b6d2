"""Clusters (spec section 7): the repository of members, advertised queues and bindings
(``repository``, with its ``records``), and the workload routing decision (``routing``)."""
