"""Services the forwarding-service tests run, importable as ``module:function`` by drivers and
Spark's Python workers."""

from __future__ import annotations

from mqspark import ServiceError


def upper(message: dict) -> bytes:
    return message["payload"].upper()


def fails_on_bad(message: dict) -> str:
    if message["payload"] == b"bad":
        raise ServiceError("no stock for item 7", return_code=7)
    return "ok"


def returns_a_number(message: dict) -> int:
    return 42


def upper_all(requests) -> list[bytes]:
    """Vectorised: a pyarrow Table of requests in, one reply per request out."""
    return [payload.upper() for payload in requests["payload"].to_pylist()]


def slow_on_slow(message: dict) -> str:
    if message["payload"] == b"slow":
        import time

        time.sleep(30)
    return "fast"
