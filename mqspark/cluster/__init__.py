"""Clusters (spec section 7): the repository of members, advertised queues and bindings, and the
workload routing algorithm."""
