"""How the ``mqspark`` command prints a result: a string as it is, a dict as ``key: value`` lines,
rows (a list of dicts or an Arrow table) as a table, and anything as JSON with ``--json``."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pyarrow as pa


def render(result: Any, as_json: bool) -> str:
    """The text the command prints for ``result``."""
    if isinstance(result, str) and not as_json:
        return result
    if isinstance(result, pa.Table):
        result = result.to_pylist(maps_as_pydicts="strict")
    if as_json:
        return json.dumps(_jsonable(result), indent=2)
    if isinstance(result, dict):
        lines = []
        for key, value in result.items():
            if isinstance(value, list) and value:
                lines.append(f"{key}:")
                lines += [
                    f"  {' '.join(map(str, item.values())) if isinstance(item, dict) else item}" for item in value
                ]
            else:
                value = _jsonable(value)
                lines.append(f"{key}: {'' if value is None else value}".rstrip())
        return "\n".join(lines)
    return _render_table(result)


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="backslashreplace")
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list):
        return [_jsonable(item) for item in value]
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    return value


def _render_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(none)"
    columns = list(rows[0])
    cells = [[_cell(row[c]) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=False))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=False)).rstrip() for r in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    value = _jsonable(value)
    text = _printable("" if value is None else str(value))
    return text if len(text) <= 40 else text[:37] + "..."


def _printable(text: str) -> str:
    """``text`` with what a terminal would act on escaped (newlines, NUL, escape sequences): values
    are untrusted, and a cell is one line."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else char.encode("unicode_escape").decode("ascii") for char in text)
