"""The project's Markdown documents: their fenced code blocks, found by the heading they sit under,
run as users copy them, and their relative links.

A block's marker is an HTML comment on the line right before its fence, which readers of the
rendered page do not see:

- ``<!-- not run: REASON -->``: the block is not run, and the test says why (a reason is required).
  A Python block is still compiled.
- ``<!-- run: id=NAME; after=NAME[,NAME]; setup=NAME[,NAME]; exit=N -->``, every key optional:
  ``id`` names the block; ``after`` runs the named blocks of the same document first, in the same
  namespace (a tour continues where it left off); ``setup`` runs the named :data:`SETUPS` next,
  for what the text around the block takes as given (a queue with messages, a running query);
  ``exit`` is the status a shell block ends with (default 0).

Python blocks run with ``mqspark`` imported and ``spark`` the test session. Shell blocks run with
bash (``-e``: the first failing command ends the block) in a fresh folder, with the ``mqspark``
console script of the running Python first on ``PATH``; a ``console`` block runs its ``$ `` lines.
Paths under ``/data/``, ``/shared/`` and ``/mnt/`` are placeholders: every block, and its setups,
gets them under a fresh temporary folder instead. A query a block started is driven through what is
available and stopped after the block.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

PROJECT = Path(__file__).resolve().parents[2]
_FENCE = re.compile(r"^```(\w*)\s*$")
_HEADING = re.compile(r"^#+\s+(.*?)\s*$")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_MARKER = re.compile(r"^<!--\s*(run|not run):(.*?)-->\s*$")
_PLACEHOLDER = re.compile(r"(?<=[\"'\s=])/(data|shared|mnt)/")
# The user's documents: the README and every page under docs/.
DOCUMENTS = ("README.md", *sorted(str(path.relative_to(PROJECT)) for path in (PROJECT / "docs").rglob("*.md")))
# The fence languages whose blocks run.
PYTHON, SHELL = ("python",), ("bash", "sh", "console")

# What the text around a block takes as given, by the name a marker's ``setup`` uses. Each is Python
# run in the block's namespace, placeholders replaced as in the block.
SETUPS = {
    "qm": 'from mqspark import QueueManager\nqm = QueueManager.create("/data/qm1", "QM1")\nroot = "/data/qm1"\n',
    "orders": 'qm.define_queue("ORDERS")\nqm.put("ORDERS", [{"payload": f"order {n}"} for n in range(1, 11)])\n',
    "orders-df": 'df = spark.createDataFrame([("order 11",), ("order 12",)], ["payload"])\n',
    "incoming-files": (
        'import os\nos.makedirs("/data/incoming")\n'
        'with open("/data/incoming/orders-1.txt", "w") as file:\n    file.write("order 13\\norder 14\\n")\n'
    ),
    "billing-query": (
        'query = (spark.readStream.format("mq").option("queue", "ORDERS").option("consumer", "billing")\n'
        '         .load(root).writeStream.format("noop").start())\n'
    ),
    "delta-paths": 'out, ck = "/data/billed", "/data/checkpoints/billing"\n',
    "handle": "def handle(messages):\n    print(messages)\n",
    "quotes": (
        'for name in ("QUOTES", "ANSWERS", "NO.PRICE"):\n    qm.define_queue(name)\nPRICES = {b"apple": "1.20"}\n'
    ),
    "backed-out": (
        'qm.define_queue("ORDERS.BACKOUT")\n'
        'qm.define_queue("ORDERS", backout_threshold=1, backout_queue="ORDERS.BACKOUT")\n'
        'qm.put("ORDERS", [{"payload": "order 1", "correl_id": "c-17"}])\n'
        'qm.claim("ORDERS", max_messages=1).backout("order could not be parsed")\n'
    ),
    "two-qmgrs": (
        "from mqspark import QueueManager\n"
        'for path in ("/mnt/a/qm", "/mnt/b/qm"):\n    QueueManager.create(path, "QM1").define_queue("ORDERS")\n'
    ),
}


class CodeBlock(NamedTuple):
    """One fenced block: its ``language``, the ``heading`` it sits under, its first ``line``
    (1-based), its ``code``, and the text of its marker (``run: ...``, ``not run: ...``) if it has one."""

    language: str
    heading: str
    line: int
    code: str
    marker: str | None = None


class Plan(NamedTuple):
    """What a ``run`` marker asks for; see the module's docstring."""

    id: str | None = None
    after: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    exit: int = 0


def code_blocks(document: str) -> list[CodeBlock]:
    """The fenced code blocks of ``document`` (a path relative to the project), in order."""
    blocks, heading, opened, lines, previous = [], "", None, [], ""
    for number, text in enumerate((PROJECT / document).read_text().splitlines(), start=1):
        fence = _FENCE.match(text)
        if opened is None and fence:
            marker = _MARKER.match(previous)
            opened, lines = (fence.group(1), number + 1, marker and f"{marker[1]}:{marker[2]}"), []
        elif opened is not None and text.rstrip() == "```":
            blocks.append(CodeBlock(opened[0], heading, opened[1], "\n".join(lines) + "\n", opened[2]))
            opened = None
        elif opened is not None:
            lines.append(text)
        elif match := _HEADING.match(text):
            heading = match.group(1)
        previous = text
    return blocks


def block_under(document: str, heading: str, language: str = "python") -> CodeBlock:
    """The one ``language`` block of ``document`` under ``heading``."""
    found = [block for block in code_blocks(document) if block.heading == heading and block.language == language]
    if len(found) != 1:
        raise LookupError(f"{document}: {len(found)} {language} blocks under heading {heading!r}, expected 1")
    return found[0]


