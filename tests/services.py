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
