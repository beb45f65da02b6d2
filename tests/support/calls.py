"""Recording what a function of the project is called with, the function still doing its work."""

from __future__ import annotations

from typing import Any

import pytest


def record_calls(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, argument: int) -> list:
    """Replace ``owner.name`` for the test by a wrapper that appends its positional ``argument`` of
    each call to the list returned, and then calls the function."""
    calls: list = []
    function = getattr(owner, name)

    def recording(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[argument])
        return function(*args, **kwargs)

    monkeypatch.setattr(owner, name, recording)
    return calls
