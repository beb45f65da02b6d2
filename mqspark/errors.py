"""Errors raised by mqspark, each carrying the MQ reason code administrators know."""

from __future__ import annotations

from enum import IntEnum


class Reason(IntEnum):
    """MQ reason codes used by mqspark (spec section 9)."""

    MQRC_BACKED_OUT = 2003
    MQRC_CONNECTION_BROKEN = 2009
    MQRC_GET_INHIBITED = 2016
    MQRC_MSG_TOO_BIG_FOR_Q = 2030
    MQRC_NO_MSG_AVAILABLE = 2033
    MQRC_NOT_AUTHORIZED = 2035
    MQRC_OBJECT_IN_USE = 2042
    MQRC_Q_MGR_NOT_AVAILABLE = 2059
    MQRC_PRIORITY_ERROR = 2050
    MQRC_PUT_INHIBITED = 2051
    MQRC_Q_DELETED = 2052
    MQRC_Q_FULL = 2053
    MQRC_Q_NOT_EMPTY = 2055
    MQRC_UNKNOWN_OBJECT_NAME = 2085
    MQRC_CLUSTER_RESOLUTION_ERROR = 2189
    MQRC_UNEXPECTED_ERROR = 2195
    MQRC_INCOMPLETE_GROUP = 2241
    MQRC_INCOMPLETE_MSG = 2242
    MQRC_MSG_SEQ_NUMBER_ERROR = 2250
    MQRC_OFFSET_ERROR = 2251
    MQRC_GROUP_ID_ERROR = 2258
    MQRC_CLUSTER_PUT_INHIBITED = 2268
    MQRC_Q_DEPTH_HIGH = 2224
    MQRC_Q_DEPTH_LOW = 2225
    MQRC_Q_SERVICE_INTERVAL_HIGH = 2226
    MQRC_Q_SERVICE_INTERVAL_OK = 2227
    MQRC_NO_DESTINATIONS_AVAILABLE = 2270
    MQRC_BACKOUT_THRESHOLD_REACHED = 2362
    MQRC_SEGMENTATION_NOT_ALLOWED = 2443
    MQRC_STANDBY_Q_MGR = 2543
    MQRC_RECONNECT_QMID_MISMATCH = 2545
    MQRC_RECONNECT_INCOMPATIBLE = 2547
    MQRC_RECONNECT_FAILED = 2548
    # Not an MQ reason: a feedback code in MQ's application range (MQFB_APPL_FIRST), for a message
    # whose Tuxedo retries are used up (it moved to the error or dead-letter queue).
    MQFB_RETRIES_EXHAUSTED = 65536


class MQError(Exception):
    """A queue-manager operation failed; ``reason`` holds the MQ reason code when one applies.

    The text reads ``MQRC_Q_FULL (2053): queue ORDERS is full (max_depth 1000)``.
    """

    def __init__(self, message: str, reason: Reason | None = None) -> None:
        self.reason = reason
        self.detail = message
        super().__init__(f"{reason.name} ({reason.value}): {message}" if reason else message)


class MQValidationError(MQError, ValueError):
    """Bad input: a name, attribute, option or message field with a bad value."""