def runnable_blocks(documents: tuple[str, ...] = DOCUMENTS) -> list[tuple[str, CodeBlock]]:
    """Every Python and shell block of ``documents``, with its document."""
    return [
        (document, block)
        for document in documents
        for block in code_blocks(document)
        if block.language in PYTHON + SHELL
    ]


def plan(block: CodeBlock) -> Plan | str:
    """The block's :class:`Plan`, or the reason it is not run; a bad marker raises ``ValueError``."""
    if block.marker is None:
        return Plan()
    kind, _, text = block.marker.partition(":")
    if kind == "not run":
        if not text.strip():
            raise ValueError(f"line {block.line}: a 'not run' marker must say why")
        return text.strip()
    fields: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        key, equals, value = (part.strip() for part in item.partition("="))
        if not equals or key not in Plan._fields:
            raise ValueError(f"line {block.line}: bad marker item {item!r}")
        names = tuple(name.strip() for name in value.split(","))
        fields[key] = int(value) if key == "exit" else value if key == "id" else names
    unknown = [name for name in fields.get("setup", ()) if name not in SETUPS]
    if unknown:
        raise ValueError(f"line {block.line}: unknown setup {unknown}; known: {sorted(SETUPS)}")
    return Plan(**fields)


def placed(code: str, folder: Path) -> str:
    """``code`` with its placeholder paths moved under ``folder``."""
    return _PLACEHOLDER.sub(lambda match: f"{folder}/{match[1]}/", code)


def run_block(block: CodeBlock, document: str, namespace: dict, folder: Path | None = None) -> dict:
    """Run Python ``block`` in ``namespace`` (its globals), compiled under its document and line so
    that a traceback points into the document, with placeholder paths under ``folder`` when given;
    returns the namespace."""
    source = placed(block.code, folder) if folder else block.code
    exec(compile("\n" * (block.line - 1) + source, str(PROJECT / document), "exec"), namespace)
    return namespace


def run_in_document(document: str, block: CodeBlock, folder: Path, spark: Any = None) -> None:
    """Run ``block`` of ``document`` as its marker says, with placeholder paths under ``folder``:
    the blocks it comes after, its setups, then the block; queries they started are driven through
    what is available, then stopped. Raises when the block fails or a shell block ends with another
    status than the marker's."""
    import mqspark

    steps = _chain(document, block)
    namespace: dict[str, Any] = {"spark": spark, "mqspark": mqspark}
    # A block's mqspark.session() hands the shipped settings to the shared session: put them back.
    settings = dict(spark.conf.getAll) if spark is not None else {}
    try:
        for step in steps[:-1]:
            run_block(step, document, namespace, folder)
            _settle_queries(spark)
        for name in plan_of(block).setup:
            exec(compile(placed(SETUPS[name], folder), f"<setup {name}>", "exec"), namespace)
        if block.language in PYTHON:
            run_block(block, document, namespace, folder)
        else:
            _run_shell(block, folder)
    finally:
        try:
            _settle_queries(spark)
        finally:
            _restore(spark, settings)


def plan_of(block: CodeBlock) -> Plan:
    """The block's :class:`Plan`; a block that is not run has none."""
    found = plan(block)
    if isinstance(found, str):
        raise ValueError(f"line {block.line} is not run: {found}")
    return found


def _chain(document: str, block: CodeBlock) -> list[CodeBlock]:
    """The blocks ``block`` comes after, each once and before the blocks that name it, then ``block``."""
    plans = [(candidate, plan(candidate)) for candidate in code_blocks(document)]
    named = {found.id: candidate for candidate, found in plans if isinstance(found, Plan) and found.id}
    chain: list[CodeBlock] = []

    def add(current: CodeBlock) -> None:
        for name in plan_of(current).after:
            if name not in named:
                raise ValueError(f"{document}:{current.line}: no block has id {name!r}")
            if named[name] not in chain:
                add(named[name])
        chain.append(current)

    add(block)
    return chain


def _run_shell(block: CodeBlock, folder: Path) -> None:
    code = placed(block.code, folder)
    if block.language == "console":
        code = "".join(line[2:] + "\n" for line in code.splitlines() if line.startswith("$ "))
    scripts = str(Path(sys.executable).parent)  # where pip put the mqspark console script
    env = {**os.environ, "PATH": f"{scripts}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("MQSPARK_ROOT", None)
    work = folder / "cwd"
    work.mkdir(exist_ok=True)
    done = subprocess.run(["bash", "-e", "-c", code], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    expected = plan_of(block).exit
    if done.returncode != expected:
        raise AssertionError(
            f"line {block.line}: exit {done.returncode}, expected {expected}\n"
            f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        )


def _settle_queries(spark: Any) -> None:
    """Drive every running query through what is available, then stop it; the first failure raises."""
    if spark is None:
        return
    failure = None
    for query in spark.streams.active:
        try:
            query.processAllAvailable()
        except Exception as error:  # the query's own failure, reported once every query is stopped
            failure = failure or error
        finally:
            query.stop()
    if failure is not None:
        raise failure


def _restore(spark: Any, settings: dict[str, str]) -> None:
    if spark is None:
        return
    for key, value in dict(spark.conf.getAll).items():
        if key not in settings:
            spark.conf.unset(key)
        elif value != settings[key] and spark.conf.isModifiable(key):
            spark.conf.set(key, settings[key])


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
