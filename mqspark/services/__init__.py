"""Services that run beside producers and consumers, over the engine, one capability per module:
``instances`` (active and standby instances of a consumer service), ``forward`` (the forwarding
service's calls and reply records, without Spark), ``monitor`` (backlog monitoring) and
``backlog_judge`` (its pure OpenTP1 rules)."""
