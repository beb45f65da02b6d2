"""Services that keep queues running beside producers and consumers, one capability per module:
``maintenance`` keeps queues small; ``backout`` deals with failed messages."""
