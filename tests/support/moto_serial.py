"""moto's S3 server handling one request at a time: ``python moto_serial.py HOST PORT FD``, serving on
the listening socket ``FD`` (bound to HOST:PORT) that the starting process holds and hands down.

moto checks a conditional put (``If-None-Match: *``) and then writes the key as two steps, and its
own server runs each request on a thread of its own: under load, two puts of one log entry could
both pass the check and both win, which S3 never allows. Serialized, the check and the write are
one step, as on S3.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server


def serialized(app: Callable[..., Iterable[bytes]]) -> Callable[..., list[bytes]]:
    """``app`` (a WSGI application) answering one request at a time, its whole body made under the lock."""
    lock = threading.Lock()

    def answer(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        with lock:
            return list(app(environ, start_response))

    return answer


if __name__ == "__main__":
    host, port, fd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    os.environ.setdefault("MOTO_PORT", str(port))
    application = serialized(DomainDispatcherApplication(create_backend_app))
    make_server(host, port, application, threaded=True, request_handler=MotoRequestHandler, fd=fd).serve_forever()
