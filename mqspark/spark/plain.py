"""How an MQ error reaches a Spark user: its one line, without the Python frames that led to it.

Spark puts a Python data source's traceback before the error's own line, in the exception it
raises on the driver (``AnalysisException``, ``StreamingQueryException``). An :class:`MQError` says
all in that line (a mistake in the options, the queue's state), so the methods Spark calls raise it
without its frames: the line users need follows Spark's own, not a page of frames. Any other
exception, a fault of mqspark's, keeps its whole traceback.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

from mqspark.errors import MQError

_Method = TypeVar("_Method", bound=Callable[..., Any])


def without_frames(method: _Method) -> _Method:
    """``method``, raising an MQError with no traceback of its own."""

    @functools.wraps(method)
    def raising_plainly(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except MQError as error:
            raise error.with_traceback(None) from None

    return cast(_Method, raising_plainly)
