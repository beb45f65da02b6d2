"""Jobs to run with ``spark-submit``: ``spark-submit "$(mqspark job forward)" ARGS``."""
