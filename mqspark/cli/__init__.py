"""The ``mqspark`` command line: queue managers, queues, messages, clusters, monitoring and services,
printed as tables or JSON.

The package owns the command's parsing, its commands and their output; nothing else in mqspark but
the demo imports it. :mod:`mqspark.cli.main` runs a command (``main``, and ``entry``, the console
script); :mod:`mqspark.cli.parser` builds the parser and holds the argument types the commands share;
each command group has its module (:mod:`~mqspark.cli.queues`, :mod:`~mqspark.cli.messages`,
:mod:`~mqspark.cli.monitor`, :mod:`~mqspark.cli.cluster`, :mod:`~mqspark.cli.services`), adding its
commands with the function each runs; :mod:`mqspark.cli.render` prints their results.
"""
