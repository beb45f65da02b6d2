"""A short view of messages for people: :func:`brief`, for notebooks and ``show()``.

A browse or a streaming get has 31 columns, and ``show()`` prints a binary payload as hex bytes.
The brief view keeps the columns a person reads first and shows the payload as text.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

# The columns a person reads first, in this order, when the DataFrame has them.
BRIEF_COLUMNS = (
    "delivery_seq",
    "queue",
    "priority",
    "msg_id",
    "correl_id",
    "group_id",
    "msg_seq_number",
    "backout_count",
    "put_time",
)
_ESCAPES = (("\\\\", "\\\\\\\\"), ("\n", "\\\\n"), ("\r", "\\\\r"), ("\t", "\\\\t"))


def brief(df: DataFrame) -> DataFrame:
    """``df`` (messages from a browse, a streaming get or a queue table) with the columns a person
    reads first and the payload as one line of text: a UTF-8 payload as text, with backslash,
    newline, carriage return and tab escaped as in Python; any other payload, or one with other
    control characters, as hex (``0x48...``)."""
    columns = [name for name in BRIEF_COLUMNS if name in df.columns]
    return df.select(*columns, _readable(F.col("payload")).alias("payload"))


def _readable(payload: Column) -> Column:
    decoded = payload.cast("string")
    text = decoded
    for raw, escaped in _ESCAPES:
        text = F.regexp_replace(text, raw, escaped)
    printable = F.is_valid_utf8(payload) & ~decoded.rlike("[\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f\\x7f]")
    return F.when(printable, text).otherwise(F.concat(F.lit("0x"), F.hex(payload)))
