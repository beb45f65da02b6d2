"""The operator console and the messaging REST API (``mqspark console``): one process serving web
pages and JSON over the same code paths as the CLI, reading only the queue managers' own tables.

- :mod:`mqspark.console.managers`: the queue managers served, opened per thread;
- :mod:`mqspark.console.answers`: what the clients poll, computed from the queue managers' tables;
- :mod:`mqspark.console.reader`: the process those answers are computed in, at the lowest priority;
- :mod:`mqspark.console.reads`: what the pages and the API show, cached for the clients that poll;
- :mod:`mqspark.console.api`: the REST API under ``/api/v1``;
- :mod:`mqspark.console.pages`: the server-rendered pages;
- :mod:`mqspark.console.security`: the admin token, the session cookie and CSRF;
- :mod:`mqspark.console.app`: the application and its server.
"""
