"""The project's Markdown documents: their fenced code blocks, found by the heading they sit under,
so that tests run the code users copy exactly as it is written, and their relative links."""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

PROJECT = Path(__file__).resolve().parents[2]
_FENCE = re.compile(r"^```(\w*)\s*$")
_HEADING = re.compile(r"^#+\s+(.*?)\s*$")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
# The user's documents: the README and every page under docs/.
DOCUMENTS = ("README.md", *sorted(str(path.relative_to(PROJECT)) for path in (PROJECT / "docs").rglob("*.md")))


class CodeBlock(NamedTuple):
    """One fenced block: its ``language``, the ``heading`` it sits under, its first ``line``
    (1-based) and its ``code``."""

    language: str
    heading: str
    line: int
    code: str


def code_blocks(document: str) -> list[CodeBlock]:
    """The fenced code blocks of ``document`` (a path relative to the project), in order."""
    blocks, heading, opened, lines = [], "", None, []
    for number, text in enumerate((PROJECT / document).read_text().splitlines(), start=1):
        fence = _FENCE.match(text)
        if opened is None and fence:
            opened, lines = (fence.group(1), number + 1), []
        elif opened is not None and text.rstrip() == "```":
            blocks.append(CodeBlock(opened[0], heading, opened[1], "\n".join(lines) + "\n"))
            opened = None
        elif opened is not None:
            lines.append(text)
        elif match := _HEADING.match(text):
            heading = match.group(1)
    return blocks


def block_under(document: str, heading: str, language: str = "python") -> CodeBlock:
    """The one ``language`` block of ``document`` under ``heading``."""
    found = [block for block in code_blocks(document) if block.heading == heading and block.language == language]
    if len(found) != 1:
        raise LookupError(f"{document}: {len(found)} {language} blocks under heading {heading!r}, expected 1")
    return found[0]


def run_block(block: CodeBlock, document: str, namespace: dict) -> dict:
    """Run ``block`` in ``namespace`` (its globals), compiled under its document and line so that a
    traceback points into the document; returns the namespace."""
    code = compile("\n" * (block.line - 1) + block.code, str(PROJECT / document), "exec")
    exec(code, namespace)
    return namespace


def anchor(heading: str) -> str:
    """The fragment GitHub gives ``heading``: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def headings(document: str) -> list[str]:
    """The headings of ``document`` outside its code blocks, in order."""
    found, fenced = [], False
    for text in (PROJECT / document).read_text().splitlines():
        if _FENCE.match(text) or (fenced and text.rstrip() == "```"):
            fenced = not fenced
        elif not fenced and (match := _HEADING.match(text)):
            found.append(match.group(1))
    return found


def relative_links(document: str) -> list[str]:
    """The targets of ``document``'s Markdown links that are not web addresses."""
    return [target for target in _LINK.findall((PROJECT / document).read_text()) if "://" not in target]
