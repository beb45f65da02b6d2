"""Storage faults: whether a failure means the store did not answer (a broken connection, spec
section 8) or refused (credentials), and the one-line errors mqspark raises for them.
"""

from __future__ import annotations

import errno
import functools
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from mqspark.errors import MQError, MQValidationError, Reason
from mqspark.store.layout import StorageOptions, catalog_location
from mqspark.store.tables import table_exists

_Method = TypeVar("_Method", bound=Callable[..., Any])


def reachable(root: str, storage_options: StorageOptions) -> bool:
    """Whether the catalog of the queue manager at ``root`` can be read now."""
    try:
        return table_exists(catalog_location(root), storage_options)
    except Exception:  # noqa: BLE001 - any failure to read the catalog means the root cannot be reached
        return False


# What the stores' clients say when the store did not answer, as opposed to answering "no":
# delta-rs's object_store gives up "after N retries" only on what it may retry (no connection,
# a timeout, a 5xx); pyarrow's Azure and S3 clients say they could not connect.
_UNANSWERED = re.compile(
    r"after \d+ retries|error sending request|connection refused|connection reset|timed out"
    r"|could not connect to server|NETWORK_CONNECTION",
    re.IGNORECASE,
)
_UNANSWERED_ERRNOS = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ETIMEDOUT,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ENOTCONN,
        errno.ESTALE,
        errno.EIO,
    }
)


def unanswered(error: BaseException) -> bool:
    """Whether ``error``, or an error it was raised from, is the store not answering a request."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and (
            isinstance(seen, ConnectionError | TimeoutError)
            or seen.errno in _UNANSWERED_ERRNOS
            or _UNANSWERED.search(str(seen))
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def broken(error: BaseException, root: str, storage_options: StorageOptions) -> bool:
    """Whether ``error`` broke the connection to the queue manager at ``root``: its store did not
    answer, or its catalog cannot be read right after. Checking only afterwards would miss a store
    that came back in between, once its client had given up."""
    if isinstance(error, MQValidationError):
        return False
    return unanswered(error) or not reachable(root, storage_options)


# The store's words for credentials it refused (Azure's error codes, HTTP 401/403).
_REFUSED = ("401 Unauthorized", "403 Forbidden", "AuthenticationFailed", "AuthorizationFailure", "Invalid Access Key")


def _words(error: BaseException) -> str:
    """The store's own words for ``error`` on one line (delta-rs's chain of causes, without its markup)."""
    text = re.sub(r"\x1b\[[0-9;]*m|↳", " ", str(error)).split("<?xml")[0]
    code = re.search(r"<Code>(\w+)</Code>", str(error))
    return " ".join(text.split()) + (f" ({code.group(1)})" if code else "")


def store_error(root: str, error: OSError) -> MQError:
    """The error for a queue manager root whose store refused the credentials (2035) or did not
    answer (2059), with the store's own words."""
    detail = _words(error)
    if any(mark in str(error) for mark in _REFUSED):
        return MQError(
            f"queue manager root {root}: the store refused the credentials: {detail}", Reason.MQRC_NOT_AUTHORIZED
        )
    return MQError(f"queue manager root {root}: the store did not answer: {detail}", Reason.MQRC_Q_MGR_NOT_AVAILABLE)


@contextmanager
def answering(root: str, reason: Reason = Reason.MQRC_CONNECTION_BROKEN) -> Iterator[None]:
    """Inside the block, the store of the queue manager at ``root`` not answering (see
    :func:`unanswered`) raises ``reason``, 2009 ``MQRC_CONNECTION_BROKEN`` by default (2059 when
    opening), from the store's error; any other error goes on unchanged."""
    try:
        yield
    except MQError:
        raise
    except Exception as error:
        if not unanswered(error):
            raise
        raise MQError(f"queue manager root {root}: the store did not answer: {_words(error)}", reason) from error


def connected(method: _Method) -> _Method:
    """``method`` of a queue manager, or a function whose first argument is one (anything with its
    ``root``), raising 2009 when the store does not answer (see :func:`answering`)."""

    @functools.wraps(method)
    def call(qm: Any, *args: Any, **kwargs: Any) -> Any:
        with answering(qm.root):
            return method(qm, *args, **kwargs)

    return cast(_Method, call)
